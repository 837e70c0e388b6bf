"""Every place rlcli hooks into the tinker client and tinker-cookbook, and the check that they still fit.

No file of either package is changed. Each hook below replaces one attribute for the length of a
`with` block (or of one client object's life) and puts it back after; PATCHES lists them, with the
internal names of the pinned versions each one relies on. At import, `check()` resolves every one of
those names: a version that moved one stops the run with a line naming it, instead of a run whose
slots leak or whose metrics go missing without a word. tests/unit/test_hooks.py holds the pins to
pyproject.toml, so a pin bump fails there first. tinker 0.38 deprecates the `_async` methods the
recipes still call; where a hook stands in for one, it calls the method that replaces it.

- `on_training_client`: the cookbook builds its TrainingClient one of three ways (fresh LoRA, resume,
  load weights); all construct a `tinker.TrainingClient`, so __init__ is the one hook that sees each.
  It records the model for slot freeing (SkyRL's jax backend has a fixed number of LoRA slots, and the
  cookbook unloads nothing) and installs the RL loss route and step statistics.
- `replace_forward_backward`, `watch_forward_backward`: per client object, the loss route
  (rlcli.train.losses) and the step statistics (rlcli.train.stats). The cookbook's RL loop submits
  through `forward_backward_async` only.
- `quiet_rl_sampling`: the RL loop draws a tqdm bar per sampling batch; it would bury the one
  progress line per step.
- `capped_evaluation`: the RL loop's held-out evaluator (`--eval-every`) sends every problem at once, uncapped;
  inside the block main builds rlcli.problems.score's HeldOutEvaluator instead, which asks at most IN_FLIGHT at
  once, as every other scoring in rlcli does (same rollouts and metrics).
- `seeded_lora`, `seeded_sampling`: the recipes create their LoRA with no seed (SkyRL then draws one at
  random) and sample with none (the same); inside the block a LoRA gets the run's seed, and each sample
  request without one gets a seed derived from the run's seed, the sampling client's order of creation,
  the prompt's tokens and how often that prompt was asked of that client (samples of one group differ).
- `sl_checkpoints_name_the_next_batch`: the SL recipe saves at step k a state that already holds step k
  (and, pipelined, step k+1) but records batch k, so a resume redid step k on top of it. rlcli runs SL
  without submitting ahead (submit_ahead=0) and records batch k+1: the state and the record agree.
- `hosted_prompt_logprobs`: SkyRL's jax backend answers `compute_logprobs` with N-1 prompt logprobs
  (no leading None for the first token); the cookbook slices `[1:]` as for hosted Tinker, in the
  distillation loop's teacher KL, the RL loop's KL penalty and the SL recipe's test NLL
  (SamplerNLLEvaluator, from tinker-cookbook 0.5.8), so shapes disagree. Inside the block, an N-1
  answer gets its leading None back; a hosted-shape answer passes unchanged.
- `response_weights`: the RL loop strips its action mask before forward_backward (`_remove_mask`),
  and the jax backend then weighs every token 1, dividing each sequence's loss by prompt + response
  length. Inside the block the mask travels as `weights` instead (explicit weights win), for every loss.
- `failed_saves`: every checkpoint the cookbook saves goes through `checkpoint_utils.save_checkpoint_async`,
  which records it in checkpoints.jsonl only once the server confirmed it. A save the server refuses
  (its disk full, say) surfaced as a ValueError naming a request id; inside the block it ends the run
  with one line naming the save and the server's reason. So does the RL loop's save of the sampler
  weights it samples the next step from (`save_weights_and_get_sampling_client_async`).
- `exact_custom_losses`: tinker's `forward_backward_custom` (the cookbook's DPO) sends its gradient as cross_entropy
  weights, which SkyRL's jax backend divides by their per-sequence sum (x1e9 where it is negative), then reads a
  `loss:sum` metric SkyRL does not send. Inside the block it takes rlcli.train.custom_loss's route instead.
- `cookbook_logging`: the recipes log a rich table and a rendered example per step to the console;
  this keeps those in the run's logs.log, prints one line per step instead (a logger joined to the
  cookbook's MultiplexLogger), and adds rlcli's own figures to each step's metrics.jsonl row.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import logging
import re
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import tinker
from tinker_cookbook.rl import train as rl_train
from tinker_cookbook.utils import ml_log

from rlcli.errors import RlcliError
from rlcli.server.runtime import manifest
from rlcli.train import metrics as keys

# The versions the hooks were written against (pyproject.toml's specifiers) and what each hook replaces: entries of
# rlcli's one manifest of names it changes in other people's code (rlcli/server/runtime/manifest.py).
PINS = {package: manifest.PINS[package] for package in ("tinker", "tinker-cookbook")}


@dataclass(frozen=True)
class Patch:
    module: str
    name: str  # dotted inside the module
    why: str
    needs_text: tuple[str, ...] = ()  # strings the module's source must hold for the hook to work


PATCHES = tuple(Patch(e.module, e.name, e.why, tuple(e.check[1:])) for e in manifest.HOOKS)


def problems() -> list[str]:
    """What no longer fits: a patched name that is gone, or a source that lost what a hook relies on."""
    found = []
    for patch in PATCHES:
        module = importlib.import_module(patch.module)
        try:
            functools.reduce(getattr, patch.name.split("."), module)
        except AttributeError:
            found.append(f"{patch.module}.{patch.name} is gone ({patch.why})")
            continue
        source = inspect.getsource(module)
        found += [f"{patch.module} no longer holds {text!r} ({patch.why})" for text in patch.needs_text
                  if text not in source]
    return found


def version_drift() -> list[str]:
    from packaging.specifiers import SpecifierSet

    drift = []
    for package, spec in PINS.items():
        version = metadata.version(package)
        if version not in SpecifierSet(spec):
            drift.append(f"{package} {version} (rlcli's hooks are pinned to {package}{spec})")
    return drift


def check() -> None:
    if found := problems():
        raise RlcliError(f"rlcli's hooks do not fit the installed {' and '.join(version_drift()) or 'packages'}: "
                         f"{'; '.join(found)}: install the pinned versions (pip install -r env/client.lock)")
    for line in version_drift():  # every hook still fits: say so once, and go on
        print(f"rlcli: warning: {line}; every hooked name was found", file=sys.stderr)


check()


# --- the hooks ------------------------------------------------------------------------------------


@contextlib.contextmanager
def on_training_client(callback: Callable[[Any], None]) -> Iterator[None]:
    """Call callback(client) after each tinker.TrainingClient built inside the block is constructed.

    The tinker client builds them on its own event-loop thread, so callback must be thread-safe.
    Blocks nest: the innermost callback runs last.
    """
    original = tinker.TrainingClient.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        callback(self)

    tinker.TrainingClient.__init__ = init  # type: ignore[method-assign]
    try:
        yield
    finally:
        tinker.TrainingClient.__init__ = original  # type: ignore[method-assign]


def replace_forward_backward(client: Any, forward_backward: Callable[..., Any],
                             forward_backward_async: Callable[..., Any]) -> None:
    client.forward_backward = forward_backward
    client.forward_backward_async = forward_backward_async


def watch_forward_backward(client: Any, on_result: Callable[[list, Any, dict[str, float] | None], None]) -> None:
    """on_result(data, result, loss_fn_config) for every forward_backward_async result, when it is read.

    tinker deprecates forward_backward_async, which only submits through forward_backward: a loss route's own
    (an attribute of the client, whose 2-pass route awaits its forward pass) is wrapped, else forward_backward."""
    routed = vars(client).get("forward_backward_async")

    async def forward_backward_async(data, loss_fn, loss_fn_config=None):
        future = (await routed(data, loss_fn, loss_fn_config) if routed is not None
                  else client.forward_backward(data, loss_fn, loss_fn_config))
        return RecordingFuture(future, lambda result: on_result(data, result, loss_fn_config))

    client.forward_backward_async = forward_backward_async


class RecordingFuture:
    """A tinker future that hands its result to `on_result` once, the first time it is read."""

    def __init__(self, future: Any, on_result: Any):
        self._future, self._on_result = future, on_result

    def _seen(self, result: Any) -> Any:
        if self._on_result is not None:
            on_result, self._on_result = self._on_result, None
            on_result(result)
        return result

    async def result_async(self, timeout: float | None = None) -> Any:
        return self._seen(await self._future.result_async(timeout))

    def result(self, timeout: float | None = None) -> Any:
        return self._seen(self._future.result(timeout))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._future, name)


@contextlib.contextmanager
def seeded_lora(seed: int) -> Iterator[None]:
    """Inside the block, a LoRA created without a seed gets `seed` (SkyRL initialises lora_A from it)."""
    cls = tinker.ServiceClient
    original = cls._create_lora_training_client_submit

    def submit(self: Any, base_model: str, rank: int, lora_seed: int | None, *args: Any, **kwargs: Any) -> Any:
        return original(self, base_model, rank, seed if lora_seed is None else lora_seed, *args, **kwargs)

    cls._create_lora_training_client_submit = submit  # type: ignore[method-assign]
    try:
        yield
    finally:
        cls._create_lora_training_client_submit = original  # type: ignore[method-assign]


def sample_seed(seed: int, client_index: int, prompt_tokens: list[int], occurrence: int) -> int:
    """A sampling seed that depends on what is asked, not on when: the same run asks the same things."""
    import hashlib

    text = f"{seed}:{client_index}:{occurrence}:{','.join(map(str, prompt_tokens))}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big") & 0x7FFFFFFF


@contextlib.contextmanager
def seeded_sampling(seed: int, first_client: int = 0) -> Iterator[None]:
    """Inside the block, each sample request that carries no seed gets sample_seed(...) as its seed; the
    first sampling client made counts as number first_client (a resumed RL loop starts at its step)."""
    cls = tinker.SamplingClient
    original_init, original_sample = cls.__init__, cls.sample
    made = [first_client]

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        self._rlcli_index, self._rlcli_asked = made[0], {}
        made[0] += 1

    def sample(self: Any, prompt: Any, num_samples: int, sampling_params: Any, *args: Any, **kwargs: Any) -> Any:
        if sampling_params.seed is None and hasattr(self, "_rlcli_asked"):
            tokens = prompt.to_ints()
            key = hash(tuple(tokens))
            occurrence = self._rlcli_asked[key] = self._rlcli_asked.get(key, -1) + 1
            sampling_params = sampling_params.model_copy(
                update={"seed": sample_seed(seed, self._rlcli_index, tokens, occurrence)})
        return original_sample(self, prompt, num_samples, sampling_params, *args, **kwargs)

    cls.__init__, cls.sample = init, sample  # type: ignore[method-assign]
    try:
        yield
    finally:
        cls.__init__, cls.sample = original_init, original_sample  # type: ignore[method-assign]


@contextlib.contextmanager
def sl_checkpoints_name_the_next_batch() -> Iterator[None]:
    """Inside the block, a periodic save records the batch after the one it was made at (the state holds it)."""
    from tinker_cookbook.checkpoint_utils import CheckpointManager

    original = CheckpointManager.maybe_save_async

    async def maybe_save_async(self: Any, step: int, loop_state: dict[str, Any], **kwargs: Any) -> Any:
        return await original(self, step, {**loop_state, "batch": loop_state["batch"] + 1}, **kwargs)

    CheckpointManager.maybe_save_async = maybe_save_async  # type: ignore[method-assign]
    try:
        yield
    finally:
        CheckpointManager.maybe_save_async = original  # type: ignore[method-assign]


SERVER_DETAIL = re.compile(r"""'detail': ['"](.*)['"]\}""", re.DOTALL)  # the last quote before the closing brace
NO_SPACE = "No space left on device"


