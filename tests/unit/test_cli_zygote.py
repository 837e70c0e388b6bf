"""The test harness's zygote (tests/cli_zygote.py): a command run in a forked child answers as its own fresh
process would (exit status, stdout, stderr, stdin, environment, time limit), and run_rlcli sends it there only
when that holds."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests import conftest
from tests.cli_zygote import Zygote, forkable
from tests.conftest import REPO, RLCLI

TRACES = REPO / "rlcli" / "data" / "demo" / "demo-traces.openai.jsonl"


def test_only_variables_read_while_a_command_runs_may_differ():
    base = {"PATH": "/bin", "HF_HUB_OFFLINE": "1", "RLCLI_HOME": "/a"}
    assert forkable(dict(base), base)
    assert forkable(dict(base, RLCLI_HOME="/b", RLCLI_BASE_URL="http://x", TINKER_API_KEY="k"), base)
    assert forkable(dict(base, DOCKER_HOST="unix:///tmp/d.sock"), base)  # read when harbor talks to Docker
    assert not forkable(dict(base, HF_HUB_OFFLINE="0"), base)  # transformers reads it at import
    assert not forkable(dict(base, TRANSFORMERS_OFFLINE="0"), base)  # read at import too
    assert not forkable({k: v for k, v in base.items() if k != "PATH"}, base)
    assert not forkable(dict(base, TINKER_LOG="debug"), base)


@pytest.fixture(scope="module")
def zygote():
    z = Zygote(str(REPO))
    yield z
    z.close()


def fresh(args: list[str], env: dict, input: str | None = None, cwd=REPO) -> subprocess.CompletedProcess:
    return subprocess.run([*RLCLI, *args], capture_output=True, text=True, env=env, input=input, cwd=cwd,
                          timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize("args, input", [
    (["train", "sl", "--dataset", "/nonexistent.jsonl", "--model", "m"], None),  # bad input: one line, exit 2
    (["import", "-", "-f", "openai"], TRACES.read_text()),  # stdin in, records out, a summary on stderr
    (["--version"], None),
    (["eval", "--help"], None),
])
def test_a_child_answers_as_a_fresh_process(zygote, tmp_path, args, input):
    env = dict(os.environ, RLCLI_HOME=str(tmp_path / "home"))
    child = zygote.run([*RLCLI, *args], env, str(REPO), input, 300)
    alone = fresh(args, env, input)
    assert (child.returncode, child.stdout, child.stderr) == (alone.returncode, alone.stdout, alone.stderr)
    assert child.args == [*RLCLI, *args]


@pytest.mark.slow
def test_a_child_takes_the_environment_and_folder_it_is_given(zygote, tmp_path):
    # `import` writes where -o says, relative to the working folder, and reads RLCLI_* settings when it runs.
    env = dict(os.environ, RLCLI_HOME=str(tmp_path / "home"))
    proc = zygote.run([*RLCLI, "import", str(TRACES), "-f", "openai", "-o", "out.jsonl"], env, str(tmp_path),
                      None, 300)
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert rows and all("messages" in r for r in rows)
    assert not (REPO / "out.jsonl").exists()


@pytest.mark.slow
def test_a_child_past_its_time_limit_is_killed(zygote, tmp_path):
    """subprocess.run's contract: the child is killed and TimeoutExpired carries what it printed."""
    read, write = os.pipe()  # the child's stdin: held open, so `--dataset -` waits for ever
    saved = os.dup(0)
    os.dup2(read, 0)
    try:
        start = time.monotonic()
        with pytest.raises(subprocess.TimeoutExpired) as info:
            zygote.run([*RLCLI, "train", "sl", "--dataset", "-", "--model", "m"], dict(os.environ), str(REPO),
                       None, 3)
        assert time.monotonic() - start < 30
    finally:
        os.dup2(saved, 0)
        for fd in (saved, read, write):
            os.close(fd)
    assert info.value.timeout == 3
    # The zygote is still there for the next command.
    assert zygote.alive()
    again = zygote.run([*RLCLI, "--version"], dict(os.environ), str(REPO), None, 60)
    assert again.returncode == 0 and again.stdout.startswith("rlcli")


@pytest.fixture
def stdin_held_open():
    """This process's stdin replaced by a pipe nobody writes to, so a child's `--dataset -` waits for ever."""
    read, write = os.pipe()
    saved = os.dup(0)
    os.dup2(read, 0)
    yield
    os.dup2(saved, 0)
    for fd in (saved, read, write):
        os.close(fd)


WAITS = [*RLCLI, "train", "sl", "--dataset", "-", "--model", "m"]


@pytest.mark.slow
def test_a_background_child_takes_ctrl_c_in_its_own_session(zygote, stdin_held_open):
    """popen's contract, as subprocess.Popen's with start_new_session and SIGINT at its default (ctrl_c_works)."""
    proc = zygote.popen(WAITS, dict(os.environ), str(REPO), subprocess.PIPE, subprocess.PIPE, new_session=True,
                        sigint_default=True)
    try:
        assert proc.poll() is None and proc.returncode is None
        assert os.getsid(proc.pid) == proc.pid != os.getsid(0)
        with pytest.raises(subprocess.TimeoutExpired):
            proc.communicate(timeout=3)  # still reading its stdin
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)  # goes on where the timed-out call stopped
    finally:
        proc.kill()
    assert proc.returncode == 130 and proc.poll() == 130, err
    assert err.strip().splitlines()[-1] == "rlcli: interrupted" and out == "" and "Traceback" not in err
    assert proc.stdout.closed and proc.args == WAITS


