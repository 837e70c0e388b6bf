"""rlcli: a command line and toolkit for continual learning on your own hardware.

Heavy libraries (tinker, torch, transformers, jax) are imported inside the
functions that need them, never at import time of this package, so that
`rlcli --help` stays fast. Importing the package puts one import finder in
place (rlcli/lean_imports.py): transformers' tokenizer import then skips its
text-generation code, which no rlcli client process runs. At exit, the tinker
client's background requests are cancelled before the interpreter finalizes
(rlcli.client.quiesce_tinker says why).
"""

import atexit
import sys

from rlcli import lean_imports

__version__ = "0.1.0"

lean_imports.install()


def _quiesce_at_exit() -> None:
    if "tinker" not in sys.modules:  # no client, nothing to cancel: `rlcli import` exits without loading urllib
        return
    from rlcli.client import quiesce_tinker

    quiesce_tinker()


atexit.register(_quiesce_at_exit)
