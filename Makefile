# rlcli: two commands do all set-up on a fresh machine (offline):
#   make demo   client venv + server venv + embedded model, start the server, a short real job, stop it
#   make test   the whole test suite against a real SkyRL server on CPU (CI runs this)
# Faster loops: make test-fast (no server, < 1 min), make lint.

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

.PHONY: help venv server-venv model demo sl test test-fast test-server lint clean-venv

help:
	@sed -n '1,6p' Makefile

# The client venv: rlcli (editable), tinker, tinker-cookbook, CPU torch, test tools.
$(STAMP): env/client.txt env/dev.txt pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --progress-bar off -r env/client.txt -r env/dev.txt 2> >(grep -v '^WARNING: Location' >&2)
	$(BIN)/python -m pip install --quiet --no-deps -e . 2> >(grep -v '^WARNING: Location' >&2)
	@touch $@

venv: $(STAMP)

# The server venv (Python 3.12, SkyRL + jax), shared by every RLCLI_HOME that points at it.
server-venv: venv
	$(RLCLI) serve install

model: venv
	$(RLCLI) model build

# Start the server, run the jobs, and stop the server whether they passed or not.
demo: venv server-venv model
	$(RLCLI) serve start --port $(PORT)
	@status=0; { $(RLCLI) demo --base-url $(URL) && $(SL_DEMO); } || status=$$?; \
	  $(RLCLI) serve stop; exit $$status

sl: venv server-venv model
	$(RLCLI) serve start --port $(PORT)
	@status=0; $(SL_DEMO) || status=$$?; $(RLCLI) serve stop; exit $$status

test: venv server-venv model
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

test-fast: venv
	$(BIN)/python -m pytest -q -m "not server and not slow" tests/unit $(PYTEST_ARGS)

test-server: venv server-venv model
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
