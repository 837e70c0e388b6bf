# rlcli: two commands do all set-up on a fresh machine (offline):
#   make demo   client venv + server venv + embedded model, start the server, a short real job, stop it
#   make test   the whole test suite against a real SkyRL server on CPU (CI runs this)
# Faster loops: make test-fast (no server, < 1 min), make lint. Notebooks: make notebooks, make lab.

SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
RLCLI := $(BIN)/rlcli
PORT ?= 8000
STAMP := $(VENV)/.rlcli-installed
PYTEST_ARGS ?=
URL = http://127.0.0.1:$(PORT)
# The demo pipeline: logged OpenAI traffic -> rlcli import -> rlcli train sl (stdin, nothing left in /tmp).
SL_DEMO = $(RLCLI) import rlcli/data/demo/demo-traces.openai.jsonl -f openai \
	| $(RLCLI) train sl --dataset - --base-url $(URL) --epochs 2 --batch-size 8 --lr 5e-3 --save-every 8
# RL on the synthetic x + y task with one-digit operands (the embedded model knows those sums), sized for 2
# CPU cores: the loss route (fused GSPO with rlcli's server extension), one line per step, held-out
# problems scored every 4 steps. Targets add --max-steps.
RL_DEMO = $(RLCLI) train rl --loss gspo --dataset arithmetic --max-operand 9 --base-url $(URL) --batch-size 4 \
	--group-size 8 --lr 1e-3 --max-tokens 8 --eval-every 4 --eval-size 18 --save-every 0
# The last sampler checkpoint a run folder recorded (checkpoints.jsonl is the contract; no log scraping).
FINAL_SAMPLER = $(BIN)/python -c 'import json,sys; rows=[json.loads(l) for l in open(sys.argv[1]+"/checkpoints.jsonl") if l.strip()]; print([r for r in rows if r.get("sampler_path")][-1]["sampler_path"])'

.PHONY: help venv server-venv model demo sl test test-fast test-server lint clean-venv

help:
	@sed -n '1,6p' Makefile

# The client venv: rlcli (editable), tinker, tinker-cookbook, CPU torch, test tools, the notebook tools.
$(STAMP): env/client.txt env/dev.txt env/notebooks.txt pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --progress-bar off -r env/client.txt -r env/dev.txt -r env/notebooks.txt \
	  2> >(grep -v '^WARNING: Location' >&2)
	$(BIN)/python -m pip install --quiet --no-deps -e . 2> >(grep -v '^WARNING: Location' >&2)
	@touch $@

venv: $(STAMP)

# The server venv (Python 3.12, SkyRL + jax), shared by every RLCLI_HOME that points at it.
server-venv: venv
	$(RLCLI) serve install

model: venv
	$(RLCLI) model build

# Start the server; demo, import -> SFT -> RL, export the final weights and sample them; stop the server
# whether the jobs passed or not. The SFT run goes to a known folder so that RL starts from its final
# weights (train rl --load-checkpoint reads its checkpoints.jsonl).
demo: venv server-venv model
	$(RLCLI) serve start --port $(PORT)
	@status=0; runs=$${RLCLI_HOME:-$$HOME/.rlcli}/runs/demo-$$(date +%Y%m%d-%H%M%S); \
	  { $(RLCLI) demo --base-url $(URL) && $(SL_DEMO) --log-path $$runs/sl \
	    && $(RL_DEMO) --max-steps 3 --load-checkpoint $$runs/sl --log-path $$runs/rl \
	    && final=$$($(FINAL_SAMPLER) $$runs/rl) \
	    && $(RLCLI) export $$final --format merged -o $$runs/export --base-url $(URL) \
	    && $(RLCLI) sample --checkpoint $$final --prompt "What is 3 + 4?" --max-tokens 16 --temperature 0 \
	         --base-url $(URL); } || status=$$?; \
	  $(RLCLI) serve stop; exit $$status

sl: venv server-venv model
	$(RLCLI) serve start --port $(PORT)
	@status=0; $(SL_DEMO) || status=$$?; $(RLCLI) serve stop; exit $$status

.PHONY: rl
rl: venv server-venv model
	$(RLCLI) serve start --port $(PORT)
	@status=0; $(RL_DEMO) --max-steps 12 || status=$$?; $(RLCLI) serve stop; exit $$status

test: venv server-venv model base-image
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

test-fast: venv
	$(BIN)/python -m pytest -q -m "not server and not slow" tests/unit $(PYTEST_ARGS)

test-server: venv server-venv model base-image
	$(BIN)/python -m pytest -q -m server $(PYTEST_ARGS)

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

.PHONY: bench notebooks

# Every benchmark (each starts and stops its own server; waits for a quiet machine), then the README table from the receipts.
bench: venv server-venv model
	$(BIN)/python benchmarks/fused_vs_2pass.py --size tiny --losses gspo,ppo --prompts 4 --samples 4 --pairs 12
	$(BIN)/python benchmarks/fused_vs_2pass.py --size large --losses gspo,ppo --prompts 2 --samples 4 --pairs 12
	$(BIN)/python benchmarks/server_start.py --size tiny --rounds 3 --warm 2
	$(BIN)/python benchmarks/server_start.py --size large --rounds 2 --warm 2
	$(BIN)/python benchmarks/overhead.py --pairs 20
	$(BIN)/python benchmarks/request_path.py --label 32slots --max-lora-adapters 32
	$(BIN)/python benchmarks/request_path.py --label default-slots
	$(BIN)/python benchmarks/request_path.py --size large --label 32slots --max-lora-adapters 32 --reps 10
	$(BIN)/python benchmarks/report.py

# The notebooks at laptop size through papermill (each starts and stops its own server); the executed copies,
# outputs and plots included, go to notebooks/results/ beside the results they record.
NOTEBOOKS = fused_vs_2pass learning_curve gsm8k
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
