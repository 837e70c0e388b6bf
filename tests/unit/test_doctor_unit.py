"""`rlcli doctor`: each check's verdicts and fixes, the exit code, and that it stays light. No server."""

from __future__ import annotations

import subprocess
import sys
import types

import pytest

from rlcli import doctor
from rlcli.doctor import GB, Check, Server


def test_tinker_pins():
    """The server venv keeps tinker 0.25 for SkyRL's types; any client SDK the server answers is fine."""
    assert doctor.compare_pins("0.25.0", "0.25.0")[0] == "ok"
    status, detail = doctor.compare_pins("0.38.0", "0.25.0")
    assert status == "ok" and "0.38.0" in detail and ">=0.25,<0.39" in detail
    for outside in ("0.24.1", "0.39.0"):
        status, detail = doctor.compare_pins(outside, "0.25.0")
        assert status == "fail" and ">=0.25,<0.39" in detail and "tinker>=0.38,<0.39" in detail
    assert doctor.compare_pins("0.25.0", None)[0] == "warn"
    assert doctor.compare_pins(None, "0.25.0")[0] == "fail"


def test_installed_version_reads_the_dist_info_name(tmp_path):
    (tmp_path / "tinker-0.25.0.dist-info").mkdir()
    (tmp_path / "tinker_cookbook-0.5.5.dist-info").mkdir()
    assert doctor.installed_version(tmp_path, "tinker") == "0.25.0"
    assert doctor.installed_version(tmp_path, "tinker-cookbook") == "0.5.5"
    assert doctor.installed_version(tmp_path, "peft") is None


def test_disk_thresholds():
    assert doctor.disk_status(1 * GB) == "fail"
    assert doctor.disk_status(5 * GB) == "warn"
    assert doctor.disk_status(50 * GB) == "ok"


def test_disk_check_names_the_fix(monkeypatch, tmp_path):
    monkeypatch.setenv("RLCLI_HOME", str(tmp_path / "not-yet"))  # a home that does not exist yet still counts
    monkeypatch.setattr(doctor.shutil, "disk_usage", lambda p: types.SimpleNamespace(free=GB))
    check = doctor.check_disk()
    assert check.status == "fail" and "RLCLI_HOME" in check.detail


def test_meminfo_parsing():
    text = "MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   16000000 kB\n"
    assert doctor.mem_available(text) == 16000000 * 1024
    assert doctor.mem_available("MemTotal: 1 kB\n") is None


def test_memory_against_model_size():
    assert doctor.memory_check(16 * GB, 1 * GB, "m").status == "ok"
    assert doctor.memory_check(3 * GB, 1 * GB, "m").status == "warn"
    assert doctor.memory_check(GB // 2, 1 * GB, "m").status == "fail"
    unknown = doctor.memory_check(16 * GB, None, "Qwen/Qwen3-8B")
    assert unknown.status == "ok" and "unknown" in unknown.detail
    assert doctor.memory_check(None, GB, "m").status == "warn"


def test_map_count_warns_below_what_a_long_lived_jax_server_needs(tmp_path, monkeypatch):
    (tmp_path / "cap").write_text("65530\n")
    assert doctor.read_map_count(tmp_path / "cap") == 65530
    assert doctor.read_map_count(tmp_path / "absent") is None  # not Linux: nothing to say
    warning = doctor.map_count_warning(65530)
    assert "65530" in warning and "sysctl -w vm.max_map_count=1048576" in warning and "\n" not in warning
    assert doctor.map_count_warning(1048576) is None and doctor.map_count_warning(None) is None
    monkeypatch.setattr(doctor, "read_map_count", lambda: 65530)
    assert doctor.check_map_count().status == "warn"
    monkeypatch.setattr(doctor, "read_map_count", lambda: 1048576)
    assert doctor.check_map_count().status == "ok"


def test_serve_start_warns_in_one_line_about_a_low_map_count(monkeypatch, capsys, tmp_path):
    from rlcli.errors import UsageError
    from rlcli.server import commands

    monkeypatch.setattr(commands.hw, "read_map_count", lambda: 65530)

    def stop_here(*args, **kwargs):
        raise UsageError("stopped before building anything")

    monkeypatch.setattr(commands.server_venv, "ensure_server_venv", stop_here)
    monkeypatch.setattr(commands.process, "check_port_free", lambda host, port: None)
    monkeypatch.setenv("RLCLI_HOME", str(tmp_path))
    with pytest.raises(UsageError):
        commands.start(commands.StartOptions(base_model="some/model", port=1))
    err = capsys.readouterr().err.splitlines()
    assert [line for line in err if "max_map_count" in line] == [
        "rlcli: warning: " + doctor.map_count_warning(65530)]


def test_weights_bytes_local_folder_and_hf_cache(tmp_path, monkeypatch):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "model.safetensors").write_bytes(b"x" * 1000)
    (tmp_path / "m" / "config.json").write_text("{}")
    assert doctor.weights_bytes(str(tmp_path / "m")) == 1000
    snap = tmp_path / "hub" / "models--org--name" / "snapshots" / "abc"
    snap.mkdir(parents=True)
    (snap / "model-00001.safetensors").write_bytes(b"x" * 300)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert doctor.weights_bytes("org/name") == 300
    assert doctor.weights_bytes("org/absent") is None


def _no_server(monkeypatch):
    from rlcli.server import process

    monkeypatch.setattr(process, "healthz", lambda url, timeout=2.0: False)
    monkeypatch.setattr(doctor.config, "managed_server_url", lambda name="default": None)


