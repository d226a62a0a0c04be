# EPL developer commands. `make demo` and `make test` each work on a fresh machine:
# both run `make setup` first, which creates .venv with Python 3.7 (see tools/find_python.sh).
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.epl-setup-stamp
PYTEST_ARGS ?=

.PHONY: setup demo test lint unit clean

setup: $(STAMP)

$(STAMP): requirements-dev.txt setup.py tools/find_python.sh
	@set -e; \
	if [ ! -x $(PY) ]; then \
	  interp="$$(bash tools/find_python.sh)"; \
	  echo "Creating $(VENV) with $$interp"; \
	  "$$interp" -m venv $(VENV); \
	fi; \
	$(PY) -m pip install -q --upgrade "pip<24" >/dev/null; \
	$(PY) -m pip install -q -r requirements-dev.txt; \
	$(PY) -m pip install -q --no-deps -e .; \
	touch $(STAMP)

lint: setup
	$(PY) -m flake8 $$(ls -d epl tests tools benchmarks examples 2>/dev/null) tools/epl-launch

unit: setup
	$(PY) -m pytest -q tests/unit $(PYTEST_ARGS)

test: setup lint
	$(PY) -m pytest -q $(PYTEST_ARGS)

demo: setup
	$(PY) examples/quick_start/run_demo.py

clean:
	rm -rf $(VENV) build *.egg-info
