# Two commands set everything up on a fresh machine with Python 3.11, 3.12 or 3.13 and pip:
#   make demo   -- trains over real HTTP on bundled data (scikit-learn's breast cancer set);
#                  installs the product alone (torch + the runtime dependencies)
#   make test   -- ruff, mypy and pytest; installs the development extras too (.[dev])
# Both install through docker/install.sh with the pins of constraints.txt (`make lock`).

# The first supported Python on PATH; 3.11 first (the CPU torch wheel our machines carry).
PYTHON ?= $(firstword $(foreach p,python3.11 python3.12 python3.13 python3,$(shell command -v $(p) 2>/dev/null)))
VENV    := .venv
BIN     := $(VENV)/bin
PRODUCT := $(VENV)/.installed-product
DEV     := $(VENV)/.installed-dev
INSTALL_INPUTS := $(BIN)/python pyproject.toml constraints.txt docker/install.sh

.PHONY: install install-product test test-e2e test-deploy test-all lint typecheck pytest demo \
	demo-parties bench loadtest replicas lock clean device-check

$(BIN)/python:
	@test -n "$(PYTHON)" || { echo "need Python 3.11, 3.12 or 3.13 on PATH (or PYTHON=...)"; exit 1; }
	@$(PYTHON) -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] <= (3, 13))' \
		|| { echo "$(PYTHON) is not Python 3.11-3.13 (set PYTHON=...)"; exit 1; }
	$(PYTHON) -m venv $(VENV)

# docker/install.sh is the one install recipe, shared with the Dockerfiles: torch goes first
# and exactly pinned (any other spec downloads several GB of CUDA packages), then the project.
$(PRODUCT): $(INSTALL_INPUTS)
	PYTHON=$(PYTHON) sh docker/install.sh $(VENV) -e .
	@touch $@

$(DEV): $(INSTALL_INPUTS)
	PYTHON=$(PYTHON) sh docker/install.sh $(VENV) -e '.[dev]'
	@touch $@ $(PRODUCT)

install-product: $(PRODUCT)

install: $(DEV)

lint: $(DEV)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(DEV)
	$(BIN)/mypy

# The default suite: everything but the e2e and deploy markers (under 10 minutes on 2 cores).
pytest: $(DEV)
	$(BIN)/pytest -q

test: lint typecheck pytest

# Real processes over real HTTP: kill -9, TLS, restarts, the browser, the CLIs as processes.
test-e2e: $(DEV)
	$(BIN)/pytest -q -m e2e

# Packaging and deployment: a fresh install into a new venv, Dockerfiles, compose, manifests.
test-deploy: $(DEV)
	$(BIN)/pytest -q -m deploy

test-all: test test-e2e test-deploy

demo: $(PRODUCT)
	$(BIN)/python examples/demo.py

# Party B and two feature parties (docs/PROTOCOL.md section 12), three processes, real HTTP.
demo-parties: $(PRODUCT)
	$(BIN)/python examples/demo_parties.py

# Benchmarks write benchmarks/results/*.json; the report renders them into docs/PERFORMANCE.md.
bench: $(DEV)
	$(BIN)/python -m benchmarks.codec
	$(BIN)/python -m benchmarks.quantizer --threads 1 --activations benchmarks/data/activations.npz --out benchmarks/results/quantizer-1thread.json
	$(BIN)/python -m benchmarks.quantizer --activations benchmarks/data/activations.npz
	$(BIN)/python -m benchmarks.step
	$(BIN)/python -m benchmarks.scale.throughput
	$(BIN)/python -m benchmarks.scale.memory
	$(BIN)/python -m benchmarks.schedule
	$(BIN)/python -m benchmarks.floor
	$(BIN)/python -m benchmarks.threads
	$(BIN)/python -m benchmarks.report

# The GPU path on a machine with a CUDA GPU (docs/PERFORMANCE.md, "On a GPU"), about 3 minutes:
# writes $(DEVICE_OUT)/device_check.json. No install step: it runs from the source tree with any
# python that holds a CUDA build of torch and the runtime dependencies, e.g.
#   make device-check DEVICE_PY=python3 DEVICE_OUT=/tmp/out DEVICE_ARGS="--data-dir gpu-data"
DEVICE_PY ?= $(BIN)/python
DEVICE_OUT ?= benchmarks/results
device-check:
	PYTHONPATH=.$(if $(PYTHONPATH),:$(PYTHONPATH)) $(DEVICE_PY) -m benchmarks.device_check \
		--out $(DEVICE_OUT) $(DEVICE_ARGS)

# Locust, headless, against a party B started on 127.0.0.1 (exit code 1 = SLO missed).
loadtest: $(DEV)
	$(BIN)/python -m loadtests.run --users 4 --run-time 60s --max-fail-ratio 0 --max-p99-ms 2000

# Party B replicated on this machine without Docker: PostgreSQL (Debian's postgresql), HAProxy
# (Debian's haproxy) routing each run to one replica, and two `fedlite-b serve` replicas; a
# replica that dies is started again. Mutual TLS at the balancer (client certificates required
# and verified, their subject passed to the replicas over mutual TLS; certificates made in the
# state directory). Prints the URL, the database, party A's CA and client certificate (and a
# demo token) as one JSON line; Ctrl-C stops it all (docs/DEPLOY.md, "Replicas"). Installs the
# product and the PostgreSQL driver only. PY runs it with another Python (tests/e2e does);
# REPLICAS_ARGS: e.g. --replicas 3 --port 9000 --labels labels.csv --tokens-file tokens.txt
# (tokens go in a file or FEDLITE_B_TOKENS, never on a command line); without --mutual-tls:
# plain HTTP.
PY ?= $(BIN)/python
REPLICAS_ARGS ?= --replicas 2 --mutual-tls
REPLICAS_DEPS := $(VENV)/.installed-replicas
$(REPLICAS_DEPS): $(INSTALL_INPUTS)
	PYTHON=$(PYTHON) sh docker/install.sh $(VENV) -e '.[postgres]'
	@touch $@
replicas: $(if $(filter $(BIN)/python,$(PY)),$(REPLICAS_DEPS))
	$(PY) -m party_b.ops.stack $(REPLICAS_ARGS)

# constraints.txt: every dependency and extra pinned, for Python 3.11-3.13 on any platform
# (uv's universal resolution). torch's CUDA packages are left out: we install the CPU build.
NO_CUDA := cuda-bindings cuda-pathfinder cuda-toolkit nvidia-cublas nvidia-cuda-cupti \
	nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile \
	nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-nccl-cu13 \
	nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx triton
lock: $(DEV)
	$(BIN)/uv pip compile pyproject.toml --all-extras --universal --python-version 3.11 \
		--no-annotate --custom-compile-command "make lock" \
		$(addprefix --no-emit-package ,$(NO_CUDA)) --output-file constraints.txt

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
