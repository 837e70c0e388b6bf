# rlcli: two commands do all set-up on a fresh machine (offline):
#   make demo   client venv + server venv (both from locks) + the shipped model, start the server, a real job, stop
#   make test   the whole test suite against a real SkyRL server on CPU (CI runs this)
# Faster loops: make test-fast (no server, < 1 min), make lint. Notebooks: make notebooks, make lab.
# Environments: make lock (re-lock from env/*.in), make lock-check, make wheel-check (the pip install path).

SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
RLCLI := $(BIN)/rlcli
PORT ?= 8000
STAMP := $(VENV)/.rlcli-installed
PYTEST_ARGS ?=
# make test runs whole test files on parallel workers (pytest-xdist), one per core up to 4: a file's tests share
# its module servers, so a file never splits. The heavy server files come first (--no-loadscope-reorder keeps
# the collection order, faults and integration before unit), so no slow file is left for the end. A worker
# with its servers peaks near 6 GB, so memory caps them too. TEST_WORKERS=1: one worker.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); m=$$(awk '/MemTotal/ {print int($$2 / 6e6)}' \
	/proc/meminfo 2>/dev/null || echo 1); n=$$(( n < m ? n : m )); echo $$(( n < 1 ? 1 : n < 4 ? n : 4 )))
XDIST = -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder
URL = http://127.0.0.1:$(PORT)
# The demo pipeline: logged OpenAI traffic -> rlcli import -> rlcli train sl (stdin, nothing left in /tmp).
SL_DEMO = $(RLCLI) import rlcli/data/demo/demo-traces.openai.jsonl -f openai \
	| $(RLCLI) train sl --dataset - --base-url $(URL) --epochs 2 --batch-size 8 --lr 5e-3 --save-every 8
# RL on the synthetic x + y task with one-digit operands, from the base model, sized for 2 CPU cores: the loss
# route (fused GSPO with rlcli's server extension), one line per step. The 18 sums kept out of training (--eval-size)
# are answered greedily by the start and the final weights inside the run (--greedy-score: one line, no second
# process). The base model answers half its sums in a sentence that an 8-token budget cuts off; RL moves it to the
# bare sum: 5/18 -> 7-8/18 in 8 steps, as in 10, over four seeds (docs/decisions.md, "make demo's RL"). It starts
# from the base, not the SFT run: that SFT (two-digit sums, 16 steps at 5e-3) overwrites the one-digit facts RL
# draws on. Targets add --max-steps and --eval-every.
RL_DEMO = $(RLCLI) train rl --loss gspo --dataset arithmetic --max-operand 9 --base-url $(URL) --batch-size 8 \
	--group-size 8 --lr 1e-3 --max-tokens 8 --eval-size 18 --save-every 0 --greedy-score
# The demo ends as an application would meet the trained model: one call of the `openai` package to rlcli's endpoint
# (`rlcli endpoint`), which answers from the RL run's final weights under the name "demo".
ENDPOINT_PORT ?= 8100
OPENAI_CALL = $(BIN)/python -c 'import openai, sys; client = openai.OpenAI(base_url=sys.argv[1], api_key="demo"); \
	raw = client.chat.completions.with_raw_response.create(model="demo", max_tokens=16, temperature=0, \
	messages=[{"role": "user", "content": "What is 3 + 4?"}]); \
	print("openai SDK -> rlcli endpoint, weights", raw.headers["x-rlcli-weights"], "answered:", \
	repr(raw.parse().choices[0].message.content))'
# The last sampler checkpoint a run folder recorded (rlcli's one lookup of checkpoints.jsonl; no log scraping).
FINAL_SAMPLER = $(BIN)/python -c 'import sys, pathlib; from rlcli.train.folder import last_checkpoint; \
	print(last_checkpoint(pathlib.Path(sys.argv[1]), "sampler_path")["sampler_path"])'

.PHONY: help venv server-venv server-venv-ray model demo sl test test-fast test-server lint clean-venv

help:
	@sed -n '1,7p' Makefile

# The client venv: rlcli (editable) over the locks (every package pinned with its hashes: env/README.md).
# torch is the CPU build from PyTorch's CPU index (TORCH_INDEX); pip also finds it in any local folder its
# config names. The locks are for CPython 3.11 on x86_64 Linux.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
PIP_LOCKED = $(BIN)/python -m pip install --quiet --progress-bar off --require-hashes --no-deps
$(STAMP): env/client.lock env/torch-cpu.lock pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' || { echo "make venv: the locks are \
	for CPython 3.11; run make with PYTHON=python3.11 (or pip install polygramme-rlcli, unlocked)" >&2; exit 2; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP_LOCKED) --retries 0 --extra-index-url $(TORCH_INDEX) -r env/torch-cpu.lock 2> >(grep -v '^WARNING: Location' >&2)
	$(PIP_LOCKED) -r env/client.lock 2> >(grep -v '^WARNING: Location' >&2)
	$(BIN)/python -m pip install --quiet --no-deps -e . 2> >(grep -v '^WARNING: Location' >&2)
	@touch $@