def server_reason(error: Exception) -> str:
    """The server's own words in a failed request (tinker wraps them in a ValueError or APIStatusError); a full
    disk in one phrase (SkyRL passes on orbax's paragraph when the training state is the part that failed)."""
    found = SERVER_DETAIL.search(str(error))
    reason = found.group(1) if found else str(getattr(error, "message", None) or error)
    return f"[Errno 28] {NO_SPACE}" if NO_SPACE in reason else reason[:300]


@contextlib.contextmanager
def failed_saves(message: Callable[[str, str], str]) -> Iterator[None]:
    """Inside the block, a save the server answers with an error raises RlcliError(message(what was saved, the
    server's reason)): a checkpoint (nothing is recorded for it: the cookbook writes the record after the save),
    or the sampler weights the RL loop saves before each step to sample from (SkyRL keeps those on disk too)."""
    from tinker_cookbook import checkpoint_utils

    original, original_step = checkpoint_utils.save_checkpoint_async, \
        tinker.TrainingClient.save_weights_and_get_sampling_client_async
    signature = inspect.signature(original)

    async def refused(what: Callable[[], str], call: Any) -> Any:
        try:
            return await call
        except (ValueError, tinker.APIStatusError) as e:
            if isinstance(e, ValueError) and not str(e).startswith("Error retrieving result"):
                raise
            raise RlcliError(message(what(), server_reason(e))) from e

    async def save_checkpoint_async(*args: Any, **kwargs: Any) -> Any:
        return await refused(lambda: f"checkpoint {signature.bind(*args, **kwargs).arguments['name']}",
                             original(*args, **kwargs))

    # The recipes still call the _async method tinker deprecates; it only awaits save_weights_and_get_sampling_client.
    async def save_for_the_step(self: Any, *args: Any, **kwargs: Any) -> Any:
        return await refused(lambda: "the sampler weights to sample from",
                             self.save_weights_and_get_sampling_client(*args, **kwargs))

    checkpoint_utils.save_checkpoint_async = save_checkpoint_async
    tinker.TrainingClient.save_weights_and_get_sampling_client_async = save_for_the_step  # type: ignore[method-assign]
    try:
        yield
    finally:
        checkpoint_utils.save_checkpoint_async = original
        tinker.TrainingClient.save_weights_and_get_sampling_client_async = original_step  # type: ignore[method-assign]


