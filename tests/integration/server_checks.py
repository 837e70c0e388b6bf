"""Behavioural checks of rlcli's changes to SkyRL, run INSIDE the server venv by tests/integration/test_shims.py.

Not a pytest module (the server venv has neither rlcli nor pytest): each `check_*` function returns one line saying
what it verified, or raises. The runtime folder is first on sys.path, as in the server's own processes.
"""

import sys
from pathlib import Path

import rlcli_lora
import rlcli_wake as wake

RUNTIME = Path(sys.path[0])


def check_lazy_torch() -> str:
    """First in a fresh process: SkyRL's API imports without loading torch, the renderer uses torch only inside
    functions, and torch loads on first use."""
    import ast

    import rlcli_lazy_torch as lazy

    assert lazy.defer(), "torch was imported before this check, or is not installed"
    import skyrl.tinker.api  # noqa: F401  (what the API process imports)

    renderer = sys.modules.get("skyrl.backends.renderer")
    assert renderer and "skyrl.tinker.extra.external_inference" in sys.modules, "the API no longer imports it"
    assert not lazy.loaded(), "importing SkyRL's API used torch at import time; the lazy import gains nothing"
    tree = ast.parse(Path(renderer.__file__).read_text())
    top = [node for node in tree.body if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    uses = [n for stmt in top for n in ast.walk(stmt) if isinstance(n, ast.Name) and n.id == "torch"]
    assert not uses, f"renderer.py uses torch at module level (line {uses[0].lineno})"
    import torch

    assert torch.zeros(2).sum().item() == 0.0 and lazy.loaded(), "torch did not load on first use"
    return "SkyRL's API imports without loading torch; torch loads on first use"


def check_manifest() -> str:
    """The pinned versions, every target of every process (Ray's where Ray is installed), and every method of rlcli's
    engine and backend classes that overrides SkyRL's is in the manifest, and nothing else is listed as one."""
    import importlib.util

    import manifest
    import rlcli_backend
    import rlcli_engine
    from skyrl.backends import jax as jax_backend
    from skyrl.tinker import engine

    where = {manifest.API, manifest.ENGINE, manifest.JAX, manifest.WORKER}
    classes = [rlcli_engine.RlcliEngine, rlcli_engine.FairEngine, rlcli_backend.MeshJaxImpl,
               rlcli_backend.RlcliJaxImpl, rlcli_backend.MeshJaxBackend, rlcli_backend.RlcliJaxBackend]
    stock = [engine.TinkerEngine, jax_backend.JaxBackend, jax_backend.JaxBackendImpl]
    if importlib.util.find_spec("ray"):
        import ray_actors
        from skyrl.backends import ray_jax

        where.add(manifest.RAY)
        classes.append(ray_actors.backend_class(ray_jax.RayJaxBackend))
        stock.append(ray_jax.RayJaxBackend)
    assert not manifest.version_drift() and not manifest.problems(where), (manifest.version_drift(),
                                                                           manifest.problems(where))
    overrides = set()
    for cls in classes:
        base = next(c for c in cls.__mro__ if c in stock)
        overrides |= {f"{base.__module__}:{base.__qualname__}.{name}" for name, value in vars(cls).items()
                      if callable(value) and hasattr(base, name) and name not in ("__init_subclass__",)}
    listed = {e.target for e in manifest.ENTRIES if e.kind == manifest.OVERRIDE}
    assert overrides == listed, (sorted(overrides - listed), sorted(listed - overrides))
    assert rlcli_engine.TenantsEngine.__mro__[1:4] == (rlcli_engine.FairEngine, rlcli_engine.RlcliEngine,
                                                       engine.TinkerEngine)
    return f"skyrl and jax as pinned; {len(manifest.ENTRIES)} entries resolve; {len(overrides)} overrides listed"


def check_engine_command() -> str:
    """The API starts its engine through this venv's Python and rlcli's launcher, not `uv run`."""
    import launcher
    from skyrl.tinker.config import EngineConfig

    command = launcher._engine_command(None)(["anything"], EngineConfig(base_model="m", backend="jax"))
    assert command[0] == sys.executable and command[1].endswith("launcher.py") and command[2] == "engine", command
    assert "--base-model" in command and "uv" not in command, command
    return "the engine command runs rlcli's launcher with this venv's Python"


def check_submit() -> str:
    """one_statement_submit against SkyRL's create_future on a scratch sqlite database: for a new request, an SDK
    retry, a reused seq_id, requests without seq_id and a write staged before a retry, both must give the same
    outcome and leave the same rows (ids and times aside)."""
    import asyncio
    import tempfile

    from skyrl.tinker import api, types
    from skyrl.tinker.db_models import ModelDB, SQLModel
    from sqlalchemy.ext.asyncio import create_async_engine

    fast = wake.one_statement_submit(api)
    adam = types.AdamParams(learning_rate=1e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.0)
    step, other = types.OptimStepInput(adam_params=adam), types.OptimStepInput(adam_params=adam.model_copy(
        update={"learning_rate": 2e-3}))
    optim = types.RequestType.OPTIM_STEP

    async def file(engine, create, model, data, seq, stage=None):
        async with api.AsyncSession(engine) as session:
            if stage is not None:
                session.add(stage)
            try:
                request_id = await create(session, optim, model, data, seq)
            except api.HTTPException as e:
                await session.commit()
                return f"HTTP {e.status_code}"
            await session.commit()
            return request_id

    async def run(create, folder):
        engine = create_async_engine(f"sqlite+aiosqlite:///{folder}/db.sqlite")
        async with engine.begin() as connection:
            await connection.run_sync(SQLModel.metadata.create_all)
        first = await file(engine, create, "m", step, 1)
        outcomes = [first == 1,
                    await file(engine, create, "m", step, 1) == first,  # an SDK retry: the same future
                    await file(engine, create, "m", other, 1),  # the same seq_id, other data: refused
                    await file(engine, create, "m2", step, 1),  # another model's seq_id 1 is its own
                    await file(engine, create, "m", step, None), await file(engine, create, "m", step, None),
                    await file(engine, create, "m", step, 1, stage=ModelDB(
                        model_id="staged", base_model="b", lora_config={}, status="ready", request_id=0,
                        session_id="s"))]
        async with api.AsyncSession(engine) as session:
            futures = (await session.exec(api.select(api.FutureDB).order_by(api.FutureDB.request_id))).all()
            rows = [(f.request_id, f.request_type, f.model_id, f.seq_id, f.request_data, f.status, f.result_data)
                    for f in futures]
            staged = (await session.exec(api.select(ModelDB.model_id))).all()
        await engine.dispose()
        return outcomes, rows, staged

    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        expected, got = asyncio.run(run(api.create_future, a)), asyncio.run(run(fast, b))
    if got != expected:
        raise SystemExit(f"one_statement_submit differs from SkyRL's create_future:\n"
                         f"  stock {expected}\n  rlcli {got}")
    if expected[0][2] != "HTTP 409" or expected[2] != ["staged"]:
        raise SystemExit(f"SkyRL's create_future changed its outcomes: {expected}")
    return "submit in one statement matches SkyRL's create_future (new, retry, 409, no seq_id, staged write)"


def check_look() -> str:
    """RlcliEngine's looks against SkyRL's finders on scratch sqlite databases: for queues holding nothing, one type,
    passes behind a barrier, samples, single requests and a mix, every finder must find inside a look what stock
    does, and the one query must name exactly the pending types; with --tenants (one tenant) the same again."""
    import os
    import secrets
    import tempfile
    import types as pytypes

    import rlcli_engine
    from skyrl.tinker import types
    from skyrl.tinker.db_models import FutureDB, RequestStatus, SQLModel
    from skyrl.tinker.engine import TinkerEngine
    from sqlalchemy import event
    from sqlmodel import Session, create_engine

    kind = types.RequestType
    tensor = {"data": [1.0, 1.0]}
    datum = {"model_input": {"chunks": [{"type": "encoded_text", "tokens": [1, 2]}]},
             "loss_fn_inputs": {"target_tokens": {"data": [2, 3]}, "weights": tensor, "advantages": tensor,
                                "logprobs": tensor}}
    passes = types.ForwardBackwardInput.model_validate({"data": [datum], "loss_fn": "cross_entropy"})
    sample = types.SampleInput.model_validate({
        "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1]}]}, "num_samples": 1, "checkpoint_id": "",
        "prompt_logprobs": False, "sampling_params": {"temperature": 1.0, "max_tokens": 2, "seed": 0}})
    adam = {"learning_rate": 1e-3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.0}
    data = {kind.FORWARD_BACKWARD: passes.model_dump(mode="json"), kind.FORWARD: passes.model_dump(mode="json"),
            kind.SAMPLE: sample.model_dump(mode="json"), kind.OPTIM_STEP: {"adam_params": adam},
            kind.SAVE_WEIGHTS: {"path": "p"}, kind.EXTERNAL: {},
            kind.LOAD_WEIGHTS: {"source_model_id": "m", "checkpoint_id": "c", "load_optimizer": False}}
    queues = [[], [kind.FORWARD], [kind.FORWARD_BACKWARD, kind.FORWARD_BACKWARD],
              [kind.FORWARD_BACKWARD, kind.OPTIM_STEP, kind.FORWARD_BACKWARD], [kind.SAMPLE, kind.SAMPLE],
              [kind.OPTIM_STEP], [kind.EXTERNAL, kind.FORWARD], [kind.SAVE_WEIGHTS, kind.SAMPLE],
              [kind.FORWARD, kind.OPTIM_STEP, kind.FORWARD, kind.SAMPLE, kind.SAVE_WEIGHTS, kind.FORWARD_BACKWARD],
              [kind.FORWARD, kind.LOAD_WEIGHTS, kind.FORWARD, kind.FORWARD_BACKWARD, kind.FORWARD],
              [kind.SAVE_WEIGHTS, kind.FORWARD_BACKWARD, kind.SAVE_WEIGHTS, kind.OPTIM_STEP, kind.FORWARD_BACKWARD]]

    os.environ[wake.ENV_ID] = secrets.token_hex(8)  # RlcliEngine's bell: the API's wake id, here one of no API

    class Collect(TinkerEngine):  # the finders' own code on a scratch database, without a backend
        def __init__(self, db_engine):
            self.db_engine, self._sampler, self.pending, self.bell = db_engine, None, None, None
            self.config = pytypes.SimpleNamespace(backend="jax")
            self.backend = pytypes.SimpleNamespace(config=pytypes.SimpleNamespace(sample_max_num_sequences=0))
            self.found = {}
            self.tenant_of, self.served = lambda model_id: "one tenant", {"passes": {}, "single": {}}
            self.finding, self.later = None, {}
            self.tenant_of.refresh = lambda: None

        def process_pending_requests_once(self):  # what a look asks, in SkyRL's order
            with Session(self.db_engine) as session:
                self.found = {"passes": self.find_batchable_model_passes(session, kind.FORWARD_BACKWARD),
                              "forward": self.find_batchable_model_passes(session, kind.FORWARD),
                              "samples": self.find_batchable_sample(session),
                              "singles": self.find_single_requests(session),
                              "barriers": self._find_destructive_barriers(session),
                              "kinds": sorted(self.pending or ())}

    class Fast(rlcli_engine.RlcliEngine, Collect):
        pass

    class Fair(rlcli_engine.FairEngine, rlcli_engine.RlcliEngine, Collect):  # as TenantsEngine, one tenant
        pass

    def looks(folder: str, probe_class) -> tuple[list, list]:
        outcomes, statements = [], []
        for n, queue in enumerate(queues):
            db = create_engine(f"sqlite:///{folder}/db{n}.sqlite")
            SQLModel.metadata.create_all(db)
            with Session(db) as session:
                for i, k in enumerate(queue):
                    session.add(FutureDB(request_type=k, model_id="m" if i % 2 else "n", request_data=data[k],
                                         status=RequestStatus.PENDING))
                session.add(FutureDB(request_type=kind.SAMPLE, model_id="m", request_data=data[kind.SAMPLE],
                                     status=RequestStatus.COMPLETED))  # done: no finder may take it
                session.commit()
            probe = probe_class(db)
            ran = []
            event.listen(db, "before_cursor_execute", lambda *args, ran=ran: ran.append(1))
            probe.process_pending_requests_once()
            statements.append(len(ran))
            found = {k: (sorted(v.items()) if k == "barriers" else sorted(v) if isinstance(v, dict) else v)
                     for k, v in probe.found.items()}
            outcomes.append((found, sorted(set(queue), key=str)))
            db.dispose()
        return outcomes, statements

    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b, tempfile.TemporaryDirectory() as c:
        (plain, stock_statements), (fast, statements) = looks(a, Collect), looks(b, Fast)
        fair, fair_statements = looks(c, Fair)
    for (want, _), (got, pending_kinds), (also, _) in zip(plain, fast, fair, strict=True):
        if {k: v for k, v in got.items() if k != "kinds"} != {k: v for k, v in want.items() if k != "kinds"}:
            raise SystemExit(f"a look with pending types first differs from SkyRL's:\n  stock {want}\n  rlcli {got}")
        if also != got:
            raise SystemExit(f"with --tenants (one tenant) a look differs:\n  without {got}\n  with {also}")
        if got["kinds"] != sorted(pending_kinds, key=str) and got["kinds"] != sorted(pending_kinds):
            raise SystemExit(f"the pending-types query read {got['kinds']}, the queue holds {pending_kinds}")
    if not any(w["passes"] for w, _ in plain) or not any(w["singles"] for w, _ in plain) or not any(
            w["barriers"] for w, _ in plain):
        raise SystemExit(f"SkyRL's finders found nothing in the scratch queues: {plain}")
    # A queue of forwards only: the types query, the forwards and their data; no barrier or other finder's query.
    if statements[1] > 3 or statements[1] >= stock_statements[1] or fair_statements != statements:
        raise SystemExit(f"a look at a queue of forwards ran {statements[1]} statements (stock "
                         f"{stock_statements[1]}, with --tenants {fair_statements[1]}); expected 3")
    return (f"a look with pending types first finds what SkyRL's finders find ({len(queues)} queues; "
            f"{sum(statements)} statements against {sum(stock_statements)})")


def check_results() -> str:
    """RlcliEngine._complete_futures' rows against SkyRL's on scratch sqlite databases: the same rows for results of
    several kinds (a failure among them), and a results ring that reads back as those rows."""
    import tempfile
    import types as pytypes

    from skyrl.tinker import types
    from skyrl.tinker.db_models import FutureDB, RequestStatus, SQLModel
    from skyrl.tinker.engine import TinkerEngine
    from sqlmodel import Session, create_engine, select

    kind = types.RequestType
    results = {"1": types.ForwardBackwardOutput(loss_fn_output_type="scalar", metrics={"loss:sum": 1.5},
                                                loss_fn_outputs=[{"logprobs": {"data": [-0.5, float("nan")]}}]),
               "2": types.OptimStepOutput(metrics={"lr": 1e-4}), "3": types.ErrorResponse(error="no", status="failed")}

    def complete(folder: str, stock: bool) -> list:
        db = create_engine(f"sqlite:///{folder}/db.sqlite")
        SQLModel.metadata.create_all(db)
        with Session(db) as session:
            queued = ((1, kind.FORWARD_BACKWARD), (2, kind.OPTIM_STEP), (3, kind.FORWARD), (4, kind.SAMPLE))
            for request_id, k in queued:
                session.add(FutureDB(request_id=request_id, request_type=k, model_id="m", request_data={},
                                     status=RequestStatus.PENDING))
            session.commit()
        if stock:
            TinkerEngine._complete_futures(pytypes.SimpleNamespace(db_engine=db), results)
            rows = None
        else:
            rows = wake.result_rows(results)
            wake.write_rows(db, rows)
        with Session(db) as session:
            stored = [(f.request_id, f.status, f.result_data, f.completed_at is not None)
                      for f in session.exec(select(FutureDB).order_by(FutureDB.request_id)).all()]
        db.dispose()
        return stored, rows

    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        (stock, _), (ours, rows) = complete(a, True), complete(b, False)
    if ours != stock:
        raise SystemExit(f"the engine's results rows differ from SkyRL's _complete_futures:\n  stock {stock}\n"
                         f"  rlcli {ours}")
    if [r[1] for r in stock] != [RequestStatus.COMPLETED, RequestStatus.COMPLETED, RequestStatus.FAILED,
                                 RequestStatus.PENDING]:
        raise SystemExit(f"SkyRL's _complete_futures wrote other statuses than expected: {stock}")
    seq, read = wake.read_results(wake.results_message(7, rows))
    if seq != 7 or read != [(r[0], str(r[1].value), r[2]) for r in stock[:3]]:
        raise SystemExit(f"a results ring reads back as {seq}, {read}, the database holds {stock[:3]}")
    big = [{**rows[0], "result_data": "x" * (wake.RING_RESULTS_MAX + 1)}]
    if wake.results_message(8, big) is not None:
        raise SystemExit(f"results over {wake.RING_RESULTS_MAX} bytes went into a ring")
    return "results rows match SkyRL's _complete_futures and read back from a ring (3 kinds, a failure)"


def drops_get_model(route) -> bool:
    """Whether `route` awaits the module global get_model and drops its result (END_SEND then POP_TOP, 3.12)."""
    import dis
    import inspect

    if route is None:
        return False
    ins = list(dis.get_instructions(inspect.unwrap(route).__code__))
    calls = [i for i, x in enumerate(ins) if x.opname == "LOAD_GLOBAL" and x.argval == "get_model"]
    ends = [next((k for k in range(at, len(ins)) if ins[k].opname == "END_SEND"), None) for at in calls]
    return bool(calls) and all(end is not None and end + 1 < len(ins) and ins[end + 1].opname == "POP_TOP"
                               for end in ends)


def check_model_checks() -> str:
    """skip_known_model_checks: the routes it serves drop get_model's row (their bytecode), and through SkyRL's own
    optim_step route on a scratch sqlite database an unknown model is 404 every time, a known one is read once and
    then not, and any other caller of get_model still gets the row."""
    import asyncio
    import tempfile

    from skyrl.tinker import api
    from skyrl.tinker.db_models import ModelDB, SQLModel
    from sqlalchemy.ext.asyncio import create_async_engine

    stock = api.get_model
    kept = [route for route in wake.MODEL_CHECK_ROUTES if not drops_get_model(getattr(api, route, None))]
    if kept:
        raise SystemExit(f"SkyRL's {kept} no longer drop get_model's row: skip_known_model_checks would hand them None")

    async def run(folder: str) -> tuple:
        engine = create_async_engine(f"sqlite+aiosqlite:///{folder}/db.sqlite")
        async with engine.begin() as connection:
            await connection.run_sync(SQLModel.metadata.create_all)
        async with api.AsyncSession(engine) as session:
            session.add(ModelDB(model_id="m", base_model="b", lora_config={}, status="ready", request_id=0,
                                session_id="s"))
            await session.commit()
        counts = wake.skip_known_model_checks(api)
        outcomes = []
        try:
            for model_id in ("x", "m", "m", "x", "m"):
                async with api.AsyncSession(engine) as session:
                    try:
                        step = api.OptimStepRequest(model_id=model_id, adam_params=api.AdamParams())
                        outcomes.append((await api.optim_step(step, session)).status)
                    except api.HTTPException as e:
                        outcomes.append(e.status_code)
            async with api.AsyncSession(engine) as session:
                row = await api.get_model(session, "m")  # not a checking route: the row, as stock
        finally:
            api.get_model = stock
            await engine.dispose()
        return outcomes, counts["skipped"], getattr(row, "model_id", None)

    with tempfile.TemporaryDirectory() as folder:
        outcomes, skipped, row = asyncio.run(run(folder))
    if outcomes != [404, "pending", "pending", 404, "pending"] or skipped != 2 or row != "m":
        raise SystemExit(f"known-model checks went wrong: routes {outcomes}, {skipped} reads skipped "
                         f"(expected 2), get_model elsewhere gave {row!r}")
    return "a known model's row is read once by the submit routes, an unknown one is 404 every time"



def self_check(slots: int = 6, seed: int = 0, dtype: str = "float32", base_slot_zero: bool = False) -> float:
    """Largest difference between the stock path and this one, values and gradients, on random layers
    (linear, fused qkv-style linear, embedding) with a batch that mixes adapters and leaves slots unused, and with
    decode-step batches (one token per row) mixed and on one adapter. base_slot_zero: slot 0 as SkyRL's base model
    (B zero), whose batches skip the sums; values only there (slot 0 is never trained, so its gradient is moot)."""
    import jax

    # SkyRL's layers are built under a device mesh (as the backend builds them); one device is enough here.
    mesh = jax.make_mesh((1,), ("fsdp",), axis_types=(jax.sharding.AxisType.Auto,))
    with jax.set_mesh(mesh):
        return _self_check(slots, seed, dtype, base_slot_zero)


def _self_check(slots: int, seed: int, dtype: str, base_slot_zero: bool) -> float:
    import itertools

    import jax
    import jax.numpy as jnp
    from flax import nnx
    from skyrl.tx.layers import lora
    original = getattr(lora.LoRAMixin.apply_lora, "__wrapped__", lora.LoRAMixin.apply_lora)
    rngs = nnx.Rngs(seed)
    init = nnx.initializers.lecun_normal()
    common = dict(sharding=(None, None), max_lora_adapters=slots, max_lora_rank=8, dtype=dtype, rngs=rngs)
    layers = {
        "linear": lora.LoRALinear(24, 40, use_bias=True, kernel_init=init, **common),
        "fused": lora.FusedLoRALinear(24, 48, components=("q", "k", "v"), group_sizes=(8, 4, 4), **common),
        "embed": lora.LoRAEmbed(50, 24, embedding_init=init, **common),
    }
    key = jax.random.key(seed + 1)
    for layer in layers.values():  # give every slot non-zero A, B and its own scaling
        k1, k2, k3, key = jax.random.split(key, 4)
        layer.lora_A[...] = jax.random.normal(k1, layer.lora_A[...].shape, dtype)
        layer.lora_B[...] = jax.random.normal(k2, layer.lora_B[...].shape, dtype)
        layer.lora_scaling[...] = jax.random.uniform(k3, (slots,), dtype, minval=0.5, maxval=2.0)
    if base_slot_zero:  # as SkyRL's base model: slot 0's B zero (the path that skips its sums)
        for layer in layers.values():
            layer.lora_B[...] = layer.lora_B[...].at[0].set(0)
    # (adapter per row, tokens per row): mixed adapters (slots 2 and 4 unused, 3 twice) as in training; and as in a
    # decode step (one token per row), mixed and all on one adapter (the path that reads its A and B once).
    cases = [([3, 1, 3, 0, 5], 7), ([3, 1, 3, 0, 5], 1), ([3, 3, 3, 3, 3], 1), ([0] * 5, 1), ([0] * 5, 7)]
    worst = 0.0
    for (rows, tokens), (name, layer) in itertools.product(cases, layers.items()):
        indices = jnp.array(rows, dtype=jnp.int32)
        key, k = jax.random.split(key)
        x = (jax.random.randint(k, (5, tokens), 0, 50) if name == "embed"
             else jax.random.normal(k, (5, tokens, 24), dtype))

        plain = nnx.Embed if name == "embed" else nnx.Linear  # the layer without its LoRA
        graphdef, params, rest = nnx.split(layer, nnx.Param, ...)  # gradients for every Param: base, A, B

        def loss(params, xs, path, graphdef=graphdef, rest=rest, plain=plain, indices=indices):
            layer = nnx.merge(graphdef, params, rest)
            out = path(layer, xs, plain.__call__(layer, xs), indices)
            return jnp.sum(jnp.sin(out)), out

        def ours(layer, xs, base, idx):
            out = rlcli_lora.per_sequence_lora(layer, xs, base, idx)
            assert out is not None, "the per-sequence path stepped aside in the self-check"
            return out

        argnums = 0 if name == "embed" else (0, 1)  # token ids have no gradient
        (_, want), want_grads = jax.value_and_grad(loss, argnums=argnums, has_aux=True)(params, x, original)
        (_, got), got_grads = jax.value_and_grad(loss, argnums=argnums, has_aux=True)(params, x, ours)
        worst = max(worst, _relative(got, want))
        if base_slot_zero and not any(rows):
            continue
        for g, w in zip(jax.tree.leaves(got_grads), jax.tree.leaves(want_grads), strict=True):
            worst = max(worst, _relative(g, w))
    return worst


def _relative(got, want) -> float:
    import jax.numpy as jnp

    return float(jnp.max(jnp.abs(got - want))) / (float(jnp.max(jnp.abs(want))) or 1.0)


def check_lora() -> str:
    """In float64 the two paths must agree to rounding (1e-12); float32, what the server runs, to 1e-5."""
    import jax

    jax.config.update("jax_enable_x64", True)
    found = {dtype: max(self_check(dtype=dtype), self_check(dtype=dtype, base_slot_zero=True))
             for dtype in ("float64", "float32")}
    if found["float64"] > 1e-12 or found["float32"] > 1e-5:
        raise SystemExit(f"per-sequence LoRA differs from SkyRL's ragged_dot path: {found} (relative)")
    return ("per-sequence LoRA matches SkyRL's ragged_dot path, values and gradients (largest relative difference: "
            f"float64 {found['float64']:.1e}, float32 {found['float32']:.1e})")



def decode_outputs(which: str, model, cases: list) -> list:
    """`generate`'s answers with the mixin's decode program `which` ("stock" or "rlcli") for each case."""
    import jax.numpy as jnp
    import rlcli_decode
    from skyrl.tx.utils.generator import GeneratorMixin

    GeneratorMixin._prefill_and_decode = rlcli_decode.installed[which]
    found = []
    for ids, mask, params, prompt_logprobs in cases:
        out = model.generate(jnp.asarray(ids), jnp.asarray(mask), sampling_params=params,
                             prompt_logprobs=prompt_logprobs, adapter_indices=jnp.zeros((len(ids),), jnp.int32))
        found.append((out.generated_ids, out.stop_reasons, out.logprobs, out.prompt_logprobs))
    return found


def check_decode() -> str:
    """runtime/rlcli_decode.py against SkyRL's decode loop on a small random Qwen3: ragged prompts, stop tokens, every
    sampling mode (greedy, drawn, top-k and top-p, a mixed batch), prompt logprobs: the same tokens, stop reasons and
    logprobs, bit for bit."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import rlcli_decode
    from flax import nnx
    from skyrl.tinker import types
    from skyrl.tx.models.configs import Qwen3Config
    from skyrl.tx.models.qwen3 import Qwen3ForCausalLM
    from transformers import Qwen3Config as HFConfig

    hf = HFConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=8, tie_word_embeddings=True)
    config = Qwen3Config(hf, max_lora_adapters=2, max_lora_rank=4, shard_attention_heads=True, loss_chunk_size=0,
                         gradient_checkpointing=False, mhc_expansion_rate=1)
    mesh = jax.make_mesh((1, 1, 1), ("fsdp", "ep", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 3)
    rng = np.random.default_rng(3)
    lengths = [5, 8, 3, 8, 6, 1]
    ids = np.zeros((6, 8), np.int32)
    for row, n in enumerate(lengths):
        ids[row, :n] = rng.integers(0, 96, n)
    mask = (np.arange(8)[None, :] < np.array(lengths)[:, None]).astype(np.int32)

    def params(temperatures, max_tokens=(12,) * 6, stop=(5, 9), **kw):
        return [types.SamplingParams(temperature=t, max_tokens=n, seed=row, stop_tokens=list(stop), **kw)
                for row, (t, n) in enumerate(zip(temperatures, max_tokens, strict=True))]

    # max_tokens 12 and a batch of 3-37 (not bucket sizes): rlcli's program is built for the bucket (32, 48)
    cases = [(ids, mask, params([0.0] * 6), False), (ids, mask, params([1.0] * 6), False),
             (ids, mask, params([0.8] * 6, top_k=7, top_p=0.9), False),
             (ids, mask, params([0.0, 1.0, 0.0, 0.5, 0.0, 2.0]), True),
             (ids, mask, params([1.0] * 6, max_tokens=(3, 37, 12, 20, 5, 37), stop=()), False)]
    with jax.set_mesh(mesh), nnx.use_eager_sharding(True):
        model = Qwen3ForCausalLM(config, dtype=jnp.float32, rngs=nnx.Rngs(1))
        rlcli_decode.install()
        stock, ours = decode_outputs("stock", model, cases), decode_outputs("rlcli", model, cases)
    if stock != ours:
        differ = [n for n, (a, b) in enumerate(zip(stock, ours, strict=True)) if a != b]
        raise SystemExit(f"rlcli's decode differs from SkyRL's in batches {differ}")
    drawn = {tuple(map(tuple, out[0])) for out in stock}
    assert len(drawn) == len(cases), "the cases should sample differently (else the check proves little)"
    lengths = [len(t) for out in stock[:4] for t in out[0]]
    assert min(lengths) < 12 == max(lengths), "some rows should stop on a stop token, some run to max_tokens"
    assert [len(t) for t in stock[4][0]] == [3, 37, 12, 20, 5, 37], "without stops each row runs to its max_tokens"
    return f"rlcli's decode matches SkyRL's bit for bit on {len(cases)} batches (tokens, stop reasons, logprobs)"

# SkyRL's module that imports peft, and the only one among the jax engine's imports allowed to.
PEFT_USER = "skyrl.tx.utils.models"


def peft_uses_fit(user: str = PEFT_USER) -> None:
    """SkyRL's jax engine meets peft only in `user`, as `peft.LoraConfig(<INPUTS as keywords>)` whose result only
    calls save_pretrained(folder): what rlcli_no_torch's stand-in does (AssertionError where it does not)."""
    import ast
    import importlib.util

    from rlcli_no_torch import INPUTS

    source = Path(importlib.util.find_spec(user).origin).read_text()
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == "peft":
            attribute = parents.get(node)
            assert isinstance(attribute, ast.Attribute) and attribute.attr == "LoraConfig", \
                f"{user} line {node.lineno} uses peft other than as peft.LoraConfig"
            call = parents.get(attribute)
            assert isinstance(call, ast.Call) and not call.args and {k.arg for k in call.keywords} <= set(INPUTS), \
                f"{user} line {node.lineno}: LoraConfig takes other inputs than {INPUTS}"
            target = parents.get(call)
            assert isinstance(target, ast.Assign) and len(target.targets) == 1, \
                f"{user} line {node.lineno}: the LoraConfig is not kept in one name"
            kept = target.targets[0]
            uses = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == kept.id and n is not kept]
            assert uses and all(isinstance(parents.get(n), ast.Attribute) and parents[n].attr == "save_pretrained"
                                for n in uses), f"{user}: the LoraConfig is used other than by save_pretrained"
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [alias.name for alias in node.names] + [getattr(node, "module", None) or ""]
            assert not any(n.startswith("peft.") for n in names) and not (
                isinstance(node, ast.ImportFrom) and (node.module or "").startswith("peft")), \
                f"{user} line {node.lineno} imports from inside peft"


