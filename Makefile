# Quick start: `make demo` (set up and run the demo on the embedded English model), `make test` (set up and pass
# the tests; `make test-fast` leaves out the tests marked slow). Both make the virtualenv when it is missing, and
# install again only when setup.cfg or pyproject.toml changed.
PYTHON ?= python3
VENV ?= .venv
# torch is installed first, pinned, when the virtualenv has none (an unpinned torch pulls GBs of CUDA
# packages); override, e.g. `make test TORCH_SPEC="torch --index-url https://download.pytorch.org/whl/cu124"`.
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed

.PHONY: venv demo test test-fast bench gpu-check

venv: $(INSTALLED)

$(INSTALLED): setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install --quiet $(TORCH_SPEC)
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $(INSTALLED)

demo: venv
	$(BIN)/elmo demo

# transformers' own common model tests come from its sdist (the package index), once per transformers version.
test: venv
	$(BIN)/ruff check hf_elmo spacy_elmo tests benchmarks
	$(BIN)/python tests/transformers_tests.py
	$(BIN)/python -m pytest

test-fast: venv
	$(BIN)/ruff check hf_elmo spacy_elmo tests benchmarks
	$(BIN)/python tests/transformers_tests.py
	$(BIN)/python -m pytest -m "not slow"

bench: venv
	$(BIN)/python benchmarks/bench_inference.py

# Every GPU path checked and measured in at most 7 minutes (without CUDA: the same phases on the CPU at toy sizes);
# the report goes to $OUT or gpu_check/ (benchmarks/README.md).
gpu-check: venv
	$(BIN)/python benchmarks/gpu_check.py $(GPU_CHECK_ARGS)
