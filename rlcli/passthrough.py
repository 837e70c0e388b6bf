"""`rlcli checkpoint|run|session ...`: the official tinker CLI, pointed at the self-hosted server.

Launch:  rlcli checkpoint list --run-id RUN        (any `tinker checkpoint|run|session` arguments)
         rlcli run list --base-url http://host:8000
         rlcli checkpoint --help                   (tinker's own help)

The arguments go to the `tinker` console script of this venv unchanged, except:
  --base-url URL (anywhere)   removed; it becomes TINKER_BASE_URL (tinker has no such flag)
  --server-timeout S          removed; seconds the server may go without answering before the command
                              stops (default 60, 0: wait for ever), as in rlcli's own commands
  --format/-f table|json      moved in front of the group, where tinker's root group reads it
  tinker://RUN/ID             SkyRL's own sampler path, written the way tinker parses it
Exit codes are tinker's. SkyRL 0.4.0 lacks some endpoints tinker calls: those failures become one line
that says what to do instead, not tinker's traceback or a bare 404. The tinker client retries a server
that does not answer for ever, so a command finds out first whether one answers (one line and exit 75
if not) and is ended, with one line, when its server stops answering for the timeout.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from rlcli import watchdog
from rlcli.config import PLACEHOLDER_API_KEY, resolve_base_url
from rlcli.errors import EXIT_FAILED, UsageError, debug_enabled

GROUPS = ("checkpoint", "run", "session")
PRECHECK_S = 5.0  # how long the health route may take to answer before tinker is started

# Checked against SkyRL 0.4.0 with tinker 0.25: what each missing piece should be replaced with.
_EXPORT = "`rlcli export tinker://RUN/sampler_weights/ID --format peft -o DIR` downloads sampler weights"
UNSUPPORTED: dict[tuple[str, str], str] = {
    ("checkpoint", "download"): _EXPORT,
    ("checkpoint", "push-hf"): _EXPORT + "; upload that folder with `hf upload`",
    ("checkpoint", "publish"): "checkpoints on a self-hosted server are private to it; share an export instead",
    ("checkpoint", "unpublish"): "checkpoints on a self-hosted server are never published",
    ("checkpoint", "set-ttl"): "checkpoints live until deleted: `rlcli checkpoint delete PATH`",
    ("session", "export-trace"): "the server log has the request timeline: `rlcli serve logs`",
}
# FastAPI's answer for a route it does not have (a missing checkpoint says "Checkpoint not found: ...").
_NO_ROUTE = re.compile(r"Error code: (404|405) - \{'detail': '(Not Found|Method Not Allowed)'\}")
_SKYRL_SAMPLER_PATH = re.compile(r"^tinker://([^/]+)/([^/]+)$")


def checkpoint(argv: list[str]) -> int:
    return run_tinker("checkpoint", argv)


def run(argv: list[str]) -> int:
    return run_tinker("run", argv)


def session(argv: list[str]) -> int:
    return run_tinker("session", argv)


def split_option(args: list[str], name: str) -> tuple[str | None, list[str]]:
    """Remove every `name VALUE` / `name=VALUE` (the last one wins) and rlcli's --debug; arguments after `--`
    stay as they are."""
    value, out, i = None, [], 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            out += args[i:]
            break
        if arg == name and i + 1 < len(args):
            value, i = args[i + 1], i + 2
            continue
        if arg.startswith(name + "="):
            value = arg.split("=", 1)[1]
        elif arg != "--debug":
            out.append(arg)
        i += 1
    return value, out


def split_base_url(args: list[str]) -> tuple[str | None, list[str]]:
    return split_option(args, "--base-url")


def server_timeout(value: str | None) -> float:
    if value is None:
        return watchdog.DEFAULT_TIMEOUT_S
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:  # also NaN
        raise UsageError(f"--server-timeout {value}: give the seconds the server may go without answering "
                         "(0: wait for ever)")
    return seconds


def wants_help(args: list[str]) -> bool:
    """Help, or no subcommand (tinker prints the group's usage): nothing asks the server."""
    head = args[:args.index("--")] if "--" in args else args
    return not subcommand(head) or "--help" in head or "-h" in head


def hoist_format(args: list[str]) -> tuple[list[str], list[str]]:
    """(root options, the rest): --format is an option of tinker's root group, not of its subcommands."""
    root, out, i = [], [], 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            out += args[i:]
            break
        if arg in ("--format", "-f") and i + 1 < len(args):
            root, i = ["--format", args[i + 1]], i + 2
            continue
        if arg.startswith("--format="):
            root = [arg]
        else:
            out.append(arg)
        i += 1
    return root, out


def normalize_path(arg: str) -> str:
    """SkyRL returns sampler saves as tinker://RUN/ID, which tinker's CLI refuses; both name the same file."""
    m = _SKYRL_SAMPLER_PATH.match(arg)
    return f"tinker://{m.group(1)}/sampler_weights/{m.group(2)}" if m else arg


def tinker_command() -> list[str]:
    """The `tinker` console script installed beside this interpreter (the client venv's)."""
    script = Path(sys.executable).parent / "tinker"
    return [str(script)] if script.exists() else [sys.executable, "-m", "tinker.cli"]


def subcommand(args: list[str]) -> str:
    return next((a for a in args if not a.startswith("-")), "")


def unsupported_line(group: str, args: list[str], stderr: str, url: str) -> str | None:
    """One line for a failure caused by an endpoint SkyRL lacks; None for tinker's own errors."""
    sub = subcommand(args)
    what = "`" + " ".join(w for w in ("rlcli", group, sub) if w) + "`"
    if (group, sub) in UNSUPPORTED:
        return f"{what} needs an endpoint the self-hosted server at {url} does not offer: {UNSUPPORTED[group, sub]}"
    if (group, sub) == ("checkpoint", "list") and "--run-id" not in " ".join(args) and _NO_ROUTE.search(stderr):
        return (f"{what} without --run-id lists every user's checkpoints, which the self-hosted server at {url} "
                "does not offer: pass --run-id RUN (`rlcli run list` shows the runs)")
    if _NO_ROUTE.search(stderr):
        return f"{what} calls an endpoint the self-hosted server at {url} does not offer"
    if "Traceback (most recent call last)" in stderr:
        last = stderr.strip().splitlines()[-1]
        return (f"{what} failed against the self-hosted server at {url} ({last}); it probably does not offer "
                "what this command needs (rerun with RLCLI_DEBUG=1 for tinker's output)")
    return None


def run_tinker(group: str, argv: list[str]) -> int:
    """Run `tinker [--format F] GROUP ARGS...` against the resolved server; return tinker's exit code."""
    explicit, args = split_base_url(argv)
    timeout, args = split_option(args, "--server-timeout")
    timeout_s = server_timeout(timeout)
    root, args = hoist_format(args)
    args = [normalize_path(a) for a in args]
    url = resolve_base_url(explicit)
    help_only = wants_help(args)  # tinker answers help and usage itself
    state = "ok" if help_only else watchdog.health(url, PRECHECK_S)
    if state == "absent" or (state == "silent" and timeout_s):  # --server-timeout 0 waits for a silent one
        if cause := watchdog.lost_worker(url):
            line = watchdog.stopped_answering(url)(PRECHECK_S, cause)
        else:
            line = watchdog.no_server(url) if state == "absent" else watchdog.stopped_answering(url)(PRECHECK_S)
        print(f"rlcli: error: {line}", file=sys.stderr)
        return watchdog.ServerGone.exit_code
    env = dict(os.environ, TINKER_BASE_URL=url)
    env.setdefault("TINKER_API_KEY", PLACEHOLDER_API_KEY)
    proc = None
    try:
        with watchdog.watch(url, 0 if help_only else timeout_s):
            # stdout and stdin stay attached: tables, progress and delete's confirmation prompt work as usual.
            proc = subprocess.Popen([*tinker_command(), *root, group, *args], env=env, stderr=subprocess.PIPE,
                                    text=True)
            _, stderr = proc.communicate()
    except watchdog.ServerGone as gone:
        print(f"rlcli: error: {gone}", file=sys.stderr)
        return gone.exit_code
    finally:
        if proc is not None and proc.poll() is None:  # the server went away, or Ctrl-C: tinker goes too
            proc.kill()
            proc.wait()
    code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
    line = unsupported_line(group, args, stderr, url) if code != 0 else None
    if line is None or debug_enabled():
        sys.stderr.write(stderr)
    if line is not None:
        print(f"rlcli: error: {line}", file=sys.stderr)
        return code or EXIT_FAILED
    return code
