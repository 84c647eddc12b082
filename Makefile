# Two commands set everything up on a fresh machine with only Python 3.11 and pip:
#   make demo   -- trains over real HTTP on bundled data (scikit-learn's breast cancer set)
#   make test   -- ruff, mypy and pytest
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install test lint typecheck pytest demo bench loadtest clean

$(BIN)/python:
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "need $(PYTHON) (set PYTHON=...)"; exit 1; }
	$(PYTHON) -m venv $(VENV)

# docker/install.sh is the one install recipe, shared with the Dockerfiles: torch goes first
# and exactly pinned (any other spec downloads several GB of CUDA packages), then the project.
$(STAMP): $(BIN)/python pyproject.toml docker/install.sh
	PYTHON=$(PYTHON) sh docker/install.sh $(VENV) -e '.[dev,postgres]'
	@touch $(STAMP)

install: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP)
	$(BIN)/pytest -q

test: lint typecheck pytest

demo: $(STAMP)
	$(BIN)/python examples/demo.py

# Benchmarks write benchmarks/results/*.json; the report renders them into docs/PERFORMANCE.md.
bench: $(STAMP)
	$(BIN)/python -m benchmarks.codec
	$(BIN)/python -m benchmarks.quantizer --threads 1 --activations benchmarks/data/activations.npz --out benchmarks/results/quantizer-1thread.json
	$(BIN)/python -m benchmarks.quantizer --activations benchmarks/data/activations.npz
	$(BIN)/python -m benchmarks.step
	$(BIN)/python -m benchmarks.throughput
	$(BIN)/python -m benchmarks.memory
	$(BIN)/python -m benchmarks.report

# Locust, headless, against a party B started on 127.0.0.1 (exit code 1 = SLO missed).
loadtest: $(STAMP)
	$(BIN)/python -m loadtests.run --users 4 --run-time 60s --max-fail-ratio 0 --max-p99-ms 2000

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
