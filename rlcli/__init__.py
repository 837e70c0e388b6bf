"""rlcli: a command line and toolkit for continual learning on your own hardware.

Heavy libraries (tinker, torch, transformers, jax) are imported inside the
functions that need them, never at import time of this package, so that
`rlcli --help` stays fast.
"""

__version__ = "0.1.0"
