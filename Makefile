# trainops: `make demo` runs the whole lifecycle on the simulated cluster; `make test` runs the suite.
# Every target sets itself up from a clean clone (Python venv, the three distributions, system packages).

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup demo demo-torch test test-fast bench campaign lint wheels up down

setup: $(STAMP)

# trainops-core (core/), airflow-provider-trainops (.), trainops-devcluster (devcluster/), editable.
$(STAMP): pyproject.toml setup.py core/pyproject.toml devcluster/pyproject.toml scripts/install-system-packages
	scripts/install-system-packages
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# core in compat mode (a path on sys.path): its regular `trainops` package must win over the
	# namespace the provider's editable finder implies for `trainops.hooks` and friends.
	$(BIN)/python -m pip install --quiet -e ./core --config-settings editable_mode=compat
	$(BIN)/python -m pip install --quiet -e . -e ./devcluster --group dev
	touch $(STAMP)

demo: setup
	$(BIN)/python -m trainops_devcluster.demo

# The same lifecycle with the real PyTorch example trainer (examples/torch_trainer: gloo ranks, DCP).
demo-torch: setup
	$(BIN)/python -m trainops_devcluster.demo --trainer torch

# The Airflow services stack natively (PostgreSQL, Redis, CeleryExecutor, api-server, scheduler,
# dag-processor, triggerer, the devcluster, a local S3); docker-compose.yaml runs the same in containers.
# Local only: log in as admin/admin (TRAINOPS_ADMIN_PASSWORD overrides). State and logs in .stack/.
API_PORT ?= 8080
up: setup
	$(BIN)/python -m trainops_devcluster.stack up --state-dir .stack --api-port $(API_PORT)

down:
	@test ! -x $(BIN)/python || $(BIN)/python -m trainops_devcluster.stack down --state-dir .stack

# TEST_WORKERS parallel pytest processes (pytest-xdist), each taking whole modules, and all of tests/services
# on one of them (tests/conftest.py, worker_group). TEST_WORKERS=0 runs everything in this process.
TEST_WORKERS ?= 3
test: setup
	$(BIN)/python -m pytest -n $(TEST_WORKERS)

# The tests marked `servers` left out: no devcluster API server, local S3, Airflow stack, Prometheus, Chromium
# or torch ranks, and the run refuses to start one (the rule: tests/conftest.py, "Test tiers").
test-fast: setup
	$(BIN)/python -m pytest -m "not servers"

# Every benchmarks/bench_*.py at the sizes the README quotes, cut off after BENCH_BUDGET_S (1,800 s by
# default: this 2-core machine's half hour), then a summary table and benchmarks/bench.json (the commit, its
# uncommitted changes, each result line's values, ratio, target and verdict). BENCH_LARGE=1 adds the large
# sizes (the health gate at 8,192 nodes) and lifts the budget: make bench BENCH_LARGE=1.
# `python -m benchmarks.results` writes the README's benchmark rows from benchmarks/bench.json.
bench: setup
	$(BIN)/python benchmarks/run.py

# RUNS lifecycle runs (gate, claim, train with resumes, verify, give back) on the devcluster, one seeded
# fault each (SEED, and KINDS=a,b to draw from a subset), under trainops and under the baseline policy; prints the table, writes
# benchmarks/campaign.json and the README's campaign numbers; exits 1 on any violation (~20 s a run here).
# (Single runs and the checks' own failures run in `make test`: tests/capacity/test_campaign*.py.)
RUNS ?= 200
SEED ?= 1
KINDS ?=
campaign: setup
	$(BIN)/python -m benchmarks.campaign --runs $(RUNS) --seed $(SEED) $(if $(KINDS),--kinds $(KINDS)) --json benchmarks/campaign.json --readme README.md

# The three wheels into dist/ (trainops-core, airflow-provider-trainops, trainops-devcluster), for the
# images (Dockerfile, deploy/probe.Dockerfile) and for installing elsewhere.
wheels: setup
	rm -rf dist
	for project in core . devcluster; do $(BIN)/python -m build --wheel --outdir dist $$project || exit 1; done

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
