"""`rlcli checkpoint|run|session`: argument rewriting, server resolution, exit codes, one-line failures.

A fake `tinker` script stands in for the real one (no server, no network); one test runs the real
tinker CLI's --help, which needs neither.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import textwrap
import threading
import time

import pytest

from rlcli import cli, passthrough, watchdog
from rlcli.errors import EXIT_SERVER_GONE, EXIT_USAGE
from rlcli.passthrough import hoist_format, normalize_path, split_base_url, unsupported_line, wants_help
from tests.unit.conftest import Health

URL = "http://127.0.0.1:9"


def test_base_url_is_removed_anywhere_and_the_last_one_wins():
    args = ["list", "--base-url", "http://a", "--run-id", "r"]
    assert split_base_url(args) == ("http://a", ["list", "--run-id", "r"])
    assert split_base_url(["--base-url=http://a", "info", "--base-url", "http://b", "x"]) == ("http://b", ["info", "x"])
    assert split_base_url(["list", "--debug"]) == (None, ["list"])
    assert split_base_url(["x", "--", "--base-url", "y"]) == (None, ["x", "--", "--base-url", "y"])


def test_format_moves_to_tinkers_root_group():
    args = ["list", "--format", "json", "--run-id", "r"]
    assert hoist_format(args) == (["--format", "json"], ["list", "--run-id", "r"])
    assert hoist_format(["-f", "json", "list"]) == (["--format", "json"], ["list"])
    assert hoist_format(["list", "--format=json"]) == (["--format=json"], ["list"])
    assert hoist_format(["list"]) == ([], ["list"])


def test_skyrls_sampler_paths_are_written_the_way_tinker_parses_them():
    assert normalize_path("tinker://model_1/s1") == "tinker://model_1/sampler_weights/s1"
    assert normalize_path("tinker://model_1/weights/t1") == "tinker://model_1/weights/t1"
    assert normalize_path("tinker://model_1/sampler_weights/s1") == "tinker://model_1/sampler_weights/s1"
    assert normalize_path("--run-id") == "--run-id"


NO_ROUTE = "Error: Resource not found\nDetails: Error code: 404 - {'detail': 'Not Found'}\n"
NO_METHOD = "Error: API error (status 405)\nDetails: Error code: 405 - {'detail': 'Method Not Allowed'}\n"
MISSING_RUN = "Error: Resource not found\nDetails: Error code: 404 - {'detail': 'Model not found'}\n"


def test_missing_endpoints_become_one_line_with_what_to_do():
    line = unsupported_line("checkpoint", ["download", "tinker://r/sampler_weights/s"], NO_METHOD, URL)
    assert line.startswith("`rlcli checkpoint download` needs an endpoint") and "rlcli export" in line
    line = unsupported_line("checkpoint", ["list"], NO_ROUTE, URL)
    assert "--run-id" in line and "rlcli run list" in line
    assert "does not offer" in unsupported_line("run", ["frobnicate"], NO_ROUTE, URL)
    assert "does not offer" in unsupported_line("checkpoint", ["set-ttl", "p"], NO_METHOD, URL)
    assert "\n" not in line


def test_tinkers_own_errors_pass_through():
    assert unsupported_line("run", ["info", "nope"], MISSING_RUN, URL) is None  # a real "not found"
    assert unsupported_line("checkpoint", ["bogus"], "Error: No such command 'bogus'.\n", URL) is None


def test_a_traceback_becomes_one_line():
    tb = 'Traceback (most recent call last):\n  File "x.py", line 1\nKeyError: \'cursor\'\n'
    line = unsupported_line("run", ["list"], tb, URL)
    assert "KeyError: 'cursor'" in line and "RLCLI_DEBUG=1" in line


FAKE_TINKER = textwrap.dedent("""
    import json, os, sys, time
    print(json.dumps({"argv": sys.argv[1:], "url": os.environ.get("TINKER_BASE_URL"),
                      "key": os.environ.get("TINKER_API_KEY")}), flush=True)
    if os.environ.get("FAKE_PIDFILE"):
        with open(os.environ["FAKE_PIDFILE"], "w") as f:
            f.write(str(os.getpid()))
    time.sleep(float(os.environ.get("FAKE_SLEEP") or 0))  # as tinker does, retrying a server that is gone
    sys.stderr.write(os.environ.get("FAKE_STDERR", ""))
    sys.exit(int(os.environ.get("FAKE_EXIT", "0")))
