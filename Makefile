# The README's commands. Everything the project needs is installed into .venv from here.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Compiled kernels are cached on disk; keep them inside the checkout.
export RECJIT_CACHE_DIR ?= $(CURDIR)/.venv/recjit-cache

.PHONY: demo test bench clean

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

test: $(VENV)/.installed-test
	$(BIN)/python -m pytest -q

bench: $(VENV)/.installed-bench
	$(BIN)/python benchmarks/bench_core.py
	$(BIN)/python benchmarks/bench.py

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .hypothesis