@contextlib.contextmanager
def quiet_rl_sampling() -> Iterator[None]:
    original = rl_train.tqdm
    rl_train.tqdm = functools.partial(original, disable=True)
    try:
        yield
    finally:
        rl_train.tqdm = original


@contextlib.contextmanager
def capped_evaluation() -> Iterator[None]:
    from rlcli.problems.score import HeldOutEvaluator

    original = rl_train.RLTestSetEvaluator
    rl_train.RLTestSetEvaluator = HeldOutEvaluator  # type: ignore[misc]
    try:
        yield
    finally:
        rl_train.RLTestSetEvaluator = original  # type: ignore[misc]


COOKBOOK_MODULES = r"tinker_cookbook(\.|$)"  # the modules whose deprecation warnings cookbook_logging silences


@contextlib.contextmanager
def cookbook_logging(progress: Any) -> Iterator[None]:
    """Inside the block, a cookbook run's console shows warnings and `progress` lines only (not the FutureWarnings
    tinker raises at the cookbook's own calls), and each training step's metrics row gets progress.step_metrics()
    added, if it has them (one row per step).

    The recipe's setup_logging points the root logger at a coloured INFO console and the run's
    logs.log; its configure_logging_module is replaced by one that keeps the file and lowers the
    console to warnings. Root logging is restored afterwards.
    """
    root = logging.getLogger()
    saved_level, saved_handlers = root.level, root.handlers[:]
    original_setup, original_configure = ml_log.setup_logging, ml_log.configure_logging_module
    ours: list[logging.Handler] = []

    def configure_logging_module(path: str, level: int = logging.INFO) -> logging.Logger:
        file_handler = logging.FileHandler(path, mode="a", encoding="utf-8")
        file_handler.setFormatter(logging.Formatter("%(name)s:%(lineno)d [%(levelname)s] %(message)s"))
        console = logging.StreamHandler(sys.stderr)
        console.setLevel(logging.WARNING)
        console.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        ours[:] = [file_handler, console]
        root.handlers[:] = ours
        root.setLevel(level)
        return root

    def setup_logging(*args: Any, **kwargs: Any) -> Any:
        ml_logger = original_setup(*args, **kwargs)
        step_metrics = getattr(progress, "step_metrics", None)
        if step_metrics is not None:
            log_metrics = ml_logger.log_metrics

            # The recipes call it by keyword: the parameters keep ml_log's names.
            def with_step_metrics(metrics: dict[str, Any], step: int | None = None) -> None:
                if keys.BATCH in metrics:  # a training step's row (the RL recipe logs one per step)
                    metrics = {**metrics, **step_metrics()}
                log_metrics(metrics, step)

            ml_logger.log_metrics = with_step_metrics
        ml_logger.loggers.append(progress)
        return ml_logger

    ml_log.setup_logging, ml_log.configure_logging_module = setup_logging, configure_logging_module
    # A full disk fails the run with one line (rlcli.errors); logging's own report of each failed write to
    # logs.log would bury it under tracebacks.
    raise_exceptions, logging.raiseExceptions = logging.raiseExceptions, False
    try:
        with warnings.catch_warnings():
            # tinker 0.38 deprecates the `_async` methods the cookbook's recipes call (rlcli's own code calls their
            # replacements): a warning per call site the user can do nothing about, on every run's console.
            warnings.filterwarnings("ignore", category=FutureWarning, module=COOKBOOK_MODULES)
            yield
    finally:
        logging.raiseExceptions = raise_exceptions
        ml_log.setup_logging, ml_log.configure_logging_module = original_setup, original_configure
        for handler in ours:
            handler.close()
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)


