# d2ops developer entry points. `make test` works on a fresh clone: it bootstraps .venv.
SHELL := /bin/bash
.DEFAULT_GOAL := help
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export PYTHONDONTWRITEBYTECODE := 1
# SAM CLI and checkov phone home by default; this machine (and CI) has no internet.
export SAM_CLI_TELEMETRY := 0

.PHONY: help setup test test-all lint clean

help:  ## list the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

setup: $(STAMP)  ## create .venv and install everything (torch, dev and test tools, d2ops editable)

$(STAMP): pyproject.toml src/requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch first and alone: pip takes these two from the machine's local wheel cache.
	$(BIN)/python -m pip install --quiet torch==2.14.1 torchvision==0.29.1
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

test: setup  ## run the whole test suite (everything but the `slow` marker)
	$(BIN)/pytest -m "not slow"

test-all: setup  ## the whole suite including `slow` checks
	$(BIN)/pytest

lint: setup  ## ruff, mypy, cfn-lint, sam validate --lint, checkov, hadolint
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/cfn-lint template.yaml
	$(BIN)/sam validate --lint --template template.yaml --region us-east-1
	$(BIN)/checkov --quiet --compact --skip-download --framework cloudformation --file template.yaml
	find containers -name Dockerfile -print0 | xargs -0 -r $(BIN)/hadolint

clean:  ## remove build output (keeps .venv)
	rm -rf .aws-sam build dist .pytest_cache .mypy_cache .ruff_cache
