"""DIR/champion: the exported champion, switched in one rename and kept equal to the ledger's alias.

Each champion is exported into DIR/champions/NNNN-FORMAT/ (its weights as `rlcli export` writes them, then
rlcli-champion.json naming them, last: a folder without it is unfinished and never pointed at), and DIR/champion
is a symbolic link to it, replaced in one rename once the ledger has recorded the alias move. A kill therefore
leaves the link on a whole export, and every loop command that changes the folder first puts the link back on
the ledger's champion and runs the hook of an alias move that a kill stopped before its hook (`sync`). A folder
made before links (a real DIR/champion) is replaced by the link at its next move.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from rlcli.loop.ledger import Champion, Ledger
from rlcli.loop.settings import LoopSettings

CHAMPION_DIR = "champion"
CHAMPIONS = "champions"  # DIR/champions/NNNN-FORMAT: the exports the link may name
CHAMPION_FILE = "rlcli-champion.json"


def export_dir(folder: Path, champ: Champion, fmt: str) -> Path:
    return folder / CHAMPIONS / f"{champ.iteration:04d}-{fmt}"


def named(path: Path) -> dict[str, Any] | None:
    """What an export's rlcli-champion.json names; None where it has none (unfinished, or no export)."""
    try:
        return json.loads((path / CHAMPION_FILE).read_text())
    except (OSError, ValueError):
        return None


def _whole(path: Path, champ: Champion, fmt: str) -> bool:
    found = named(path)
    return found is not None and found.get("sampler_path") == champ.sampler_path and found.get("format") == fmt


def export(folder: Path, champ: Champion, s: LoopSettings, url: str) -> Path:
    """The champion's weights as PEFT or merged in their own folder, rlcli-champion.json written last; for the
    base model the JSON alone. A whole export of the same weights made before (a rerun after a kill) is kept."""
    from rlcli.files import staged_file, staged_folder

    out = export_dir(folder, champ, s.export_format)
    if _whole(out, champ, s.export_format):
        return out
    if champ.is_base:
        with staged_folder(out):
            pass
    else:
        from rlcli.export import ExportOptions
        from rlcli.export import export as export_weights

        export_weights(ExportOptions(checkpoint=champ.sampler_path or "", format=s.export_format, output=str(out),
                                     force=True, base_url=url))
    with staged_file(out / CHAMPION_FILE) as f:
        f.write((json.dumps({"iteration": champ.iteration, "sampler_path": champ.sampler_path,
                             "state_path": champ.state_path, "format": s.export_format}, indent=1) + "\n").encode())
    return out


def point(folder: Path, target: Path) -> None:
    """DIR/champion -> target in one rename (a new link made beside it replaces the old one); then the exports
    nothing names any more, and what killed exports left half-made, are removed."""
    link = folder / CHAMPION_DIR
    tmp = folder / f".{CHAMPION_DIR}.{os.getpid()}.link"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target.relative_to(folder))
    if link.is_dir() and not link.is_symlink():  # the layout before links: replaced once, here
        shutil.rmtree(link)
    os.replace(tmp, link)
    for path in (folder / CHAMPIONS).iterdir():  # other champions' exports, staging folders of killed ones
        if path.name != target.name:
            shutil.rmtree(path, ignore_errors=True)
    for path in folder.glob(f".{CHAMPION_DIR}.*"):  # links of killed switches, the old layout's staging folders
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def run_hook(folder: Path, s: LoopSettings, champ: Champion) -> None:
    import subprocess

    from rlcli.errors import RlcliError

    if not s.hook:
        return
    env = dict(os.environ, RLCLI_LOOP_CHAMPION=str(folder / CHAMPION_DIR), RLCLI_LOOP_ITERATION=str(champ.iteration))
    proc = subprocess.run(s.hook, shell=True, cwd=folder, env=env)
    if proc.returncode:
        raise RlcliError(f"the hook `{s.hook}` exited {proc.returncode} for iteration {champ.iteration}: the alias "
                         "moved and the export is in place; fix the hook and rerun it by hand")


def hook(folder: Path, ledger: Ledger, s: LoopSettings, champ: Champion) -> None:
    """The user's hook, once per move of the alias: recorded (and as its iteration's hook stage after a promotion),
    so a command killed before it ran has the next one run it."""
    run_hook(folder, s, champ)
    with ledger.transaction() as db:
        ledger.hooked(db)
        n = champ.iteration
        if n and ledger.stage(n, "promote") is not None and ledger.stage(n, "hook") is None:
            ledger.done(db, n, "hook", {"command": s.hook})


def sync(folder: Path, ledger: Ledger, s: LoopSettings, url: str) -> None:
    """Before a command changes the folder: the link back on the ledger's champion (a kill after the ledger moved
    the alias, before the link followed) and the hook of a move a kill stopped before its hook."""
    if not ledger.aliases():
        return
    champ = ledger.champion()
    link = folder / CHAMPION_DIR
    if (named(link) or {}).get("sampler_path", "") != champ.sampler_path or not link.exists():
        point(folder, export(folder, champ, s, url))
        print(f"rlcli loop: {CHAMPION_DIR}/ put back on the ledger's champion, {champ.label()}", file=sys.stderr,
              flush=True)
    if not ledger.is_hooked():
        hook(folder, ledger, s, champ)