""")
REAL_HEALTH = watchdog.health


@pytest.fixture
def fake_tinker(tmp_path, monkeypatch):
    """The fake tinker, and every URL taken for an answering server (these tests are about arguments)."""
    script = tmp_path / "fake_tinker.py"
    script.write_text(FAKE_TINKER)
    monkeypatch.setattr(passthrough, "tinker_command", lambda: [sys.executable, str(script)])
    monkeypatch.setattr(watchdog, "health", lambda url, timeout_s: "ok")
    monkeypatch.setenv("RLCLI_HOME", str(tmp_path / "home"))
    for var in ("TINKER_BASE_URL", "TINKER_API_KEY", "RLCLI_DEBUG", "FAKE_STDERR", "FAKE_EXIT", "FAKE_SLEEP",
                "FAKE_PIDFILE"):
        monkeypatch.setenv(var, "")  # recorded, so that teardown also undoes what `rlcli --debug` sets
        monkeypatch.delenv(var)


def _called(capfd) -> tuple[dict, str]:
    out, err = capfd.readouterr()
    return json.loads(out.strip().splitlines()[-1]), err


def test_explicit_url_wins_then_env_then_managed_server(fake_tinker, capfd, monkeypatch, tmp_path):
    monkeypatch.setenv("TINKER_BASE_URL", "http://from-env:1")
    assert passthrough.run_tinker("run", ["list", "--base-url", "http://explicit:2"]) == 0
    called, _ = _called(capfd)
    assert called["url"] == "http://explicit:2" and called["argv"] == ["run", "list"]
    assert called["key"].startswith("tml-")  # the placeholder the client insists on
    passthrough.run_tinker("run", ["list"])
    assert _called(capfd)[0]["url"] == "http://from-env:1"
    monkeypatch.delenv("TINKER_BASE_URL")
    state = tmp_path / "home" / "servers" / "default"
    state.mkdir(parents=True)
    (state / "state.json").write_text(json.dumps({"host": "127.0.0.1", "port": 8123}))
    passthrough.run_tinker("run", ["list"])
    assert _called(capfd)[0]["url"] == "http://127.0.0.1:8123"


def test_a_users_api_key_is_kept(fake_tinker, capfd, monkeypatch):
    monkeypatch.setenv("TINKER_API_KEY", "tml-mine")
    passthrough.run_tinker("run", ["list"])
    assert _called(capfd)[0]["key"] == "tml-mine"


def test_exit_codes_and_tinkers_stderr_are_forwarded(fake_tinker, capfd, monkeypatch):
    monkeypatch.setenv("FAKE_EXIT", "3")
    monkeypatch.setenv("FAKE_STDERR", "Error: No such command 'x'.\n")
    assert passthrough.run_tinker("checkpoint", ["x", "-f", "json"]) == 3
    called, err = _called(capfd)
    assert called["argv"] == ["--format", "json", "checkpoint", "x"]
    assert err == "Error: No such command 'x'.\n"


def test_an_unsupported_command_prints_one_line(fake_tinker, capfd, monkeypatch):
    monkeypatch.setenv("FAKE_EXIT", "1")
    monkeypatch.setenv("FAKE_STDERR", NO_METHOD)
    assert passthrough.run_tinker("checkpoint", ["publish", "tinker://r/s1"]) == 1
    called, err = _called(capfd)
    assert called["argv"] == ["checkpoint", "publish", "tinker://r/sampler_weights/s1"]
    assert err.count("\n") == 1 and err.startswith("rlcli: error: `rlcli checkpoint publish`")
    monkeypatch.setenv("RLCLI_DEBUG", "1")  # debugging shows tinker's own output as well
    passthrough.run_tinker("checkpoint", ["publish", "tinker://r/s1"])
    assert "405" in _called(capfd)[1]


def test_cli_hands_raw_arguments_to_the_passthrough(fake_tinker, capfd, monkeypatch):
    monkeypatch.setenv("FAKE_EXIT", "4")
    assert cli.main(["checkpoint", "list", "--run-id", "r", "--base-url", "http://x:3"]) == 4
    called, _ = _called(capfd)
    assert called["argv"] == ["checkpoint", "list", "--run-id", "r"] and called["url"] == "http://x:3"
    assert cli.main(["--debug", "session", "export-trace", "s"]) == 4
    assert _called(capfd)[0]["argv"] == ["session", "export-trace", "s"]


def test_root_help_lists_the_passthrough_commands(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for name in ("checkpoint", "run", "session", "sample", "chat", "export", "doctor"):
        assert re.search(rf"^ +{name}\b", out, re.MULTILINE), name


def test_help_is_tinkers_own(capfd, monkeypatch):
    monkeypatch.delenv("TINKER_BASE_URL", raising=False)
    assert passthrough.run_tinker("checkpoint", ["--help"]) == 0
    out = capfd.readouterr().out
    assert "Usage: tinker checkpoint" in out and "download" in out


def test_help_and_a_bare_group_ask_no_server():
    assert wants_help(["--help"]) and wants_help(["list", "-h"]) and wants_help([])
    assert not wants_help(["list", "--run-id", "r"]) and not wants_help(["info", "--", "--help"])


def test_no_server_there_is_one_line_at_once_and_tinker_never_starts(fake_tinker, capfd, monkeypatch):
    """tinker retries a server that is not there for ever: rlcli looks first."""
    monkeypatch.setattr(watchdog, "health", REAL_HEALTH)
    assert passthrough.run_tinker("checkpoint", ["list", "--base-url", "http://127.0.0.1:9"]) == EXIT_SERVER_GONE
    out, err = capfd.readouterr()
    assert out == ""  # tinker was not started (the fake prints its arguments first)
    assert err == f"rlcli: error: {watchdog.no_server('http://127.0.0.1:9')}\n"


def test_a_frozen_server_is_one_line_that_says_restart(fake_tinker, capfd, monkeypatch):
    monkeypatch.setattr(watchdog, "health", REAL_HEALTH)
    monkeypatch.setattr(passthrough, "PRECHECK_S", 0.3)
    with socket.create_server(("127.0.0.1", 0)) as frozen:  # accepts connections, never answers
        url = f"http://127.0.0.1:{frozen.getsockname()[1]}"
        assert passthrough.run_tinker("run", ["list", "--base-url", url]) == EXIT_SERVER_GONE
    out, err = capfd.readouterr()
    assert out == "" and err.startswith(f"rlcli: error: the server at {url} stopped answering")
    assert "rlcli serve restart" in err and err.count("\n") == 1


def test_a_server_gone_mid_command_ends_tinker_with_one_line(fake_tinker, capfd, monkeypatch, health_server,
                                                             tmp_path):
    monkeypatch.setattr(watchdog, "health", REAL_HEALTH)
    monkeypatch.setattr(watchdog, "GRACE_S", 0.5)
    monkeypatch.setenv("FAKE_SLEEP", "60")
    monkeypatch.setenv("FAKE_PIDFILE", str(tmp_path / "pid"))
    threading.Timer(1.0, setattr, (Health, "answering", False)).start()  # the server freezes after the look
    started = time.monotonic()
    code = passthrough.run_tinker("run", ["list", "--base-url", health_server, "--server-timeout", "1.5"])
    took = time.monotonic() - started
    out, err = capfd.readouterr()
    assert code == EXIT_SERVER_GONE and took < 20, (code, took)
    assert json.loads(out)["argv"] == ["run", "list"]  # tinker ran, without rlcli's own option
    assert err.startswith(f"rlcli: error: the server at {health_server} stopped answering")
    with pytest.raises(ProcessLookupError):  # and it is gone, not left retrying
        os.kill(int((tmp_path / "pid").read_text()), 0)


def test_a_bad_server_timeout_is_a_usage_line(fake_tinker, capfd):
    assert cli.main(["session", "list", "--server-timeout", "soon"]) == EXIT_USAGE
    out, err = capfd.readouterr()
    assert out == "" and err.startswith("rlcli: error: --server-timeout soon: give the seconds")
