"""What every scripts/*.py shares: a launcher over `rlcli`'s own commands, in `rlcli`'s own grammar.

A script stands for one command or one group of them (`scripts/serve.py start` is `rlcli serve start`): the same
record of options makes its flags, the same function runs, and a bad value is the same one line and exit 2. Its
usage and errors name the script. Why argparse and not fire: docs/decisions.md, "Scripts parse like rlcli".
"""

from __future__ import annotations

import os
import sys


def launch(*words: str) -> None:
    """Run `rlcli WORDS ...` with this script's arguments, and exit with its code."""
    from rlcli.cli import leave, main

    leave(main([*words, *sys.argv[1:]], script=(os.path.basename(sys.argv[0]), len(words))))


def launch_one_of(commands: dict[str, tuple[str, ...]]) -> None:
    """A script whose first word picks one of several commands (`harbor.py train` is `rlcli train harbor`)."""
    from rlcli.cli import COMMANDS, leave, main

    script, args = os.path.basename(sys.argv[0]), sys.argv[1:]
    if not args or args[0] not in commands:
        lines = [f"usage: {script} {{{','.join(commands)}}} ...", ""]
        for name, words in commands.items():
            node = COMMANDS[words[0]]
            lines.append(f"  {name:<10} {(node[1][words[1]] if len(words) > 1 else node)[0]}")
        asked = args[:1] in (["--help"], ["-h"])
        print("\n".join(lines), file=sys.stdout if asked else sys.stderr)
        sys.exit(0 if asked else 2)
    leave(main([*commands[args[0]], *args[1:]], script=(f"{script} {args[0]}", len(commands[args[0]]))))
