"""Fast tests of `rlcli serve`'s pieces: no server, no venv build."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlcli import config
from rlcli.errors import UsageError
from rlcli.server import backend_config as hw
from rlcli.server import commands, process, server_venv

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("RLCLI_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TINKER_BASE_URL", raising=False)
    return tmp_path / "home"


def rlcli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlcli.cli", *args], capture_output=True, text=True,
                          env=env, timeout=120, cwd=REPO)


# --- flag-to-config mapping ----------------------------------------------------------------


def test_jax_mapping_uses_jax_keys():
    assert hw.map_hardware("jax", None, 1, 1) == {}
    assert hw.map_hardware("jax", 4, 1, 2) == {"tensor_parallel_size": 2, "fully_sharded_data_parallel_size": 2}


def test_fsdp_mapping_places_policy_and_inference():
    cfg = hw.map_hardware("fsdp", 8, 2, 2)
    assert cfg["trainer.placement.policy_num_gpus_per_node"] == 8
    assert cfg["trainer.placement.policy_num_nodes"] == 2
    assert cfg["generator.inference_engine.tensor_parallel_size"] == 2
    assert cfg["generator.inference_engine.num_engines"] == 8
    assert "trainer.policy.megatron_config.tensor_model_parallel_size" not in cfg


def test_megatron_mapping_sets_model_parallel():
    cfg = hw.map_hardware("megatron", 8, 1, 4)
    assert cfg["trainer.policy.megatron_config.tensor_model_parallel_size"] == 4
    assert cfg["generator.inference_engine.num_engines"] == 2


@pytest.mark.parametrize("args", [("jax", 3, 1, 2), ("jax", 1, 2, 1)])  # out of range: StartOptions (test_scaling)
def test_bad_hardware_flags_are_usage_errors(args):
    with pytest.raises(UsageError):
        hw.map_hardware(*args)


def test_slots_size_the_jax_lora_table_with_slot_0_reserved():
    cfg: dict = {}
    assert hw.slot_config("jax", None, cfg) == hw.DEFAULT_SLOTS and cfg == {"max_lora_adapters": hw.DEFAULT_SLOTS + 1}
    cfg = {}
    assert hw.slot_config("jax", 12, cfg) == 12 and cfg == {"max_lora_adapters": 13}
    cfg = {"max_lora_adapters": 32}  # --backend-config wins, and status reports what it gives
    assert hw.slot_config("jax", None, cfg) == 31 and cfg == {"max_lora_adapters": 32}
    assert hw.slot_config("jax", 31, cfg) == 31


@pytest.mark.parametrize(("backend", "slots", "cfg", "message"), [
    ("jax", 4, {"max_lora_adapters": 8}, "disagree"),
    ("fsdp", 4, {}, "has none"),
])
def test_bad_slots_are_usage_errors(backend, slots, cfg, message):
    with pytest.raises(UsageError, match=message):
        hw.slot_config(backend, slots, cfg)


def test_non_jax_backends_get_no_lora_table():
    cfg: dict = {}
    assert hw.slot_config("fsdp", None, cfg) is None and cfg == {}


def test_compilation_cache_is_a_private_folder_under_rlcli_home(home, monkeypatch):
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    env = commands.compilation_cache_env()
    folder = Path(env["JAX_COMPILATION_CACHE_DIR"])
    assert folder == home / "cache" / "jax" and folder.is_dir() and oct(folder.stat().st_mode & 0o777) == "0o700"
    # Every program is kept: jax's default skips those that compile in under a second.
    assert env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] == "0"


def test_a_cpu_jax_engine_keeps_its_scratch_memory_and_the_users_tunables_win(monkeypatch):
    ours = ":".join(commands.CPU_ENGINE_TUNABLES)
    for name in ("GLIBC_TUNABLES", "JAX_PLATFORMS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(hw, "has_cuda", lambda: False)
    assert commands.malloc_env("jax") == {"GLIBC_TUNABLES": ours}
    assert "glibc.malloc.arena_max=1" in ours and "glibc.malloc.mmap_max=0" in ours
    assert commands.malloc_env("fsdp") == {} and commands.malloc_env("megatron") == {}
    # the user's tunables come first, and a name they set is theirs
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2:glibc.malloc.tcache_count=0")
    env = commands.malloc_env("jax")["GLIBC_TUNABLES"].split(":")
    assert env[:2] == ["glibc.malloc.arena_max=2", "glibc.malloc.tcache_count=0"]
    assert [t for t in env if t.startswith("glibc.malloc.arena_max=")] == ["glibc.malloc.arena_max=2"]
    assert set(env[2:]) == set(commands.CPU_ENGINE_TUNABLES) - {"glibc.malloc.arena_max=1"}
    monkeypatch.setenv("GLIBC_TUNABLES", ours.replace("=1", "=0"))
    assert commands.malloc_env("jax") == {}  # every name already set: nothing to add
    monkeypatch.delenv("GLIBC_TUNABLES")
    # jax may compute on a GPU here: its scratch is on the device, glibc is left as it is
    monkeypatch.setattr(hw, "has_cuda", lambda: True)
    assert commands.malloc_env("jax") == {}
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    assert commands.malloc_env("jax") == {"GLIBC_TUNABLES": ours}


def test_backend_config_json_parsing():
    assert hw.parse_backend_config('{"max_lora_adapters": 4}') == {"max_lora_adapters": 4}
    assert hw.parse_backend_config(None) == {}
    for bad in ("{nope", "[1, 2]"):
        with pytest.raises(UsageError, match="--backend-config"):
            hw.parse_backend_config(bad)


def test_api_args_replace_every_dangerous_default(tmp_path):
    args = commands.skyrl_api_args(base_model="m", backend="jax", host="127.0.0.1", port=9, backend_cfg={"a": 1},
                                   state_dir=tmp_path, checkpoints_base=None)
    flags = dict(zip(args[::2], args[1::2], strict=True))
    assert flags["--backend"] == "jax" and flags["--host"] == "127.0.0.1"
    assert flags["--database-url"] == f"sqlite:///{tmp_path / 'tinker.db'}"
    assert flags["--checkpoints-base"] == str(tmp_path / "checkpoints")
    assert flags["--external-inference-lora-base"] == str(tmp_path / "lora")
    assert json.loads(flags["--backend-config"]) == {"a": 1}


# --- state file, lock, port, PID reuse -----------------------------------------------------


def _state(pid: int, port: int = 1234, **kw) -> process.ServerState:
    return process.ServerState(pid=pid, pgid=kw.pop("pgid", pid), start_ticks=kw.pop("ticks", 0), host="127.0.0.1",
                               port=port, base_model="m", backend="jax", started_at=time.time(), **kw)


def test_state_file_round_trip(tmp_path):
    state = _state(os.getpid(), settings={"port": 1234})
    process.write_state(tmp_path, state)
    assert process.read_state(tmp_path) == state
    assert process.read_state(tmp_path / "missing") is None
    (tmp_path / "state.json").write_text("{not json")
    assert process.read_state(tmp_path) is None


def test_lock_keeps_a_second_server_off_the_state_folder(tmp_path):
    fd = process.acquire_lock(tmp_path)
    try:
        with pytest.raises(UsageError, match="already uses the state folder"):
            process.acquire_lock(tmp_path)
    finally:
        os.close(fd)
    os.close(process.acquire_lock(tmp_path))  # free again once the holder is gone


def test_occupied_port_is_reported():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(UsageError, match=f"port {port} .* in use"):
            process.check_port_free("127.0.0.1", port)


def test_live_members_sees_a_real_group_and_ignores_a_reused_pid():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        ticks = process.proc_start_ticks(proc.pid)
        assert process.live_members(_state(proc.pid, ticks=ticks)) == [proc.pid]
        # Same PID, different start time: that PID was reused by someone else, not our server.
        assert process.live_members(_state(proc.pid, ticks=ticks + 1)) == []
        process.stop_group(_state(proc.pid, ticks=ticks), grace_s=5)
        proc.wait(timeout=5)
        assert process.live_members(_state(proc.pid, ticks=ticks)) == []
    finally:
        proc.kill()


def test_stop_group_escalates_to_sigkill_for_a_process_that_ignores_sigterm():
    code = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('ready', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    state = _state(proc.pid, ticks=process.proc_start_ticks(proc.pid))
    t0 = time.monotonic()
    assert process.stop_group(state, grace_s=1) == [proc.pid]
    assert proc.wait(timeout=5) == -9
    assert time.monotonic() - t0 < 10


# --- URL precedence and API key --------------------------------------------------------------


def test_base_url_precedence(home, monkeypatch):
    assert config.resolve_base_url() == "http://127.0.0.1:8000"  # nothing known: the default port
    state_dir = config.server_state_dir()
    state_dir.mkdir(parents=True)
    process.write_state(state_dir, _state(1, port=8555))
    assert config.resolve_base_url() == "http://127.0.0.1:8555"  # the managed server
    monkeypatch.setenv("TINKER_BASE_URL", "http://env:1/")
    assert config.resolve_base_url() == "http://env:1"  # the environment beats the managed server
    assert config.resolve_base_url("http://flag:2") == "http://flag:2"  # the flag beats everything


def test_api_key_placeholder(monkeypatch):
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    assert config.ensure_api_key().startswith("tml-")
    monkeypatch.setenv("TINKER_API_KEY", "tml-mine")
    assert config.ensure_api_key() == "tml-mine"


# --- Python 3.12 discovery -------------------------------------------------------------------


def test_no_python312_is_one_clear_error(monkeypatch):
    monkeypatch.delenv("RLCLI_PYTHON", raising=False)
    monkeypatch.setattr(server_venv, "_candidate_pythons", lambda: [sys.executable])
    if sys.version_info[:2] == (3, 12):
        pytest.skip("the test interpreter is itself 3.12")
    with pytest.raises(UsageError, match="no Python 3.12 found.*--python"):
        server_venv.find_python()


def test_wrong_python_is_rejected():
    with pytest.raises(UsageError, match="not a working Python 3.12"):
        server_venv.find_python("/bin/false")


def test_pins_are_read_from_env_files():
    pins = server_venv.pinned_versions("jax")
    assert pins["skyrl"] == "0.4.0" and pins["tinker"].startswith("0.25")


# --- the command line: one line, non-zero exit, no traceback --------------------------------


def _cli_env(home: Path) -> dict:
    env = dict(os.environ, RLCLI_HOME=str(home), RLCLI_SERVER_VENV=str(home / "no-venv"))
    env.pop("RLCLI_DEBUG", None)
    return env


@pytest.mark.parametrize(
    "args, message",
    [
        (["--backend", "tpu"], "invalid choice: 'tpu' (choose from 'jax', 'fsdp', 'megatron')"),  # argparse's
        (["--backend-config", "{oops"], "--backend-config is not valid JSON"),
        (["--base-model", "./no/such/model"], "no model folder there"),
        (["--python", "/bin/false", "--base-model", str(REPO)], None),  # REPO has no config.json
    ],
)
def test_bad_start_input_is_one_line(tmp_path, args, message):
    proc = rlcli("serve", "start", "--port", "1", *args, env=_cli_env(tmp_path))
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(("rlcli: error:", "rlcli serve start: error:")), proc.stderr
    if message:
        assert message in lines[0]


def test_fsdp_without_cuda_fails_before_installing(tmp_path):
    if hw.has_cuda():
        pytest.skip("this machine has CUDA")
    proc = rlcli("serve", "start", "--backend", "fsdp", "--gpus", "8", env=_cli_env(tmp_path))
    assert proc.returncode == 2
    assert "needs NVIDIA GPUs with CUDA" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "no-venv").exists()  # nothing was installed


def test_no_python312_from_the_cli(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    proc = rlcli("serve", "start", "--base-model", str(model), "--port", str(_free_port()),
                 "--python", sys.executable, env=_cli_env(tmp_path))
    if sys.version_info[:2] == (3, 12):
        pytest.skip("the test interpreter is itself 3.12")
    assert proc.returncode == 2 and "not a working Python 3.12" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_occupied_port_from_the_cli(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        proc = rlcli("serve", "start", "--port", str(s.getsockname()[1]), env=_cli_env(tmp_path))
    assert proc.returncode == 2 and "already in use" in proc.stderr and "Traceback" not in proc.stderr


def test_status_and_stop_without_a_server(tmp_path):
    proc = rlcli("serve", "status", env=_cli_env(tmp_path))
    assert proc.returncode == 3 and proc.stdout.startswith("absent")
    assert rlcli("serve", "stop", env=_cli_env(tmp_path)).returncode == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_help_is_fast_and_imports_nothing_heavy():
    code = ("import sys, time; t=time.perf_counter(); from rlcli.cli import main\n"
            "for argv in (['--help'], ['serve', 'start', '--help'], ['serve', '--help']):\n"
            "    try: main(argv)\n"
            "    except SystemExit: pass\n"
            "heavy = [m for m in ('torch', 'tinker', 'transformers', 'jax', 'tinker_cookbook') if m in sys.modules]\n"
            "print('HEAVY', heavy)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert "HEAVY []" in proc.stdout, proc.stdout + proc.stderr


def test_every_command_has_help(capsys):
    from rlcli.cli import COMMANDS, main

    def leaves(tree, prefix=()):
        for name, (_, node) in tree.items():
            if isinstance(node, dict):
                yield from leaves(node, (*prefix, name))
            else:
                yield (*prefix, name)

    # In-process (a subprocess each cost ~5 s here); the console entry point itself runs in other tests.
    for path in leaves(COMMANDS):
        with pytest.raises(SystemExit) as exit_:
            main([*path, "--help"])
        out = capsys.readouterr()
        assert exit_.value.code == 0 and "usage: rlcli" in out.out, (path, out.err)


def test_server_venv_installs_its_lock_with_uv_hash_checked(tmp_path, monkeypatch):
    lock = server_venv.pins_file("jax")
    cmd = server_venv._install_command(tmp_path, lock)
    assert Path(cmd[0]).name == "uv" and Path(cmd[0]).exists() and cmd[1:3] == ["pip", "install"]
    assert cmd[cmd.index("--python") + 1] == str(tmp_path / "bin" / "python")
    assert {"--require-hashes", "--no-deps"} <= set(cmd) and cmd[-2:] == ["-r", str(lock)]
    monkeypatch.setenv("RLCLI_INSTALLER", "pip")
    cmd = server_venv._install_command(tmp_path, lock)
    assert cmd[:4] == [str(tmp_path / "bin" / "python"), "-m", "pip", "install"] and "--require-hashes" in cmd
    # An input file (fsdp, megatron: no lock can be made from PyPI) is resolved, so neither flag applies.
    cmd = server_venv._install_command(tmp_path, server_venv.pins_file("fsdp"))
    assert "--require-hashes" not in cmd and "--no-deps" not in cmd
