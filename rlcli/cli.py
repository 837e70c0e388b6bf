"""The `rlcli` command: a thin dispatcher over functions of the rlcli package.

Each command is a function that takes one record of options (rlcli.options): its flags, their help, defaults
and choices come from the record's fields, and its description from the function's docstring. scripts/*.py
launch the same commands through `main` (rlcli.scripting), so `rlcli serve start` and
`python scripts/serve.py start` parse the same flags and run the same code.

Commands are named here as "module:function" strings and imported only when
used, which keeps `rlcli --help` fast (no torch, tinker or jax on that path).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import sys
import typing
from collections.abc import Callable
from typing import Any, NoReturn

from rlcli import __version__
from rlcli.errors import EXIT_USAGE, run_guarded
from rlcli.files import private_files


def _functions_of(module: str, helps: dict[str, str]) -> dict[str, tuple[str, str]]:
    """Commands that are functions of one module, each named as its function: {name: (help, target)}."""
    return {name: (help_text, f"{module}:{name}") for name, help_text in helps.items()}


# name -> (one-line help, "module:function") or a group: name -> (help, {sub: ...})
COMMANDS: dict[str, Any] = {
    "serve": ("run SkyRL's Tinker API server on this machine", _functions_of("rlcli.server.commands", {
        "start": "start the server and wait until it serves requests",
        "stop": "stop the server and every process it started",
        "status": "say whether the server is running, starting or dead",
        "logs": "print (or follow) the server log",
        "restart": "stop, then start with the same settings",
        "install": "build or verify the server venv without starting",
        "worker": "join another machine's multi-process jax server as one of its processes",
    })),
    "demo": ("a short real job on the server: LoRA, SFT steps, save, sample", "rlcli.demo:demo"),
    "train": (
        "train a model on the server",
        {
            "sl": ("supervised fine-tuning on chat JSONL (tinker-cookbook's recipe)", "rlcli.train.sl:train_sl"),
            "rl": ("RL with a server-side loss (fused GSPO: one forward_backward)", "rlcli.train.rl:train_rl"),
            "dpo": ("DPO on preference pairs (tinker-cookbook's recipe), the starting weights as reference",
                    "rlcli.train.dpo:train_dpo"),
            "harbor": ("agent RL on Harbor tasks in local Docker; the test verdict is the reward",
                       "rlcli.harbor.train:train_harbor"),
            "distill": ("on-policy distillation: the student's own samples, a teacher's logprobs as the signal",
                        "rlcli.train.distill:train_distill"),
            "prune": ("delete the checkpoints of finished runs under a folder beyond the newest N (opt-in)",
                      "rlcli.train.prune:prune"),
        },
    ),
    "import": (
        "convert chat logs (openai|anthropic|gemini|messages|langsmith|otel) to training JSONL",
        "rlcli.data.import_cmd:import_cmd",
    ),
    "synth": (
        "problems synthesized from imported traces",
        {
            "qa": ("{question, answer} problems from traces whose final answer is checkable",
                   "rlcli.problems.synth:qa"),
        },
    ),
    "harbor": (
        "Harbor tasks in local Docker",
        {
            "run": ("run and grade Harbor tasks without training", "rlcli.harbor.run:run"),
        },
    ),
    "sample": ("sample completions for a prompt from a checkpoint or the base model", "rlcli.sample:sample"),
    "chat": ("chat with a checkpoint or the base model, turn by turn (stdin)", "rlcli.sample:chat"),
    "eval": ("score a checkpoint or the base model on train rl's held-out problems", "rlcli.evaluate:evaluate"),
    "export": ("download sampler weights as a PEFT adapter or merged Hugging Face model", "rlcli.export:export"),
    "doctor": ("check this machine and the server: one line per check, with the fix", "rlcli.doctor:doctor"),
    "tenant": ("API keys of a server a team shares (`serve start --tenants`)", {
        "add": ("add a tenant and print its key once", "rlcli.tenants:add"),
        "list": ("list tenants and their quotas (never keys)", "rlcli.tenants:list_"),
        "revoke": ("remove a tenant; servers refuse its key from the next request", "rlcli.tenants:revoke"),
        "orphans": ("list runs nobody owns (made before --tenants was on)", "rlcli.tenants:orphans"),
        "claim": ("give runs nobody owns to a tenant (server stopped)", "rlcli.tenants:claim"),
    }),
    "loop": ("the continual-learning loop: new traces -> train -> evaluate -> gate -> promote", _functions_of(
        "rlcli.loop.commands", {
            "init": "make a loop folder: loop.toml, the ledger, the frozen regression set",
            "run": "run iterations: ingest, split, train, evaluate, gate, promote (resumes an unfinished one)",
            "status": "the champion, the last iteration, what is pending",
            "history": "every iteration as a table: data, runs, scores, decision, why",
            "promote": "make an iteration's candidate the champion by hand",
            "rollback": "move the champion alias back (the export follows)",
        })),
    "endpoint": ("OpenAI/Anthropic-compatible inference over the server's weights, traffic captured for the loop",
                 {**_functions_of("rlcli.endpoint.commands", {
                     "start": "start the endpoint in the background and wait until it answers",
                     "stop": "stop the endpoint and its capture store",
                     "status": "whether it runs, where, and what each model name answers from",
                 }), "run": ("serve in the foreground until Ctrl-C", "rlcli.endpoint.serving:run")}),
    "model": ("the embedded tiny model", {
        "install": ("put the shipped model in RLCLI_HOME (no build) and print its folder", "rlcli.model:install"),
        "build": ("run the recipe that made the shipped model; say whether the bytes match",
                  "rlcli.model.recipe:build"),
    }),
}

# Commands whose raw arguments go to the official tinker CLI (`rlcli checkpoint list --run-id R`).
PASSTHROUGH: dict[str, tuple[str, str]] = _functions_of("rlcli.passthrough", {
    "checkpoint": "tinker's checkpoint commands against this server (list, info, delete, ...)",
    "run": "tinker's training-run commands against this server (list, info)",
    "session": "tinker's session commands against this server",
})

# Third-party packages whose versions --version reports, with the pins the server venv uses.
_VERSION_PACKAGES = ("tinker", "tinker-cookbook")


def _lookup(path: list[str]) -> tuple[str, Any]:
    node: Any = ("", COMMANDS)
    for name in path:
        node = node[1][name]
    return node


def _load(target: str) -> Callable[..., Any]:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def record_of(fn: Callable[..., Any]) -> type | None:
    """The record a command takes (its one parameter's type), or None for a command without options."""
    from rlcli import options  # here, not at the top: `rlcli --help` builds no command's flags

    params = list(inspect.signature(fn).parameters)
    if not params:
        return None
    hint = typing.get_type_hints(fn)[params[0]]
    if not (isinstance(hint, type) and issubclass(hint, options.Record)):
        raise TypeError(f"{fn.__qualname__} takes {hint}, not a record of options (rlcli.options)")
    return hint


def call(fn: Callable[..., Any], record: type, values: dict[str, Any]) -> Any:
    """fn on its options as the command line gave them (checked as the record is made)."""
    return fn(record(**values))


def _summary(fn: Callable[..., Any]) -> str:
    return (inspect.getdoc(fn) or "").split("\n\n")[0].replace("\n", " ")


def add_options(parser: argparse.ArgumentParser, record: type) -> None:
    """A flag (or an argument) for each of the record's options, with its help, default and choices."""
    from rlcli import options

    for s in options.specs(record):
        typ = s.kind if s.kind in (int, float) else str
        if s.positional:
            optional = {} if s.required else {"nargs": "?", "default": s.default, "metavar": s.name.upper()}
            parser.add_argument(s.name, help=s.opt.help, type=typ, choices=s.choices, **optional)
            continue
        flags = [s.flag, *([s.opt.short] if s.opt.short else [])]
        default = None if s.required else s.default
        if s.kind is bool:
            parser.add_argument(*flags, dest=s.name, default=default, help=s.opt.help,
                                action=argparse.BooleanOptionalAction)
        else:
            shown = "" if default is None else f" (default: {default})"
            parser.add_argument(*flags, dest=s.name, default=default, type=typ, choices=s.choices,
                                required=s.required, help=s.opt.help + shown, metavar=s.name.upper())


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (what was wrong, where the flags are listed), exit 2."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}; see `{self.prog} --help`\n")