# Run in a fresh process of the venv by the check: the prepared imports, then what the engine does with them.
PREPARED_CHECK = """
import json, sys, tempfile
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import rlcli_no_torch as lean, rlcli_lazy_torch
record_file, model, values, expected = Path(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4]), sys.argv[5]
assert lean.prepare(record_file), lean._state["mode"]
import skyrl.tinker.engine, skyrl.backends.jax
from skyrl.tx.utils import models
assert not rlcli_lazy_torch.loaded("torch"), "importing SkyRL's jax engine loaded torch"
holders = sorted(n for n, m in sys.modules.items() if n.startswith("skyrl") and "peft" in vars(m))
assert holders == ["skyrl.tx.utils.models"], f"SkyRL modules holding peft: {holders}"
from transformers import AutoConfig, AutoTokenizer
config, tokenizer = AutoConfig.from_pretrained(model), AutoTokenizer.from_pretrained(model)
ids = tokenizer.encode("What is 3 + 4?")
with tempfile.TemporaryDirectory() as folder:
    models.peft.LoraConfig(**values).save_pretrained(folder)
    assert (Path(folder) / lean.CONFIG_FILE).read_text() == Path(expected).read_text(), "not peft's text"
assert not rlcli_lazy_torch.loaded("torch"), "configuration, tokenizer or save loaded torch"
print(json.dumps({"config": type(config).__name__, "dtype": str(getattr(config, "dtype", None)), "ids": ids}))
"""


