"""In-process shims between tinker-cookbook's recipes and a self-hosted SkyRL server.

No file of the cookbook or of tinker is changed; each shim wraps one attribute for the length of a
`with` block and puts it back after:

- `record_training_clients`: the cookbook never unloads the LoRA it trains, and SkyRL's jax backend
  has a fixed number of adapter slots, so rlcli records every training client the recipe creates
  (fresh, resumed or loaded: all construct a `tinker.TrainingClient`) and unloads them afterwards.
- `progress_logging`: the cookbook logs a rich table and a rendered example per step to the console;
  this keeps those in the run's logs.log and prints one dense line per step instead.
- `unload_models`: the tinker 0.25 client has no call for POST /api/v1/unload_model.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
import urllib.error
from collections.abc import Callable, Iterator
from typing import Any, TextIO

from rlcli.client import request_json


@contextlib.contextmanager
def record_training_clients(on_create: Callable[[str], None]) -> Iterator[None]:
    """Call on_create(model_id) for each tinker.TrainingClient built inside the block.

    The tinker client builds them on its own event-loop thread, so on_create must be thread-safe.
    """
    import tinker

    original = tinker.TrainingClient.__init__

    def recording_init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        on_create(str(self.model_id))

    tinker.TrainingClient.__init__ = recording_init  # type: ignore[method-assign]
    try:
        yield
    finally:
        tinker.TrainingClient.__init__ = original  # type: ignore[method-assign]


class ProgressLine:
    """A cookbook metrics logger that writes one line per step: step, loss, lr, tokens/s, test NLL.

    Duck-typed to tinker_cookbook.utils.ml_log.Logger so this module imports nothing heavy.
    Tokens/s is measured between consecutive steps (the cookbook pipelines requests, so its own
    per-step timings overlap); the first step's figure includes the server's compile.
    """

    def __init__(self, total_steps: int, stream: TextIO | None = None):
        self.total_steps = total_steps
        self.stream = stream or sys.stderr
        self._last = time.monotonic()

    def log_hparams(self, config: Any) -> None:
        pass

    def get_logger_url(self) -> str | None:
        return None

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        if step is None or "train_mean_nll" not in metrics:
            return
        now = time.monotonic()
        elapsed, self._last = now - self._last, now
        print(format_progress(metrics, step, self.total_steps, elapsed), file=self.stream, flush=True)


def format_progress(metrics: dict[str, Any], step: int, total_steps: int, elapsed_s: float) -> str:
    tokens = metrics.get("num_tokens", 0)
    parts = [
        f"step {step + 1}/{total_steps}",
        f"epoch {metrics.get('epoch', 0)}",
        f"loss {metrics['train_mean_nll']:.4f}",
        f"lr {metrics.get('learning_rate', 0.0):.2e}",
        f"{tokens / max(elapsed_s, 1e-9):,.0f} tok/s",
        f"{elapsed_s:.2f}s",
    ]
    if "test/nll" in metrics:
        parts.append(f"test_nll {metrics['test/nll']:.4f}")
    return "  ".join(parts)


@contextlib.contextmanager
def progress_logging(progress: ProgressLine) -> Iterator[None]:
    """Inside the block, a cookbook run's console shows warnings and `progress` lines only.

    The recipe's setup_logging points the root logger at a coloured INFO console and the run's
    logs.log; its configure_logging_module is replaced by one that keeps the file and lowers the
    console to warnings, and `progress` joins the loggers metrics fan out to. Root logging is
    restored afterwards.
    """
    from tinker_cookbook.utils import ml_log

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
        ml_logger.loggers.append(progress)
        return ml_logger

    ml_log.setup_logging, ml_log.configure_logging_module = setup_logging, configure_logging_module
    try:
        yield
    finally:
        ml_log.setup_logging, ml_log.configure_logging_module = original_setup, original_configure
        for handler in ours:
            handler.close()
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)


def unload_models(base_url: str, model_ids: list[str], wait_s: float = 30.0) -> list[str]:
    """Free the server's LoRA slots of these models; return the ids that could not be unloaded.

    A model the server no longer knows (404) or has already unloaded counts as freed. Waits for
    each unload to finish so the next run on the same server finds the slot free.
    """
    failed = []
    for model_id in model_ids:
        try:
            queued = request_json(f"{base_url}/api/v1/unload_model", {"model_id": model_id}, timeout=10)
            request_json(f"{base_url}/api/v1/retrieve_future", {"request_id": queued["request_id"]},
                         timeout=wait_s)
        except urllib.error.HTTPError as e:
            if e.code != 404:
                failed.append(model_id)
        except (OSError, ValueError, KeyError):
            failed.append(model_id)
    return failed
