# Quick start: `make demo` (set up the package and run the demo on the embedded English model), `make test` (set up
# the package with its `dev` extra and pass the tests; `make test-fast` leaves out the tests marked slow, `make fuzz`
# runs the fuzzers longer). All make the virtualenv when it is missing, and install again only when setup.cfg or
# pyproject.toml changed.
PYTHON ?= python3
VENV ?= .venv
# torch is installed first when the virtualenv has none: the CPU build, or the CUDA build TORCH names (TORCH=cu126),
# from PyTorch's own index where it is reachable, else pip's own index (tools/install_torch.py says which it got).
TORCH ?= cpu
TORCH_VERSION ?= 2.13.0
BIN := $(VENV)/bin

.PHONY: venv demo test test-fast fuzz bench gpu-check

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# The package alone (what the demo needs), and with the `dev` extra (what the tests need).
$(VENV)/.installed-core: setup.cfg pyproject.toml | $(BIN)/python
	$(BIN)/python -c "import torch" 2>/dev/null || $(PYTHON) tools/install_torch.py --pip $(BIN)/pip \
		--python $(BIN)/python --build $(TORCH) --version $(TORCH_VERSION)
	$(BIN)/pip install --quiet -e .
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed-core
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $@

venv: $(VENV)/.installed-dev

demo: $(VENV)/.installed-core
	$(BIN)/elmo demo

# transformers' own common model tests come from its sdist (the package index), once per transformers version. The
# tests run in one pytest-xdist worker per physical core, four at most (each holds a few models; TEST_WORKERS=0: in one
# process); the Ray tests (one cluster for their module) stay in one worker (`xdist_group`).
TEST_WORKERS ?= auto --maxprocesses 4 --dist loadgroup
test: $(VENV)/.installed-dev
	$(BIN)/ruff check hf_elmo spacy_elmo elmo_cli tests benchmarks tools
	$(BIN)/python tests/transformers_tests.py
	$(BIN)/python -m pytest -n $(TEST_WORKERS)

test-fast: $(VENV)/.installed-dev
	$(BIN)/ruff check hf_elmo spacy_elmo elmo_cli tests benchmarks tools
	$(BIN)/python tests/transformers_tests.py
	$(BIN)/python -m pytest -n $(TEST_WORKERS) -m "not slow"

# The fuzzers of tests/test_fuzz.py at 16 times the suite's examples.
fuzz: $(VENV)/.installed-dev
	ELMO_FUZZ_EXAMPLES=4000 $(BIN)/python -m pytest -n $(TEST_WORKERS) tests/test_fuzz.py

bench: $(VENV)/.installed-dev
	$(BIN)/python benchmarks/bench_inference.py

# Every GPU path checked and measured in at most 7 minutes (without CUDA: the same phases on the CPU at toy sizes);
# the report goes to $OUT or gpu_check/ (benchmarks/README.md).
gpu-check: $(VENV)/.installed-dev
	$(BIN)/python benchmarks/gpu_check.py $(GPU_CHECK_ARGS)
