# Quick start: `make test` (set up and pass the tests). Each target makes its own virtualenv.
PYTHON ?= python3
VENV ?= .venv
# torch is installed first, pinned, when the virtualenv has none (an unpinned torch pulls GBs of CUDA
# packages); override, e.g. `make test TORCH_SPEC="torch --index-url https://download.pytorch.org/whl/cu124"`.
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin

.PHONY: venv test lint bench

venv:
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install --quiet $(TORCH_SPEC)
	$(BIN)/pip install --quiet -e ".[dev]"

test: venv
	$(BIN)/ruff check hf_elmo spacy_elmo tests benchmarks
	$(BIN)/python -m pytest

bench: venv
	$(BIN)/python benchmarks/bench_inference.py
