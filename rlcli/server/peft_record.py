"""Run by the server venv's Python at install (stdlib and the venv's real peft): record the adapter_config.json
peft's LoraConfig writes, which the torch-free jax engine's stand-in for peft writes from the record
(runtime/rlcli_no_torch.py), checked here to reproduce peft's text byte for byte.

`python peft_record.py PATH` (server_venv.write_peft_record); SystemExit with one line where it cannot. Its
functions import the runtime folder's rlcli_no_torch: run as a script, or with that folder on sys.path.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

# Two sets of inputs for the record's checks: different in every input, with a quote, a non-ASCII letter and a
# float alpha (SkyRL passes its LoraConfig.alpha as given).
SAMPLES = ({"base_model_name_or_path": "Qwen/Qwen3-0.6B", "r": 8, "lora_alpha": 16},
           {"base_model_name_or_path": 'models/"d\u00e9j\u00e0"/m', "r": 32, "lora_alpha": 64.5})


def peft_text(values: dict) -> str:
    """What the real peft writes for these inputs (this process imports peft)."""
    import peft
    import rlcli_no_torch as lean

    with tempfile.TemporaryDirectory() as folder:
        peft.LoraConfig(**values).save_pretrained(folder)
        return (Path(folder) / lean.CONFIG_FILE).read_text()


def make_record() -> dict:
    """The record, from the real peft; SystemExit with one line where its premises do not hold."""
    import rlcli_no_torch as lean  # the engine's side of the record: its reader and renderer

    texts = [peft_text(values) for values in SAMPLES]
    first, second = (json.loads(text) for text in texts)
    varying = {key for key in first.keys() | second.keys() if first.get(key) != second.get(key)}
    if varying != set(lean.INPUTS):
        raise SystemExit(f"{lean.NAME}: peft's adapter config varies in {sorted(varying)}, not just "
                         f"{list(lean.INPUTS)}: the record would not reproduce it")
    record = {"peft": lean._version("peft"), "transformers": lean._version("transformers"), "config": first,
              "made_by": lean.NAME}
    for values, text in zip(SAMPLES, texts, strict=True):
        if lean.render(record, values) != text:
            raise SystemExit(f"{lean.NAME}: the record does not reproduce peft's text for {values}")
    return record


def main(path: Path) -> None:
    import rlcli_no_torch as lean

    record = make_record()
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    os.replace(partial, path)
    print(f"{lean.NAME}: recorded peft {record['peft']}'s LoraConfig in {path}")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent / "runtime"))
    main(Path(sys.argv[1]))