venv: $(STAMP)

# The server venv (Python 3.12, SkyRL + jax), shared by every RLCLI_HOME that points at it.
server-venv: venv
	$(RLCLI) serve install

# Ray over it (server-ray.lock), for the jax-on-Ray tests: `make test` asks for it; plain use never gets it.
server-venv-ray: server-venv
	$(RLCLI) serve install --ray

# The oldest supported tinker SDK (0.25) in a venv of its own (env/compat-oldest.lock, ~/.rlcli/compat-venv-<digest>),
# for the compatibility test, whose other client is this venv's newest (tests/integration/test_sdk_compat.py, which
# builds it too when the package index is reachable).
.PHONY: compat-venv
compat-venv: venv
	PYTHONPATH=. $(BIN)/python -m tests.sdk_clients build

# The embedded model's shipped bytes (rlcli/assets/), copied to RLCLI_HOME and checked; nothing is built.
model: venv
	$(RLCLI) model install

# Locks: re-lock what changed (uv pip compile), or check that every lock matches its inputs (offline).
.PHONY: lock lock-check wheel-check
lock: venv
	$(BIN)/python -m rlcli.locks

lock-check: venv
	$(BIN)/python -m rlcli.locks check

# The install a user makes: the wheel into a fresh venv from the locks, then --version, doctor, serve start/stop.
wheel-check: venv server-venv
	TORCH_INDEX=$(TORCH_INDEX) bash scripts/wheel_check.sh