def _build_parser(argv: list[str], script: tuple[str, int] | None = None) -> tuple[argparse.ArgumentParser, list[str]]:
    """Build only the parser the argv needs: the root, or one command's. script: (its name, how many of argv's
    words it stands for), so a script's usage and errors name the script."""
    root = _Parser(
        prog="rlcli",
        description="Continual learning on your own hardware: serve, train, import, export.",
    )
    root.add_argument("--version", action="store_true", help="print rlcli's and its pinned stack's versions")
    root.add_argument("--debug", action="store_true", help="show tracebacks (same as RLCLI_DEBUG=1)")
    root.add_argument("--api-key", metavar="KEY", help=API_KEY_HELP)
    path: list[str] = []
    node: Any = COMMANDS
    parser = root
    rest = list(argv)
    # Walk down the command tree as far as the words go; options before the command stay at the root.
    while rest and isinstance(node, dict) and rest[0] in node:
        name = rest.pop(0)
        path.append(name)
        help_text, node = node[name]
    if path:
        prog = " ".join([script[0], *path[script[1]:]] if script else ["rlcli", *path])
        parser = _Parser(prog=prog, description=_lookup(path)[0])
        parser.add_argument("--debug", action="store_true", help="show tracebacks")
    if isinstance(node, dict):
        sub = parser.add_subparsers(dest="_command", metavar="COMMAND")
        for name, (help_text, _) in (node if path else {**node, **PASSTHROUGH}).items():
            sub.add_parser(name, help=help_text)
    else:
        fn = _load(node)
        parser.description = _summary(fn)
        if (record := record_of(fn)) is not None:
            add_options(parser, record)
        parser.add_argument("--api-key", metavar="KEY", dest="_api_key", help=API_KEY_HELP)  # main hands it on
    return parser, path


