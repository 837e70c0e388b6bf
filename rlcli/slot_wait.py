"""A model made from a saved training state when the server may have no free LoRA slot (docs/decisions.md, "A
reload that finds every LoRA slot taken waits for one, or says so in one line").

tinker 0.38's create_training_client_from_state files two requests at once: the model's creation, then the load of
the state into it, and waits only on the load. When every slot is taken the creation fails ("Maximum number of LoRA
adapters", with rlcli's hint on an rlcli server) and the load then finds no such model: SkyRL answers it "Model
<id> not loaded (likely stale request from previous server)", which names neither the cause nor the fix. A server
with rlcli's extensions answers the load with the creation's own reason (runtime/rlcli_engine.py); a stock one does
not, so here a "not loaded" for the model this very call creates counts as a refused slot too (nothing else can
have unloaded a model nobody has used yet).

Callers that are not urgent (the loop's evaluation, a judge, the endpoint's reload) wait for a slot, asking again
every POLL_S: a slot frees when a training run ends. A person at `rlcli sample` / `chat` is told at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rlcli.errors import RlcliError
from rlcli.server.runtime.shared import NO_FREE_SLOT, NOT_LOADED

BACKGROUND_WAIT_S = 600.0  # the loop's evaluation and a judge: minutes are fine, a run's end frees a slot
ENDPOINT_WAIT_S = 60.0  # a chat request is waiting: a minute, then 503 with the reason
POLL_S = 5.0  # each try files a create and a load on the server: a few a minute are enough


class NoFreeSlot(RlcliError):
    """Every LoRA slot of the server stayed taken for as long as the caller could wait."""


def slot_refused(e: BaseException) -> bool:
    """Whether a failed create_training_client_from_state means the server had no free slot for the new model."""
    text = str(e)
    return NO_FREE_SLOT in text or NOT_LOADED in text


def no_free_slot(base_url: str, waited_s: float) -> str:
    waited = f" (waited {waited_s:.0f} s for a run to end)" if waited_s > 0 else ""
    return (f"every LoRA slot of the server at {base_url} is in use{waited}: run fewer trainers, loops or "
            "endpoints on it at once, or restart it with more slots (`rlcli serve start --slots N`)")


def load_state(service: Any, state: str, base_url: str, wait_s: float, poll_s: float = POLL_S,
               clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> Any:
    """service.create_training_client_from_state(state), asked again while the server has no free slot, for up to
    wait_s (0: once); NoFreeSlot when none freed. Any other failure is raised as it came."""
    start = clock()
    while True:
        try:
            return service.create_training_client_from_state(state).result()
        except Exception as e:  # tinker raises its own classes; the server's reason is in the message
            if not slot_refused(e):
                raise
            waited = clock() - start
            if waited + poll_s > wait_s:
                raise NoFreeSlot(no_free_slot(base_url, waited)) from None
        sleep(poll_s)