@pytest.mark.slow
def test_a_killed_background_child_reports_the_signal(zygote, stdin_held_open):
    proc = zygote.popen(WAITS, dict(os.environ), str(REPO), subprocess.DEVNULL, subprocess.PIPE)
    assert proc.stdout is None and os.getsid(proc.pid) == os.getsid(0)  # the zygote's session: the test's
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=1)
    os.kill(proc.pid, signal.SIGKILL)  # as the fault tests kill a trainer: by pid
    assert proc.wait(timeout=30) == -signal.SIGKILL
    assert proc.communicate(timeout=10) == (None, "")
    proc.kill()  # reaped: a no-op, not a signal to whatever process has that pid now


@pytest.mark.slow
def test_a_background_child_writes_both_outputs_into_a_file_it_is_given(zygote, tmp_path):
    """Popen(stdout=a file's descriptor, stderr=STDOUT), as the soak's jobs log: one file, as a fresh process's."""
    args, env = [*RLCLI, "import", str(TRACES), "-f", "openai"], dict(os.environ, RLCLI_HOME=str(tmp_path / "home"))
    logs = {}
    for name in ("child", "fresh"):
        with open(tmp_path / f"{name}.log", "w") as log:
            if name == "child":
                proc = zygote.popen(args, env, str(REPO), log.fileno(), subprocess.STDOUT)
            else:
                proc = subprocess.Popen(args, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
            assert proc.wait(300) == 0
        logs[name] = (tmp_path / f"{name}.log").read_text()
    assert proc.stdout is None and logs["child"] == logs["fresh"]
    assert '"messages"' in logs["child"] and "import: read " in logs["child"], logs["child"][-500:]  # both outputs


@pytest.mark.slow
def test_run_rlcli_forks_only_training_commands_with_a_matching_environment(monkeypatch):
    monkeypatch.delenv("RLCLI_TEST_FRESH_PROCESSES", raising=False)
    conftest._zygote_for(("train", "sl"), dict(os.environ))  # starts this worker's zygote if none runs yet
    assert conftest._zygote[0] is not None and conftest._zygote[0].alive()
    # Its own environment with a test's settings (earlier in-process tests may have changed this process's)
    env = dict(conftest._zygote[0].env, RLCLI_HOME="/elsewhere", PYTEST_CURRENT_TEST="another", TMPDIR="/tmp")
    assert conftest._zygote_for(("train", "sl"), env) is conftest._zygote[0]
    assert conftest._zygote_for(("serve", "status"), env) is None  # a light command: a fresh process is quicker
    assert conftest._zygote_for(("train", "sl"), dict(env, HF_HUB_OFFLINE="0")) is None
    monkeypatch.setenv("RLCLI_TEST_FRESH_PROCESSES", "1")
    assert conftest._zygote_for(("train", "sl"), env) is None


def test_the_zygote_module_imports_nothing_heavy():
    """The test process imports tests.cli_zygote for the class; the preload runs only in the zygote."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import tests.cli_zygote; "
            "print([m for m in ('torch', 'tinker', 'transformers', 'datasets') if m in sys.modules])")
    proc = subprocess.run([sys.executable, "-c", code, str(REPO)], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "[]", proc.stderr


@pytest.mark.slow
def test_no_preloaded_module_reads_docker_host_at_import():
    """DOCKER_HOST may differ from the zygote's (CALL_TIME_VARS) while no preloaded module is a Docker client."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from tests import cli_zygote; cli_zygote.preload(); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'docker' or m.startswith('rlcli.harbor')))")
    proc = subprocess.run([sys.executable, "-c", code, str(REPO)], capture_output=True, text=True, timeout=300)
    assert proc.stdout.strip() == "[]", proc.stdout + proc.stderr


@pytest.mark.slow
def test_a_notebook_kernel_sends_rlcli_lab_commands_to_the_zygote(zygote, tmp_path, monkeypatch):
    """tests/notebook_kernel.py in a process like the papermill kernel: rlcli.lab's heavy commands run in the
    zygote (an attached handle, which never stops it), anything else, or a differing environment, runs fresh."""
    from rlcli import lab
    from tests import notebook_kernel

    kernel_env = notebook_kernel.kernel_startup(tmp_path / "kernel", zygote)
    startup = next((tmp_path / "kernel").rglob("startup/*.py"))
    assert (tmp_path / "kernel").stat().st_mode & 0o077 == 0 and "install()" in startup.read_text()
    monkeypatch.setattr(lab, "subprocess", subprocess)  # install() replaces it; the monkeypatch puts it back
    for name, value in {**kernel_env, "MPLBACKEND": "module://matplotlib_inline.backend_inline"}.items():
        monkeypatch.setenv(name, value)
    log = tmp_path / "zygote.log"
    monkeypatch.setenv("RLCLI_TEST_ZYGOTE_LOG", str(log))
    notebook_kernel.install()
    assert isinstance(lab.subprocess, notebook_kernel._Subprocess)
    out = lab.rlcli("eval", "--help")  # heavy: forked, and answers as a fresh `rlcli eval --help`
    assert out == fresh(["eval", "--help"], dict(os.environ)).stdout
    lab.rlcli("--version")  # light: fresh
    monkeypatch.setenv("HF_HUB_OFFLINE", "0" if os.environ.get("HF_HUB_OFFLINE") == "1" else "1")
    lab.rlcli("eval", "--help")  # an environment the zygote's imports read differently: fresh
    lines = [line.split(" kernel ", 1)[1] for line in log.read_text().splitlines()]
    assert lines == ["-m rlcli.cli eval --help: fork", "-m rlcli.cli --version: fresh ",
                     "-m rlcli.cli eval --help: fresh HF_HUB_OFFLINE"], lines
    attached = lab.subprocess._zygote
    attached.close()  # the handle's close leaves the zygote to its owner
    assert attached.alive() and zygote.alive()
