# EPL developer commands. `make demo` and `make test` each work on a fresh machine:
# both run `make setup` first, which creates .venv with Python 3.7 (see tools/find_python.sh).
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.epl-setup-stamp
PYTEST_ARGS ?=
# Test processes: most tests build graphs in Python on one core, so two processes use a
# 2-core machine fully (tests are stolen one at a time by an idle process; each test is
# isolated: fresh graph, EPL state reset, its own ports and directories).
TEST_WORKERS ?= 2

WHEELS := .cache/wheels
HOROVOD_VERSION := 0.28.1

.PHONY: setup demo test lint unit clean bench-deps setup-tf2 test-tf2

OPS_STAMP := epl/lib/.build-stamp

setup: $(STAMP) $(OPS_STAMP)

# The C++ op library (csrc/); a failed build is reported and EPL uses TF fallbacks.
$(OPS_STAMP): $(STAMP) $(wildcard csrc/*/*.cc csrc/*/*.h) tools/build_ops.sh tools/build_nccl_ops.sh
	@bash tools/build_ops.sh $(PY)
	@touch $(OPS_STAMP)

$(STAMP): requirements-dev.txt setup.py tools/find_python.sh
	@set -e; \
	if [ ! -x $(PY) ]; then \
	  interp="$$(bash tools/find_python.sh)"; \
	  echo "Creating $(VENV) with $$interp"; \
	  "$$interp" -m venv $(VENV); \
	fi; \
	$(PY) -m pip install -q --upgrade "pip<24" >/dev/null; \
	$(PY) -m pip install -q -r requirements-dev.txt; \
	EPL_BUILD_OPS=0 $(PY) -m pip install -q --no-deps -e .; \
	touch $(STAMP)

# The TensorFlow 2.x leg (docs/tf2.md): Python 3.11 (tools/find_python.sh 3.11: $$PYTHON311,
# python3.11 on PATH, then pyenv) and tensorflow-cpu 2.15 (requirements-tf2.txt) in .venv-tf2; the
# op library is built against that TF into epl/lib/tf2/ (the TF1 build stays in epl/lib/).
VENV_TF2 := .venv-tf2
PY_TF2 := $(VENV_TF2)/bin/python
STAMP_TF2 := $(VENV_TF2)/.epl-setup-stamp
OPS_STAMP_TF2 := epl/lib/tf2/.build-stamp

setup-tf2: $(STAMP_TF2) $(OPS_STAMP_TF2)

$(OPS_STAMP_TF2): $(STAMP_TF2) $(wildcard csrc/*/*.cc csrc/*/*.h) tools/build_ops.sh tools/build_nccl_ops.sh
	@bash tools/build_ops.sh $(PY_TF2)
	@touch $(OPS_STAMP_TF2)

$(STAMP_TF2): requirements-tf2.txt setup.py tools/find_python.sh
	@set -e; \
	if [ ! -x $(PY_TF2) ]; then \
	  interp="$$(bash tools/find_python.sh 3.11)"; \
	  echo "Creating $(VENV_TF2) with $$interp"; \
	  "$$interp" -m venv $(VENV_TF2); \
	fi; \
	$(PY_TF2) -m pip install -q -r requirements-tf2.txt; \
	EPL_BUILD_OPS=0 $(PY_TF2) -m pip install -q --no-deps -e .; \
	touch $(STAMP_TF2)

test-tf2: setup-tf2
	$(PY_TF2) -m pytest -q -n $(TEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

lint: setup
	$(PY) -m flake8 $$(ls -d epl tests tools benchmarks examples 2>/dev/null) tools/epl-launch

unit: setup
	$(PY) -m pytest -q tests/unit $(PYTEST_ARGS)

test: setup lint
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

# The NCCL kernels (csrc/nccl) compiled, linked and loaded without a GPU, against CUDA and NCCL
# from NVIDIA's wheels (installed once under .cache/cuda); see docs/gpu.md.
.PHONY: check-nccl
check-nccl: setup
	$(PY) tools/check_nccl.py

# The suite a GPU host must pass (tests/gpu); every test skips, saying why, where no GPU is visible.
.PHONY: test-gpu
test-gpu: setup
	$(PY) -m pytest -q -rs tests/gpu $(PYTEST_ARGS)

demo: setup
	$(PY) examples/quick_start/run_demo.py

# Benchmark-only dependency: Horovod (gloo, CPU) built once into a wheel cache, then
# installed into .venv. Never part of `make test`.
bench-deps: setup
	@set -e; mkdir -p $(WHEELS); \
	if ! ls $(WHEELS)/horovod-$(HOROVOD_VERSION)-*.whl >/dev/null 2>&1; then \
	  echo "Building Horovod $(HOROVOD_VERSION) (about 5 minutes, once)"; \
	  HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
	  HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_CPU_OPERATIONS=gloo \
	  $(PY) -m pip wheel --no-deps --no-build-isolation -w $(WHEELS) horovod==$(HOROVOD_VERSION); \
	fi; \
	$(PY) -m pip install -q --no-deps $(WHEELS)/horovod-$(HOROVOD_VERSION)-*.whl; \
	$(PY) -m pip install -q cloudpickle psutil pyyaml packaging; \
	$(PY) -c "import horovod.tensorflow as hvd; print('horovod', hvd.__version__ if hasattr(hvd, '__version__') else 'ok')"

clean:
	rm -rf $(VENV) $(VENV_TF2) build *.egg-info