def test_an_unreachable_server_fails_only_when_named(monkeypatch):
    _no_server(monkeypatch)
    named = doctor.check_server(Server("http://127.0.0.1:9", explicit=True))
    assert named.status == "fail" and "http://127.0.0.1:9" in named.detail
    default = doctor.check_server(Server("http://127.0.0.1:8000", explicit=False))
    assert default.status == "warn" and "rlcli serve start" in default.detail
    assert doctor.check_backend(Server("http://127.0.0.1:9", True)).status == "warn"


def _fake_docker(monkeypatch, ping_error=None, image_missing=False):
    errors = types.ModuleType("docker.errors")
    errors.DockerException = type("DockerException", (Exception,), {})
    errors.ImageNotFound = type("ImageNotFound", (errors.DockerException,), {})

    class Images:
        def get(self, name):
            if image_missing:
                raise errors.ImageNotFound(name)

    class Client:
        images = Images()

        def ping(self):
            if ping_error:
                raise errors.DockerException(ping_error)

    module = types.ModuleType("docker")
    module.errors = errors
    module.from_env = lambda timeout=None: Client()
    monkeypatch.setitem(sys.modules, "docker", module)
    monkeypatch.setitem(sys.modules, "docker.errors", errors)


@pytest.mark.parametrize(("ping_error", "image_missing", "status", "words"), [
    (None, False, "ok", "debian:bookworm present"),
    (None, True, "warn", "make base-image"),
    ("connection refused", False, "warn", "make docker"),
])
def test_docker(monkeypatch, ping_error, image_missing, status, words):
    _fake_docker(monkeypatch, ping_error, image_missing)
    check = doctor.check_docker()
    assert check.status == status and words in check.detail


def _stub_checks(monkeypatch, statuses: dict[str, str]):
    for name in ("client_python", "server_python", "tinker_pins", "server_venv", "manifest", "database", "cuda",
                 "processes", "docker", "disk", "map_count"):
        status = statuses.get(name, "ok")
        monkeypatch.setattr(doctor, f"check_{name}", lambda n=name, s=status: Check(n, s, "detail"))
    for name in ("server", "api_key", "backend", "memory"):
        status = statuses.get(name, "ok")
        monkeypatch.setattr(doctor, f"check_{name}", lambda srv, n=name, s=status: Check(n, s, "detail"))


def test_exit_code_fails_only_on_a_failed_check(monkeypatch, capsys):
    _stub_checks(monkeypatch, {"cuda": "warn", "docker": "warn"})
    assert doctor.doctor(doctor.DoctorOptions(base_url="http://127.0.0.1:9")) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 16 and out[-1] == "doctor: 13 ok, 2 warn, 0 fail"
    assert out[9].startswith("warn  cuda")
    _stub_checks(monkeypatch, {"disk": "fail"})
    assert doctor.doctor(doctor.DoctorOptions(base_url="http://127.0.0.1:9")) == 1
    assert capsys.readouterr().out.splitlines()[-1] == "doctor: 14 ok, 0 warn, 1 fail (disk)"


def test_a_crashing_check_is_a_failed_line_not_a_traceback(monkeypatch, capsys):
    _stub_checks(monkeypatch, {})

    def broken():
        raise KeyError("boom")

    monkeypatch.setattr(doctor, "check_cuda", broken)
    assert doctor.doctor(doctor.DoctorOptions(base_url="http://127.0.0.1:9")) == 1
    assert "fail  cuda            the check itself failed: KeyError" in capsys.readouterr().out


def test_importing_doctor_stays_light():
    code = ("import sys, rlcli.doctor; "
            "print(sorted(m for m in ('torch', 'tinker', 'transformers', 'jax', 'docker') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_processes_check_names_cores_jax_and_ray(tmp_path):
    from rlcli.server import scaling

    assert scaling.doctor_check(None)[0] == "warn"  # no server venv: no jax to run several processes with
    (tmp_path / "jax-0.12.0.1.dist-info").mkdir()
    status, detail = scaling.doctor_check(tmp_path)
    assert status == "ok" and "jax 0.12.0.1" in detail and "no ray" in detail
    (tmp_path / "ray-2.60.0.dist-info").mkdir()
    assert "ray 2.60.0 in the server venv" in scaling.doctor_check(tmp_path)[1]


def test_the_manifest_check_compares_the_server_venvs_skyrl_and_jax_with_the_pins(tmp_path, monkeypatch):
    monkeypatch.setenv("RLCLI_SERVER_VENV", str(tmp_path / "venv"))
    assert doctor.check_manifest().status == "warn"  # no server venv yet
    site = tmp_path / "venv" / "lib" / "python3.12" / "site-packages"
    for name in ("skyrl-0.4.0.dist-info", "jax-0.12.0.1.dist-info", "jaxlib-0.13.0.dist-info"):
        (site / name).mkdir(parents=True)
    check = doctor.check_manifest()
    assert check.status == "ok" and "skyrl 0.4.0, jax 0.12.0.1" in check.detail and "--manifest" in check.detail
    (site / "skyrl-0.4.0.dist-info").rename(site / "skyrl-0.5.0.dist-info")
    check = doctor.check_manifest()
    assert check.status == "fail" and "skyrl 0.5.0 (rlcli expects skyrl==0.4.0)" in check.detail
    assert "rlcli serve install" in check.detail


def test_doctor_manifest_prints_every_entry_and_stops(capsys):
    from rlcli.server.runtime import manifest

    assert doctor.doctor(doctor.DoctorOptions(manifest=True)) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"rlcli overrides {len(manifest.overridden())} names")
    assert all(entry.target in out for entry in manifest.ENTRIES) and "doctor:" not in out  # no checks ran
