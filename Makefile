# conduit: two commands. `make run` serves the embedded default; `make test` runs the suite.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha256sum | cut -c1-12)

.PHONY: run test lint install

$(BIN)/python:
	$(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install torch==2.13.0
	$(BIN)/pip install -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

run: install
	$(BIN)/conduit serve --host 127.0.0.1 --port 8000

lint: install
	$(BIN)/ruff check conduit_core storage worker service tests bench
	$(BIN)/mypy

test: lint
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(BIN)/pytest -q
