# conduit: two commands. `make run` serves the embedded default; `make test` runs the suite.
# The install step installs the product with its dev tools, then the lab (`conduit-lab`), every
# package at the version constraints.txt (the lock) names, so that a clean clone installs what
# the tests were run against (the build backend too: --build-constraint; pip itself is pinned
# here); `make lock` rewrites the lock from the installed environment.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
PIP_VERSION := 26.3
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml lab/pyproject.toml constraints.txt | sha256sum | cut -c1-12)

.PHONY: run test lint install lock system-deps

# Debian packages the tests use (Redis, Tesseract's English data, headless Chromium and its
# driver for the browser tests, LibreOffice headless for Office uploads). Installed only if
# missing, and only when running as root; otherwise the missing ones are named and the target
# fails. Skipped where there is no dpkg. `make run` needs none of them.
DEBIAN_PACKAGES := redis-server tesseract-ocr tesseract-ocr-eng chromium chromium-driver \
	libreoffice-writer-nogui libreoffice-calc-nogui libreoffice-impress-nogui

$(BIN)/python:
	$(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)

$(STAMP): $(BIN)/python pyproject.toml lab/pyproject.toml constraints.txt
	$(BIN)/pip install pip==$(PIP_VERSION)
	$(BIN)/pip install -c constraints.txt torch==2.13.0
	$(BIN)/pip install -c constraints.txt --build-constraint constraints.txt -e '.[dev]'
	$(BIN)/pip install -c constraints.txt --build-constraint constraints.txt -e ./lab
	touch $(STAMP)

install: $(STAMP)

lock:
	{ sed -n 1,2p constraints.txt; $(BIN)/pip freeze --all --exclude-editable \
		| grep -v -E '^(conduit|pip)==' | sed 's/+cpu$$//'; } > constraints.txt.new
	mv constraints.txt.new constraints.txt

run: install
	$(BIN)/conduit serve --host 127.0.0.1 --port 8000

lint: install
	$(BIN)/ruff check conduit_core storage worker service lab tests
	$(BIN)/mypy

system-deps:
	@command -v dpkg-query >/dev/null || { echo "no dpkg: install $(DEBIAN_PACKAGES) yourself"; exit 0; }; \
	missing=$$(for p in $(DEBIAN_PACKAGES); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null \
		| grep -q 'ok installed' || echo $$p; done); \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ]; then apt-get update -q && DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -q $$missing; \
	else echo "missing Debian packages: sudo apt-get install $$missing"; exit 1; fi

test: lint system-deps
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(BIN)/pytest -q
