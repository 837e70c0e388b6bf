"""rlcli's engine: SkyRL's TinkerEngine with rlcli's changes as methods (method resolution order is the order they
apply in), and the backend table that hands out rlcli's backend classes. Every override is in manifest.py; why:
docs/upstream/ and docs/decisions.md.
"""

import os
import sys
from pathlib import Path

import rlcli_futures as futures
import rlcli_memory as memory
import rlcli_samplers as samplers
import rlcli_wake as wake
import rlcli_warmup as warmup
from rlcli_tenants import fair_pick
from shared import OWNERS_FILE
from skyrl.tinker import engine as stock
from skyrl.tinker import types
from skyrl.tinker.db_models import FutureDB, ModelDB, RequestStatus
from sqlmodel import Session, select, update
from tenant_owners import ModelTenants

KIND = types.RequestType
SINGLE_KINDS = set(KIND) - {KIND.FORWARD_BACKWARD, KIND.FORWARD, KIND.SAMPLE, KIND.EXTERNAL}  # find_single_requests
BARRIER_KINDS = {KIND.OPTIM_STEP, KIND.LOAD_WEIGHTS}  # what _find_destructive_barriers reads
PENDING_KINDS = select(FutureDB.request_type).where(FutureDB.status == RequestStatus.PENDING).distinct()
STILL_PENDING = select(FutureDB.request_id).where(FutureDB.status == RequestStatus.PENDING).limit(1)
REFUSALS_KEPT = 64  # failed creations whose reason a following load gets


class RlcliEngine(stock.TinkerEngine):
    """The engine of `rlcli serve start` (without --no-extensions)."""

    def __init__(self, config):
        self.bell, self.pending = wake.EngineBell(os.environ[wake.ENV_ID]), None  # pending: the types one look found
        self.refused_creates: dict[str, str] = {}  # model id -> why its creation failed
        super().__init__(config)
        self.pruner = futures.Pruner(self.db_engine, futures.retention_minutes())
        self.trimmer = memory.Trimmer()
        if hasattr(self.backend, "snapshots"):
            try:
                if deleted := samplers.sweep(self):
                    samplers.log(f"deleted {deleted} unnamed sampler snapshots an earlier server left")
            except Exception as e:  # housekeeping: the server serves without it
                samplers.log(f"could not look for unnamed sampler snapshots an earlier server left: {e}")

    def run(self):
        if hasattr(self.backend, "shapes"):  # not on Ray: the actors run the passes
            warmup.replay(self.backend)
        return super().run()

    def process_pending_requests(self):
        """Wait for the API's ring instead of sleeping 100 ms between looks (docs/upstream/polling-sleeps.md)."""
        wake.log("the engine waits for the API's ring instead of sleeping 100 ms between looks; each look asks for "
                 "the pending request types first")
        self.bell.ring(wake.ENGINE_HELLO)
        while True:
            self.bell.drain()
            before = self.bell.completed
            self.process_pending_requests_once()
            self.pruner.maybe()
            self.trimmer.maybe()
            if self.bell.owed:
                self.bell.look_ring()
            if self.bell.completed != before:
                # SkyRL leaves some requests for a later look (a forward_backward behind its model's optim_step) and
                # their rings were drained above: one indexed query says whether to look again now.
                with Session(self.db_engine) as session:
                    if session.exec(STILL_PENDING).first() is not None:
                        continue
            self.bell.wait(wake.OWED_RETRY_S if self.bell.owed else wake.ENGINE_SAFETY_S)

    def _complete_futures(self, results):
        """Ring the API with small results before committing them: the commit is off the request's path."""
        rows = wake.result_rows(results)
        rung = bool(rows) and self.bell.results(rows)
        if rows:
            wake.write_rows(self.db_engine, rows)
        self.bell.completed += 1
        if not rung:  # too big for a ring, or the API's socket was full: it reads them from the database
            self.bell.look_ring()

    def process_pending_requests_once(self):
        """Each look first reads which request types are pending, in one query; finders of other types return
        nothing without querying (docs/decisions.md, "Each engine look asks for the pending request types first")."""
        with Session(self.db_engine) as session:
            self.pending = {KIND(k) for k in session.exec(PENDING_KINDS).all()}
        try:
            super().process_pending_requests_once()
        finally:
            self.pending = None
        samplers.drop_rows(self)  # snapshots of models a timed-out session left

    def _none_pending(self, kinds: set) -> bool:
        return self.pending is not None and not self.pending & kinds

    def find_batchable_model_passes(self, session, request_type):
        return {} if self._none_pending({request_type}) else super().find_batchable_model_passes(session, request_type)

    def find_batchable_sample(self, session):
        return {} if self._none_pending({KIND.SAMPLE}) else super().find_batchable_sample(session)

    def find_single_requests(self, session):
        return {} if self._none_pending(SINGLE_KINDS) else super().find_single_requests(session)

    def _find_destructive_barriers(self, session):
        return {} if self._none_pending(BARRIER_KINDS) else super()._find_destructive_barriers(session)

    def _filter_valid_requests(self, requests):
        errors, valid = super()._filter_valid_requests(requests)
        samplers.refuse_deleted(self.backend, errors, valid)
        return errors, valid

    def process_single_request(self, request_type, model_id, request_data):
        refused = self.refused_creates.pop(model_id, None) if request_type == KIND.LOAD_WEIGHTS else None
        if refused is not None and not self.backend.has_model(model_id):
            # tinker 0.38 files a model's creation and its load together (rlcli_sdk.create_by_load): the load of a
            # model whose creation failed says why, not SkyRL's "not loaded (likely stale request ...)".
            return types.ErrorResponse(error=f"model {model_id} could not be created: {refused}", status="failed")
        try:
            return super().process_single_request(request_type, model_id, request_data)
        except Exception as e:
            if request_type == KIND.CREATE_MODEL:
                self._refused(model_id, str(e))
            raise
        finally:
            samplers.drop_rows(self)  # before the future completes: a listing after it omits them

    def _refused(self, model_id: str, reason: str) -> None:
        """Keep why a model's creation failed, for its load; the oldest go (a plain create has no load to follow).
        Its row says "unloaded", as it holds no slot: SkyRL leaves it "created", and a tenant's quota counts those."""
        self.refused_creates[model_id] = reason
        while len(self.refused_creates) > REFUSALS_KEPT:
            del self.refused_creates[next(iter(self.refused_creates))]
        with Session(self.db_engine) as session:
            session.exec(update(ModelDB).where(ModelDB.model_id == model_id).values(status="unloaded"))
            session.commit()