def versions() -> str:
    from importlib import metadata

    from rlcli.server import server_venv

    lines = [f"rlcli {__version__}"]
    for pkg in _VERSION_PACKAGES:
        try:
            lines.append(f"{pkg} {metadata.version(pkg)} (client)")
        except metadata.PackageNotFoundError:
            lines.append(f"{pkg} not installed (client)")
    for pkg, ver in server_venv.pinned_versions().items():
        lines.append(f"{pkg} {ver} (server pin)")
    return "\n".join(lines)


API_KEY_HELP = "tenant key for a server started with --tenants (default: TINKER_API_KEY)"


def _take_api_key(argv: list[str]) -> list[str]:
    """Remove --api-key KEY (any command, anywhere) and hand the key on as TINKER_API_KEY."""
    for i, word in enumerate(argv):
        if word == "--api-key" or word.startswith("--api-key="):
            value = word.partition("=")[2] if "=" in word else (argv[i + 1] if i + 1 < len(argv) else "")
            from rlcli.tenants import api_key

            api_key(value or "missing")
            return argv[:i] + argv[i + (1 if "=" in word else 2):]
    return argv


def main(argv: list[str] | None = None, script: tuple[str, int] | None = None) -> int:
    """Run one command; its exit code. script: see _build_parser (scripts/*.py launch commands through here)."""
    private_files()  # before anything is written: every file a command makes holds its user's data
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        argv = _take_api_key(argv)
    except Exception as e:  # a bad key: one line, like every usage error
        return run_guarded(_raise, e)
    if "--debug" in argv:
        import os

        os.environ["RLCLI_DEBUG"] = "1"
    words = [a for a in argv if a != "--debug"]
    if words[:1] and words[0] in PASSTHROUGH:
        return run_guarded(_load(PASSTHROUGH[words[0]][1]), words[1:])
    if argv[:1] == ["--version"]:
        print(versions())
        return 0
    parser, path = _build_parser(argv, script)
    rest = argv[len(path):]
    if not path or isinstance(_lookup(path)[1], dict):
        ns = parser.parse_args(rest)
        if getattr(ns, "version", False):
            print(versions())
            return 0
        parser.print_help(sys.stderr if rest else sys.stdout)
        return EXIT_USAGE if rest or path else 0
    ns = parser.parse_args(rest)
    values = {k: v for k, v in vars(ns).items() if k not in ("debug", "_api_key")}
    fn = _load(_lookup(path)[1])
    record = record_of(fn)
    return run_guarded(call, fn, record, values) if record else run_guarded(fn)


def _raise(error: BaseException) -> None:
    raise error


def entry() -> None:
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:  # `rlcli --version | head -1`: the reader stopped reading; say nothing more
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 128 + 13  # what a shell reports for a command ended by SIGPIPE
    leave(code)


def leave(code: int) -> NoReturn:
    """Exit with `code`. A process that ran the tinker client skips the interpreter's finalization, after
    everything an exit does before it (other threads joined, atexit handlers run, output flushed): the client's
    HTTP runs on native threads that call back into Python, and one that does so while the interpreter finalizes
    aborts the process, which then exits SIGABRT with its work done and nothing said (docs/decisions.md, "A
    command that ran the tinker client leaves without finalizing")."""
    if "tinker" not in sys.modules:
        sys.exit(code)
    import atexit
    import os
    import threading

    threading._shutdown()  # as an exit does first: executors told to stop, the other non-daemon threads joined
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader gone, or a stream closed: nothing more to say there
            pass
    os._exit(int(code or 0))


if __name__ == "__main__":
    entry()