# Start the server; import -> SFT (its loss falls), then RL scored on held-out sums before and after (one line);
# export the final weights; an OpenAI-SDK call answered by them through `rlcli endpoint`; stop the server (and the
# endpoint with it) whether the jobs passed or not.
demo: venv server-venv model
	$(RLCLI) serve start --port $(PORT)
	@status=0; runs=$${RLCLI_HOME:-$$HOME/.rlcli}/runs/demo-$$(date +%Y%m%d-%H%M%S); \
	  { $(SL_DEMO) --log-path $$runs/sl && $(RL_DEMO) --max-steps 8 --eval-every 0 --log-path $$runs/rl \
	    && final=$$($(FINAL_SAMPLER) $$runs/rl) \
	    && $(RLCLI) export $$final --format merged -o $$runs/export --base-url $(URL) \
	    && $(RLCLI) endpoint start --port $(ENDPOINT_PORT) --models demo=$$final --no-record >/dev/null \
	    && $(OPENAI_CALL) http://127.0.0.1:$(ENDPOINT_PORT)/v1; } || status=$$?; \
	  $(RLCLI) serve stop; exit $$status

sl: venv server-venv model
	$(RLCLI) serve start --port $(PORT)
	@status=0; $(SL_DEMO) || status=$$?; $(RLCLI) serve stop; exit $$status

.PHONY: rl
rl: venv server-venv model
	$(RLCLI) serve start --port $(PORT)
	@status=0; $(RL_DEMO) --max-steps 12 --eval-every 4 || status=$$?; $(RLCLI) serve stop; exit $$status

test: venv server-venv-ray model base-image
	$(BIN)/python -m pytest -q $(XDIST) $(PYTEST_ARGS)

# The fast tier spreads single tests over the same workers: a third of its time is subprocesses and timers.
test-fast: venv
	$(BIN)/python -m pytest -q -m "not server and not slow" -n $(TEST_WORKERS) tests/unit $(PYTEST_ARGS)

test-server: venv server-venv-ray model base-image
	$(BIN)/python -m pytest -q -m server $(XDIST) $(PYTEST_ARGS)

lint: venv
	$(BIN)/ruff check rlcli scripts tests benchmarks

clean-venv:
	rm -rf $(VENV)

# Harbor tasks run in local Docker (as root): a daemon, then the Debian base image built offline.
.PHONY: docker base-image
docker:
	bash scripts/docker_up.sh

base-image: docker
	bash scripts/base_image.sh

.PHONY: bench notebooks kill-test
# The loop killed at >= 50 seeded points (ingest to rollback, and its server): a receipt; KILL_SEED replays a seed.
KILL_SEED ?= 0
kill-test: venv server-venv model
	$(BIN)/python -m benchmarks.kill_loop --seed $(KILL_SEED) --kills 50

# Every benchmark (each starts and stops its own server; waits for a quiet machine), then the README table from the
# receipts, then the receipts the tree no longer keeps deleted (benchmarks/README.md: the rule; history stays in git).
bench: venv server-venv model
	$(BIN)/python -m benchmarks.fused_vs_2pass --size tiny --losses gspo,ppo --prompts 4 --samples 4 --pairs 12
	$(BIN)/python -m benchmarks.fused_vs_2pass --size large --losses gspo,ppo --prompts 2 --samples 4 --pairs 12
	$(BIN)/python -m benchmarks.server_start --size tiny --rounds 3 --warm 2
	$(BIN)/python -m benchmarks.server_start --size large --rounds 2 --warm 2
	$(BIN)/python -m benchmarks.overhead --pairs 20
	$(BIN)/python -m benchmarks.request_path --label 32slots --max-lora-adapters 32
	$(BIN)/python -m benchmarks.request_path --label default-slots
	$(BIN)/python -m benchmarks.request_path --size large --label 32slots --max-lora-adapters 32 --reps 10
	$(BIN)/python -m benchmarks.faults --timeouts 5,15,60
	$(BIN)/python -m benchmarks.report
	$(BIN)/python -m benchmarks.retention --prune

# The soak (benchmarks/soak.py): two SFT trainers, RL sampling, the endpoint under 2 requests/s and the loop promoting
# and rolling back, against one server for SOAK_MINUTES; RSS, fds, futures rows and disk every 10 s, each judged flat
# or within its retention after 15 minutes of warm-up (30 judged). Niced: it shares the machine for that long.
# Receipt and PNG in benchmarks/receipts/.
SOAK_MINUTES ?= 45
.PHONY: soak
soak: venv server-venv model
	nice -n 10 $(BIN)/python -m benchmarks.soak --minutes $(SOAK_MINUTES)

# Every HTTP surface fuzzed from its own OpenAPI schema, with the hand-made cases and a client beside (docs/fuzz.md):
# SkyRL's API without and with --tenants, and `rlcli endpoint`; a receipt in benchmarks/receipts/ (~10 min on 2 cores).
.PHONY: fuzz
fuzz: venv server-venv model
	$(BIN)/python -m benchmarks.fuzz

# The notebooks at laptop size through papermill (each starts and stops its own server); the executed copies,
# outputs and plots included, go to notebooks/results/ beside the results they record.
NOTEBOOKS = fused_vs_2pass learning_curve gsm8k distill continual_loop served_loop
notebooks: venv server-venv model
	@mkdir -p notebooks/results; for nb in $(NOTEBOOKS); do \
	  echo "papermill notebooks/$$nb.ipynb -> notebooks/results/$$nb.ipynb"; \
	  $(BIN)/papermill --cwd notebooks --no-progress-bar notebooks/$$nb.ipynb notebooks/results/$$nb.ipynb || exit 1; \
	done; $(BIN)/python -m rlcli.lab portable notebooks/results/*.ipynb notebooks/results/*.json

# JupyterLab on the notebooks, bound to loopback (the URL with its token is printed; LAB_PORT picks the port).
# Jupyter refuses root unless told, and containers often run as root.
LAB_PORT ?= 8888
.PHONY: lab
lab: venv server-venv model
	$(BIN)/jupyter lab --ip 127.0.0.1 --port $(LAB_PORT) --no-browser --notebook-dir notebooks \
	  $$(test "$$(id -u)" = 0 && echo --allow-root)

# The wheels the GPU check carries to a machine without a package registry (benchmarks/gpu/README.md): the
# pinned list for Python 3.12 on x86-64 Linux into benchmarks/gpu/wheels/ (ignored by git; fallbacks in its
# fallback/ folder), then checked against the GPU image's package list.
GPU_WHEELS = benchmarks/gpu/wheels
GPU_PIP_DOWNLOAD = $(BIN)/python -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
	--implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
	--platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
.PHONY: gpu-wheels
gpu-wheels: venv
	rm -rf $(GPU_WHEELS)/*.whl $(GPU_WHEELS)/fallback
	$(GPU_PIP_DOWNLOAD) -d $(GPU_WHEELS) -r <(grep -v '#[[:space:]]*fallback$$' benchmarks/gpu/wheels.txt) \
	  2> >(grep -v '^WARNING: Location' >&2)
	$(GPU_PIP_DOWNLOAD) -d $(GPU_WHEELS)/fallback -r <(grep '#[[:space:]]*fallback$$' benchmarks/gpu/wheels.txt) \
	  2> >(grep -v '^WARNING: Location' >&2)
	$(BIN)/python -m benchmarks.gpu.wheelset check $(GPU_WHEELS)
