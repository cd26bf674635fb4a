# The README's commands. Everything the project needs is installed into .venv from here.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Compiled kernels are cached on disk; keep them inside the checkout.
export RECJIT_CACHE_DIR ?= $(CURDIR)/.venv/recjit-cache

.PHONY: demo test bench bench-ablation ptx-check clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed-test: $(BIN)/python setup.cfg pyproject.toml
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $@

$(VENV)/.installed-bench: $(VENV)/.installed-test
	$(BIN)/python -m pip install --quiet -e ".[bench]" || \
	  echo "some benchmark peers failed to install; the benchmark reports them absent"
	touch $@

demo: $(VENV)/.installed-test
	$(BIN)/python examples/tree_lstm.py

# Two workers, a test file each at a time: kernels compile in one thread, and a file's tests
# share the kernels its fixtures compile.
test: $(VENV)/.installed-test
	$(BIN)/python -m pytest -q -n 2 --dist loadfile

bench: $(VENV)/.installed-bench
	$(BIN)/python benchmarks/bench_core.py
	$(BIN)/python benchmarks/bench.py
	$(BIN)/python benchmarks/bench_training.py
	$(BIN)/python benchmarks/bench_machine.py

# Each scheduling primitive's effect (Cortex Fig. 10): results/ablation-<machine>.*
bench-ablation: $(VENV)/.installed-bench
	$(BIN)/python benchmarks/ablation.py

# Without a GPU: every generated CUDA kernel of the zoo compiled to PTX by numba-cuda and NVVM
# (pip wheels, in a venv of their own), which the simulator cannot check (tools/check_ptx.py).
PTX_VENV := .venv-ptx
$(PTX_VENV)/.installed: setup.cfg
	$(PYTHON) -m venv $(PTX_VENV)
	$(PTX_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(PTX_VENV)/bin/python -m pip install --quiet -e . numba-cuda nvidia-cuda-nvcc-cu12 \
	  nvidia-cuda-nvrtc-cu12 nvidia-cuda-runtime-cu12
	touch $@

ptx-check: $(PTX_VENV)/.installed
	CUDA_HOME=$$($(PTX_VENV)/bin/python -c "import nvidia.cuda_nvcc as n; print(n.__path__[0])") \
	  $(PTX_VENV)/bin/python tools/check_ptx.py

clean:
	rm -rf $(VENV) $(PTX_VENV) *.egg-info .pytest_cache .hypothesis
