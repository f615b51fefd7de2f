# Two commands on a fresh machine: `make run` and `make test`.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: install run test lint bench

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Reinstall only when the project's dependencies change.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

run: install
	$(BIN)/connect-coordinator serve --data-dir ./data

# -p no:cacheprovider: no .pytest_cache, so a read-only CI checkout works too.
test: install
	HYPOTHESIS_PROFILE=ci $(BIN)/python -m pytest -q -p no:cacheprovider

lint: install
	$(BIN)/ruff check coordinator protocol tests
	$(BIN)/mypy coordinator protocol

# Stable-heartbeat throughput and latency (in-process server, 2 load processes).
bench: install
	$(BIN)/connect-coordinator bench codec
	$(BIN)/connect-coordinator bench heartbeats
