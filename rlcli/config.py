"""Where rlcli keeps its state, and which server a command talks to."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
# The tinker client insists on a key that starts with `tml-`; SkyRL checks none.
PLACEHOLDER_API_KEY = "tml-self-hosted"


def rlcli_home() -> Path:
    """All of rlcli's state: RLCLI_HOME, else ~/.rlcli."""
    home = os.environ.get("RLCLI_HOME")
    return Path(home).expanduser() if home else Path.home() / ".rlcli"


def server_venv_dir(override: str | None = None) -> Path:
    """The server venv: --venv, else RLCLI_SERVER_VENV, else RLCLI_HOME/server-venv.

    Pointing several homes at one venv saves its ~7 GB.
    """
    chosen = override or os.environ.get("RLCLI_SERVER_VENV")
    return Path(chosen).expanduser() if chosen else rlcli_home() / "server-venv"


def server_state_dir(name: str = "default") -> Path:
    return rlcli_home() / "servers" / name


def managed_server_url(name: str = "default") -> str | None:
    """The URL of the server `rlcli serve start` last recorded for this home, if any."""
    state_file = server_state_dir(name) / "state.json"
    try:
        state = json.loads(state_file.read_text())
    except (OSError, ValueError):
        return None
    host = state.get("host", DEFAULT_HOST)
    if host in ("0.0.0.0", "::", ""):
        host = DEFAULT_HOST
    return f"http://{host}:{state['port']}"


def resolve_base_url(explicit: str | None = None) -> str:
    """--base-url, then TINKER_BASE_URL, then the managed server, then the default port."""
    if explicit:
        return explicit.rstrip("/")
    env = os.environ.get("TINKER_BASE_URL")
    if env:
        return env.rstrip("/")
    managed = managed_server_url()
    if managed:
        return managed
    return f"http://{DEFAULT_HOST}:{DEFAULT_PORT}"


def ensure_api_key() -> str:
    """Give the tinker client the placeholder key self-hosted servers accept."""
    key = os.environ.get("TINKER_API_KEY")
    if not key:
        os.environ["TINKER_API_KEY"] = key = PLACEHOLDER_API_KEY
    return key


def private_dir(path: Path) -> Path:
    """A folder only its owner can enter: user data and server state go there. Made 0700 whatever the umask (a
    notebook or a script calling rlcli's functions keeps its own, often 022), and tightened to 0700 where it exists
    already (an empty --log-path the user made first): what is written inside is then nobody else's, whatever its
    own mode. A link, or a folder of someone else's, is left as it is."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = path.lstat()
    if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and st.st_mode & 0o077:
        path.chmod(0o700)
    return path


def portable(text: str, root: Path | None = None) -> str:
    """text with this machine's paths made portable, for files meant to be committed or shared
    (benchmark receipts, notebook results): this interpreter becomes `python`, `root/` relative, the home
    folder `~`."""
    text = text.replace(sys.executable, "python")
    if root is not None:
        text = text.replace(str(root) + os.sep, "").replace(str(root), ".")
    home = str(Path.home())
    return text.replace(home + os.sep, "~" + os.sep) if home != os.sep else text