def check_no_torch() -> str:
    """rlcli_no_torch against the real peft and SkyRL: the record's premises, SkyRL's uses of peft, and in a fresh
    process the prepared imports (no torch), the embedded model's configuration and tokenizer, peft's exact text."""
    import importlib.util
    import json
    import os
    import subprocess
    import tempfile
    from pathlib import Path

    import rlcli_no_torch as lean

    spec = importlib.util.spec_from_file_location("peft_record", RUNTIME.parent / "peft_record.py")
    recorder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recorder)  # the install's recorder: its imports find the runtime folder, first here
    record = recorder.make_record()
    peft_uses_fit()
    with tempfile.TemporaryDirectory() as scratch:
        record_file, expected = Path(scratch) / lean.RECORD_NAME, Path(scratch) / "expected.json"
        record_file.write_text(json.dumps(record))
        values = {"base_model_name_or_path": "org/model-\u00e9", "r": 16, "lora_alpha": 32.0}
        expected.write_text(recorder.peft_text(values))
        model = str(RUNTIME.parents[1] / "assets" / "rlcli-tiny-qwen3-v1")
        proc = subprocess.run([sys.executable, "-c", PREPARED_CHECK, str(RUNTIME), str(record_file), model,
                               json.dumps(values), str(expected)], capture_output=True, text=True, env=dict(os.environ))
        if proc.returncode != 0:
            raise SystemExit(f"the prepared engine imports failed:\n{proc.stderr[-3000:]}")
        seen = json.loads(proc.stdout.strip().splitlines()[-1])
    return (f"SkyRL's jax engine imports without torch; {seen['config']} and its tokenizer load; LoraConfig writes "
            f"peft {record['peft']}'s exact text")


