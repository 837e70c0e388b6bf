"""rlcli/lean_imports.py: a client process loads a tokenizer without transformers' generation code, and
everything transformers answers is what stock transformers answers.

The source check runs in the fast tier: it reads the client venv's pinned auto_factory, so a transformers
upgrade that moves the import fails here first. The comparison starts two fresh processes (rlcli's finder and
RLCLI_STOCK_IMPORTS=1) and takes seconds, so it is marked slow.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlcli import lean_imports
from tests.conftest import REPO

MODEL = REPO / "rlcli" / "assets" / "rlcli-tiny-qwen3-v1"


def auto_factory_source() -> str:
    spec = importlib.util.find_spec("transformers")
    assert spec is not None and spec.origin is not None
    return (Path(spec.origin).parent / "models" / "auto" / "auto_factory.py").read_text()


def test_the_pinned_auto_factory_reads_as_the_stand_in_needs():
    assert lean_imports.applies(auto_factory_source())


@pytest.mark.parametrize("change", ["import twice", "used at module level", "used in another function",
                                    "no such function"])
def test_another_auto_factory_is_left_alone(change):
    source = auto_factory_source()
    edited = {
        "import twice": source + "\nfrom ...generation import GenerationMixin\n",
        "used at module level": source + "\nMIXINS = [GenerationMixin]\n",
        "used in another function": source + "\ndef other(cls):\n    return issubclass(cls, GenerationMixin)\n",
        "no such function": source.replace(f"def {lean_imports.WRAPPED}(", "def renamed("),
    }[change]
    assert not lean_imports.applies(edited)


# Run in a fresh process: whether rlcli's finder is used, what transformers loaded, and what it answers.
PROBE = r"""
import json, sys
import rlcli  # installs the finder
from tinker_cookbook import renderers
from tinker_cookbook.tokenizer_utils import get_tokenizer
tokenizer = get_tokenizer(sys.argv[1])
loaded = {m: m in sys.modules for m in ("transformers.generation.utils", "torch._dynamo", "accelerate")}
texts = ["Hello there", "What is 3 + 4?<|im_end|>", " spaces  and\ttabs\n", "ünïcödé 🙂", "<|im_start|>user"]
ids = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
renderer = renderers.get_renderer("qwen3_disable_thinking", tokenizer)
prompt = renderer.build_generation_prompt([{"role": "user", "content": "What is 2 + 2?"}]).to_ints()
from transformers import PreTrainedModel, PretrainedConfig
from transformers.generation import GenerationMixin
from transformers.models.auto import auto_factory
class Remote(PreTrainedModel):  # a remote-code model class that defines its own generate
    config_class = PretrainedConfig
    def generate(self): return None
given = auto_factory.add_generation_mixin_to_remote_model(Remote)
print(json.dumps({"loaded": loaded, "ids": ids, "prompt": prompt, "vocab": len(tokenizer),
                  "mixin_is_real": auto_factory.GenerationMixin is GenerationMixin,
                  "remote_mro": [c.__name__ for c in given.__mro__],
                  "finder": [type(f).__name__ for f in sys.meta_path].count("_Finder")}))
"""


# The other route into auto_factory: peft first (as `rlcli export` imports it), before transformers' config
# module, then a model class and its weights.
MODEL_PROBE = r"""
import json, sys
import rlcli
import peft
import torch
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(sys.argv[1])
with torch.no_grad():
    logits = model(torch.tensor([[1, 2, 3, 4, 5]])).logits
print(json.dumps({"logits": logits[0, -1, :8].tolist(), "generates": hasattr(model, "generate"),
                  "mro": [c.__name__ for c in type(model).__mro__]}))
"""


def probe(stock: bool, code: str = PROBE) -> dict:
    """The code in a fresh process; `stock`: with rlcli's finder taken out again right after `import rlcli`."""
    if stock:
        code = code.replace("import rlcli\n", "import rlcli\nrlcli.lean_imports.uninstall()\n", 1)
        code = code.replace("import rlcli  # installs the finder\n",
                            "import rlcli\nrlcli.lean_imports.uninstall()\n", 1)
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-c", code, str(MODEL)], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_tokenizer_without_generation_code_answers_as_stock():
    lean, stock = probe(stock=False), probe(stock=True)
    assert lean["loaded"] == {"transformers.generation.utils": False, "torch._dynamo": False, "accelerate": False}
    assert stock["loaded"]["transformers.generation.utils"] and stock["loaded"]["torch._dynamo"]
    for key in ("ids", "prompt", "vocab", "remote_mro"):
        assert lean[key] == stock[key], key
    assert "GenerationMixin" in lean["remote_mro"]  # the wrapped function still gives a remote class generation
    assert lean["mixin_is_real"] and stock["mixin_is_real"]
    assert lean["finder"] == 0  # used once, then gone from sys.meta_path


@pytest.mark.slow
def test_peft_and_a_model_class_import_first_and_answer_as_stock():
    """auto_factory reached from peft, before transformers' config module: generation's submodules still
    import (a stand-in package here broke `rlcli export`), and the model is the stock one."""
    lean, stock = probe(stock=False, code=MODEL_PROBE), probe(stock=True, code=MODEL_PROBE)
    assert lean == stock and lean["generates"] and "GenerationMixin" in lean["mro"]