@contextlib.contextmanager
def exact_custom_losses() -> Iterator[None]:
    """Inside the block, TrainingClient.forward_backward_custom applies the loss's exact gradient on SkyRL's jax
    backend (rlcli.train.custom_loss)."""
    from rlcli.train import custom_loss

    original = tinker.TrainingClient.forward_backward_custom
    tinker.TrainingClient.forward_backward_custom = custom_loss.forward_backward_custom  # type: ignore[method-assign]
    try:
        yield
    finally:
        tinker.TrainingClient.forward_backward_custom = original  # type: ignore[method-assign]


def hosted_shape(logprobs: list, length: int) -> list:
    """Prompt logprobs as hosted Tinker returns them: one per token, None for the first (no context)."""
    return [None, *logprobs] if len(logprobs) == length - 1 else list(logprobs)


@contextlib.contextmanager
def hosted_prompt_logprobs() -> Iterator[None]:
    """Inside the block, every SamplingClient.compute_logprobs_async answers in hosted Tinker's shape (the recipes
    call that method, which tinker deprecates: it only awaits compute_logprobs, which this one calls)."""
    original = tinker.SamplingClient.compute_logprobs_async

    async def compute_logprobs_async(self: Any, prompt: Any, prompt_logprobs_last_n: int | None = None) -> list:
        return hosted_shape(await self.compute_logprobs(prompt, prompt_logprobs_last_n), prompt.length)

    tinker.SamplingClient.compute_logprobs_async = compute_logprobs_async  # type: ignore[method-assign]
    try:
        yield
    finally:
        tinker.SamplingClient.compute_logprobs_async = original  # type: ignore[method-assign]


def mask_as_weights(datum: Any) -> Any:
    """The datum without the cookbook's `mask`, which becomes its `weights` unless it has some."""
    inputs = dict(datum.loss_fn_inputs)
    mask = inputs.pop("mask", None)
    if mask is not None and "weights" not in inputs:
        inputs["weights"] = tinker.TensorData.from_numpy(mask.to_numpy().astype("float32"))
    return tinker.Datum(model_input=datum.model_input, loss_fn_inputs=inputs)


@contextlib.contextmanager
def response_weights() -> Iterator[None]:
    """Inside the block, the RL loop sends its action mask as the datums' weights (see the module docstring)."""
    original = rl_train._remove_mask
    rl_train._remove_mask = mask_as_weights
    try:
        yield
    finally:
        rl_train._remove_mask = original