class FairEngine(stock.TinkerEngine):
    """--tenants: each pass takes pending work round-robin between tenants (rlcli_tenants.fair_pick). The finders
    hand their candidates, in id order, to _load_requests before reading their payloads: the choice is made there."""

    def __init__(self, config):
        self.tenant_of = ModelTenants(Path.cwd() / OWNERS_FILE)
        self.served: dict[str, dict] = {"passes": {}, "single": {}}
        self.finding, self.later = None, {}  # the finder running now; model -> first request deferred this pass
        super().__init__(config)
        print("[rlcli tenants] the engine takes pending work round-robin between tenants, at most one request of "
              "each per pass while others wait", file=sys.stderr, flush=True)

    def process_pending_requests_once(self):
        self.later = {}
        return super().process_pending_requests_once()

    def find_batchable_model_passes(self, session, request_type):
        return self._finding("passes", super().find_batchable_model_passes, session, request_type)

    def find_single_requests(self, session):
        return self._finding("single", super().find_single_requests, session)

    def _finding(self, kind: str, finder, *args):
        self.finding = kind
        try:
            return finder(*args)
        finally:
            self.finding = None

    def _load_requests(self, session, requests):
        if self.finding is None:
            return super()._load_requests(session, requests)
        if self.finding == "single" and self.later:  # never ahead of a deferred pass of the same model
            requests = [r for r in requests if r[1] not in self.later or r[0] < self.later[r[1]]]
        self.tenant_of.refresh()
        chosen, deferred = fair_pick(list(requests), self.tenant_of, self.served[self.finding])
        for model_id, request_id in deferred.items():
            self.later[model_id] = min(self.later.get(model_id, request_id), request_id)
        return super()._load_requests(session, chosen)


class TenantsEngine(FairEngine, RlcliEngine):
    """--tenants with rlcli's changes: the round-robin chooses among what each look's finders find."""


def engine_class(rlcli: bool, tenants: bool) -> type:
    return {(True, True): TenantsEngine, (True, False): RlcliEngine, (False, True): FairEngine}.get(
        (rlcli, tenants), stock.TinkerEngine)


def use_rlcli_backends(rlcli: bool) -> None:
    """SkyRL's backend table (a module function TinkerEngine.__init__ calls) hands out rlcli's jax classes."""
    table = stock.get_backend_classes

    def get_backend_classes(backend_name: str, use_ray: bool = False):
        backend_class, config_class = table(backend_name, use_ray)
        if backend_name == "jax" and use_ray and rlcli:
            import ray_actors

            return ray_actors.backend_class(backend_class), config_class
        if backend_name == "jax" and not use_ray:
            import rlcli_backend

            return (rlcli_backend.RlcliJaxBackend if rlcli else rlcli_backend.MeshJaxBackend), config_class
        return backend_class, config_class

    stock.get_backend_classes = get_backend_classes
