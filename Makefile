# d2ops developer entry points. `make test` works on a fresh clone: it bootstraps .venv.
SHELL := /bin/bash
.DEFAULT_GOAL := help
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
NODE_STAMP := tools/node_modules/.installed
# Tools that pin half the world get an environment each (tools/envs/<name>.lock, hash-checked): checkov
# (urllib3==1.26, packaging<24) and the Label Studio server (Django and much else) cannot share .venv with
# label-studio-sdk and Ray Serve. .venv-tools/<name>/bin/<tool>; docs/operations.md.
TOOLS_DIR := .venv-tools
TOOL_ENVS := checkov label-studio
TOOL_STAMPS := $(foreach t,$(TOOL_ENVS),$(TOOLS_DIR)/$(t)/.installed)
# Label Studio's empty database, migrated once (90-140 s here); every server starts from a copy (~10 s).
LS_MIGRATED := $(TOOLS_DIR)/label-studio/d2ops-migrated-db/label_studio.sqlite3
CHECKOV := $(TOOLS_DIR)/checkov/bin/checkov
# detectron2 (not on PyPI): from a wheel directory when there is one, else from the pinned upstream
# commit (the same ARG DETECTRON2_COMMIT as containers/training/Dockerfile), else not at all.
D2_STAMP := $(VENV)/.detectron2
D2OPS_WHEELS ?= ../shared/wheels
DETECTRON2_COMMIT := $(shell sed -n 's|^ARG DETECTRON2_COMMIT=||p' containers/training/Dockerfile)
export PYTHONDONTWRITEBYTECODE := 1
# SAM CLI and checkov phone home by default; this machine (and CI) has no internet.
export SAM_CLI_TELEMETRY := 0

.PHONY: help setup test test-all lint clean

help:  ## list the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

# setup = install + the self-check; the demo needs less of it and checks only that (make demo).
setup: install  ## create .venv and install everything (torch, detectron2, dev and test tools, Chromium, a JDK, Node tools), then check them
	@$(BIN)/python -m d2ops.setup_check --wheels $(D2OPS_WHEELS)

.PHONY: install
install: $(STAMP) $(D2_STAMP) $(NODE_STAMP) $(TOOL_STAMPS) $(LS_MIGRATED) | system-packages

# touch: an existing template (idempotent: no migration) stays newer than the environment's stamp.
$(LS_MIGRATED): $(TOOLS_DIR)/label-studio/.installed | $(STAMP)
	$(BIN)/python -m d2ops.labelling.studio_server migrate
	touch $@

# Debian's packages the suite needs, installed with apt-get where missing (root, as in CI, or sudo -n):
# Chromium for the console's browser tests (Playwright drives it through executable_path: no Playwright
# browser download), a JDK for TorchServe (javac compiles its /ping plugin once), Node.js for the
# asl-validator. d2ops.setup_check (run by the system Python: the venv may not exist yet) says which are
# missing, looking where the tests look. No stamp: each `make setup` looks again, so a package removed
# later comes back. Where none can be installed, setup's self-check names what is still missing and fails.
.PHONY: system-packages
system-packages:
	@missing=$$(PYTHONPATH=src $(PYTHON) -m d2ops.setup_check --debian-packages); \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ]; then sudo=""; elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then \
	  sudo="sudo -n"; \
	else echo "system packages missing: $$missing (install them as root)"; exit 0; fi; \
	if ! command -v apt-get >/dev/null 2>&1; then \
	  echo "system packages missing: $$missing (no apt-get here: install their equivalents)"; exit 0; fi; \
	echo "installing Debian's $$missing (apt-get)"; \
	$$sudo apt-get update -qq && $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null

# One tool environment from its lock; a changed lock rebuilds it from scratch (no stale packages).
$(TOOLS_DIR)/%/.installed: tools/envs/%.lock
	rm -rf $(TOOLS_DIR)/$*
	$(PYTHON) -m venv $(TOOLS_DIR)/$*
	$(TOOLS_DIR)/$*/bin/python -m pip install --quiet --upgrade pip
	$(TOOLS_DIR)/$*/bin/python -m pip install --quiet --require-hashes --no-deps -r $<
	touch $@

# Node tools the tests run (asl-validator checks the substituted state machine definition).
$(NODE_STAMP): tools/package.json tools/package-lock.json | system-packages
	cd tools && npm ci --no-audit --no-fund --loglevel=error
	touch $@

# The locks (`make pins`) constrain the install: the tests run the versions the layer and the images ship.
$(STAMP): pyproject.toml src/requirements.txt $(PIN_LOCKS) | system-packages
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch first and alone: pip takes these two from the machine's local wheel cache.
	$(BIN)/python -m pip install --quiet torch==2.14.1 torchvision==0.29.1
	PYTHONPATH=src $(BIN)/python -m d2ops.pins constraints > $(VENV)/constraints.txt
	$(BIN)/python -m pip install --quiet -e '.[dev]' -c $(VENV)/constraints.txt
	# Compile the TorchServe /ping plugin once here, not inside the first endpoint start.
	$(BIN)/python -c "from model_code.serving.launch import plugins_dir; print(plugins_dir())"
	touch $@

# Its own stamp, so `make setup` on an existing .venv installs it too; a new wheel (or a new pin)
# re-runs it. Where it cannot be installed the torchvision trainer remains and setup still succeeds
# (`rm $(D2_STAMP)` to try again). setuptools<81: detectron2.model_zoo imports pkg_resources. Its
# requirements at the training lock's versions (the constraints $(STAMP) wrote).
$(D2_STAMP): $(STAMP) containers/training/Dockerfile $(wildcard $(D2OPS_WHEELS)/detectron2-*.whl)
	@if ls $(D2OPS_WHEELS)/detectron2-*.whl >/dev/null 2>&1; then \
	  echo "detectron2: installing from $(D2OPS_WHEELS)"; \
	  $(BIN)/python -m pip install --quiet --find-links $(D2OPS_WHEELS) detectron2==0.6 'setuptools<81' \
	    -c $(VENV)/constraints.txt || exit 1; \
	elif timeout 20 git ls-remote https://github.com/facebookresearch/detectron2.git HEAD >/dev/null 2>&1; then \
	  echo "detectron2: building commit $(DETECTRON2_COMMIT) from GitHub (a few minutes)"; \
	  $(BIN)/python -m pip install --quiet 'setuptools<81' -c $(VENV)/constraints.txt && \
	  MAX_JOBS=$${MAX_JOBS:-2} $(BIN)/python -m pip install --quiet --no-build-isolation -c $(VENV)/constraints.txt \
	    "detectron2 @ git+https://github.com/facebookresearch/detectron2.git@$(DETECTRON2_COMMIT)" || exit 1; \
	else \
	  echo "detectron2: not installed (no detectron2 wheel in $(D2OPS_WHEELS), which D2OPS_WHEELS can point elsewhere, and GitHub is unreachable); the torchvision trainer remains"; \
	fi
	$(BIN)/python -m pip check
	touch $@

test: setup  ## run the whole test suite (everything but the `slow` marker), with coverage and its floor
	$(BIN)/pytest -m "not slow" --cov --durations=25

test-all: setup  ## the whole suite including `slow` checks
	$(BIN)/pytest

lint: setup  ## ruff, mypy, import-linter (package boundaries), the generated ASL is current, cfn-lint, sam validate --lint, checkov, hadolint
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python -m d2ops.statemachine --check
	$(BIN)/python -m d2ops.import_contracts --no-logo  # lint-imports, the handler packages added from template.yaml
	$(BIN)/cfn-lint template.yaml
	$(BIN)/sam validate --lint --template template.yaml --region us-east-1
	$(CHECKOV) --quiet --compact --skip-download --framework cloudformation --file template.yaml
	find containers -name Dockerfile -print0 | xargs -0 -r $(BIN)/hadolint

# --- supply chain (issue 31) ------------------------------------------------------------
# Hash-checked locks of the Python dependencies (uv, from PyPI), each later lock constrained by the
# earlier ones so all agree on what they share; the layer's and the functions' for Lambda's platform
# (manylinux2014, wheels only), the functions' copied to each functions/<name>/requirements.txt. `make locks` re-locks after an input changed, keeping the other versions; `make pins`
# also upgrades every package within its range and re-resolves each base image tag's digest (needs
# PyPI and the registries). Then `make setup` installs the new versions here. docs/operations.md.
PIN_LOCKS := src/requirements.lock functions/requirements.lock containers/serving/requirements.lock \
  containers/training/requirements.lock
UV_COMPILE = $(BIN)/uv pip compile --no-config --quiet --generate-hashes --python-version 3.11 \
  --index-url https://pypi.org/simple --custom-compile-command "make pins" $(PINS_UPGRADE)

# First the development environment is resolved (not installed, not committed: build/pins/): the dev
# extras with what the images need, detectron2's requirements included, as `make setup` installs them.
# The packages `make setup` constrains follow it (d2ops.pins dev-ceiling), so no lock passes a cap the
# developer tools set (aws-sam-cli's translator pins pydantic ~=2.13.3) and `make setup` still
# resolves. Without PINS_UPGRADE that resolution is held to today's locked versions.
PINS_DIR := build/pins
.PHONY: locks pins
locks:  ## re-lock the layer's, functions' and images' Python dependencies after an input changed (keeps other versions)
	@mkdir -p $(PINS_DIR)
	PYTHONPATH=src $(BIN)/python -m d2ops.pins constraints | sed 's/  #.*//' > $(PINS_DIR)/current.txt
	$(BIN)/uv pip compile --no-config --quiet --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
	  --index-url https://pypi.org/simple $(if $(PINS_UPGRADE),,-c $(PINS_DIR)/current.txt) \
	  pyproject.toml --extra dev containers/serving/requirements.txt containers/training/requirements.txt \
	  -o $(PINS_DIR)/dev-resolution.txt
	PYTHONPATH=src $(BIN)/python -m d2ops.pins dev-ceiling $(PINS_DIR)/dev-resolution.txt > $(PINS_DIR)/dev-ceiling.txt
	$(UV_COMPILE) --python-platform x86_64-manylinux2014 --only-binary :all: -c $(PINS_DIR)/dev-ceiling.txt \
	  src/requirements.txt -o src/requirements.lock
	$(UV_COMPILE) --python-platform x86_64-manylinux2014 --only-binary :all: -c src/requirements.lock \
	  functions/requirements.in -o functions/requirements.lock
	for fn in functions/*/requirements.txt; do cp functions/requirements.lock $$fn; done
	$(UV_COMPILE) --python-platform x86_64-manylinux_2_28 -c $(PINS_DIR)/dev-ceiling.txt -c src/requirements.lock \
	  -c functions/requirements.lock containers/serving/requirements.txt -o containers/serving/requirements.lock
	$(UV_COMPILE) --python-platform x86_64-manylinux_2_28 -c $(PINS_DIR)/dev-ceiling.txt -c src/requirements.lock \
	  -c functions/requirements.lock -c containers/serving/requirements.lock \
	  containers/training/requirements.txt -o containers/training/requirements.lock
	for t in $(TOOL_ENVS); do $(UV_COMPILE) --python-platform x86_64-manylinux_2_28 tools/envs/$$t.in \
	  -o tools/envs/$$t.lock; done

pins:  ## refresh the pins: upgrade the locks within their ranges and re-resolve the base images' digests
	$(MAKE) locks PINS_UPGRADE=--upgrade
	PYTHONPATH=src $(BIN)/python -m d2ops.pins digests

# The state machine definitions are generated from src/d2ops/statemachine/ (edit the Python, not the JSON).
.PHONY: asl
asl:  ## write statemachine/*.asl.json and its stage table (d2ops_core) from the typed definition in src/d2ops/statemachine/
	$(BIN)/python -m d2ops.statemachine

# --- dataset validation (issue 2) -------------------------------------------------------
.PHONY: bench-validate
bench-validate: setup  ## validator vs pycocotools COCO() on a train2017-sized file (time, peak RSS)
	$(BIN)/python -m d2ops.bench.validate --workdir build/bench-validate

.PHONY: bench-validate-scale
bench-validate-scale: setup  ## every image of an Open-Images-shaped version: offline Distributed Map vs one Lambda (images/s, RSS, 1.7 M modelled)
	nice -n 10 $(BIN)/python -m d2ops.bench.validate_scale

# --- evaluation (issue 13) --------------------------------------------------------------
.PHONY: bench-eval
bench-eval: setup  ## our bbox evaluation (faster-coco-eval) vs pycocotools COCOeval on val2017-sized data (time, stats)
	nice -n 10 $(BIN)/python -m d2ops.bench.eval --workdir build/bench-eval

# --- the gate's statistics (issue 22) -----------------------------------------------------
.PHONY: bench-gate
bench-gate: setup  ## the quality gate's decision (approve/review/refuse) against the true AP difference on simulated detections; docs/images/gate-bench.png (about 30 min on 2 cores)
	nice -n 10 $(BIN)/python -m d2ops.bench.gate

# --- serving (issue 4) ------------------------------------------------------------------
.PHONY: bench-serve
bench-serve: setup  ## artifact forms vs the eager model (in-process), each server vs TorchServe (/invocations, concurrency 1/8, batching on/off): p50/p99, req/s, ratios
	nice -n 10 $(BIN)/python -m d2ops.bench.serve $(BENCH_SERVE_ARGS)

# --- status API (issue 12) --------------------------------------------------------------
.PHONY: bench-status-api
bench-status-api: setup  ## status API requests/s in-process against moto: boto3 clients per request vs reused
	$(BIN)/python -m d2ops.bench.status_api

# --- endpoint monitoring (issue 32) --------------------------------------------------------
.PHONY: bench-monitor
bench-monitor: setup  ## windows of 10,000 captured records the monitor judges per second and peak RSS, vs pandas.read_json on the same records
	nice -n 10 $(BIN)/python -m d2ops.bench.monitor --workdir build/bench-monitor

# --- training (issue 3) -----------------------------------------------------------------
.PHONY: bench-train test-training-slow
bench-train: setup  ## CPU training images/s, detectron2 vs torchvision (the baseline) on the same data, and the ratio
	$(BIN)/python -m d2ops.bench.train --workdir build/bench-train

.PHONY: bench-calibrate
bench-calibrate: setup  ## CPU profile: the largest learning rate that still converges (margin) and several seeds
	$(BIN)/python -m d2ops.bench.calibrate --workdir build/bench-calibrate

test-training-slow: setup  ## the longer, better-converged training run (marker `slow`)
	$(BIN)/pytest -m slow tests/integration/test_training_slow.py

clean:  ## remove build output (keeps .venv)
	rm -rf .aws-sam build dist .pytest_cache .mypy_cache .ruff_cache

# ---------------------------------------------------------------- container images
# Build the training and serving images and push them to ECR in your account. Needs Docker
# and AWS credentials (so it cannot run on an offline machine). Override any of these:
#   make images AWS_REGION=eu-west-1 IMAGE_TAG=v3
# The build context is the repository root: the images install d2ops from src/ and copy
# model_code/. --provenance=false keeps a plain image manifest, which SageMaker requires.
# $(call once,VAR,command): run the command when VAR is first used (not on every make run), once.
once = $(eval $1 := $(shell $2))$($1)
AWS_REGION ?= $(call once,AWS_REGION,aws configure get region || echo us-east-1)
AWS_ACCOUNT_ID ?= $(call once,AWS_ACCOUNT_ID,aws sts get-caller-identity --query Account --output text)
# Tags are immutable in ECR: the commit, plus a timestamp when the working tree has changes.
IMAGE_TAG ?= $(call once,IMAGE_TAG,git describe --always --exclude='*' --dirty=-dirty$(shell date -u +%Y%m%d%H%M%S))
ECR_REGISTRY = $(AWS_ACCOUNT_ID).dkr.ecr.$(AWS_REGION).amazonaws.com
IMAGES := training serving
# Both images start FROM public images (NVIDIA's CUDA image, python:3.11-slim): only ECR needs a login.

.PHONY: images
images:  ## build and push the training and serving images to ECR (needs Docker and AWS credentials)
	aws ecr get-login-password --region $(AWS_REGION) | docker login --username AWS --password-stdin $(ECR_REGISTRY)
	set -e; for name in $(IMAGES); do \
	  aws ecr describe-repositories --region $(AWS_REGION) --repository-names d2ops-$$name >/dev/null 2>&1 || \
	    aws ecr create-repository --region $(AWS_REGION) --repository-name d2ops-$$name \
	      --image-scanning-configuration scanOnPush=true --image-tag-mutability IMMUTABLE >/dev/null; \
	  if aws ecr describe-images --region $(AWS_REGION) --repository-name d2ops-$$name \
	      --image-ids imageTag=$(IMAGE_TAG) >/dev/null 2>&1; then \
	    echo "d2ops-$$name:$(IMAGE_TAG) is already in ECR"; continue; fi; \
	  docker build --platform linux/amd64 --provenance=false \
	    -f containers/$$name/Dockerfile -t $(ECR_REGISTRY)/d2ops-$$name:$(IMAGE_TAG) . ; \
	  docker push $(ECR_REGISTRY)/d2ops-$$name:$(IMAGE_TAG); \
	done
	@echo "Deploy with: sam deploy --guided --parameter-overrides" \
	  "TrainingImageUri=$(ECR_REGISTRY)/d2ops-training:$(IMAGE_TAG)" \
	  "ServingImageUri=$(ECR_REGISTRY)/d2ops-serving:$(IMAGE_TAG)"

# ---------------------------------------------------------------- offline runtime (issue 6)
# The whole pipeline on this machine: synthetic dataset -> local S3 -> trigger -> train ->
# evaluate -> gate -> register -> local TorchServe endpoint -> prediction. Unattended: the one run has
# no champion, so the gate never asks for a person's review. Pass more options with DEMO_ARGS, e.g.
# `make demo DEMO_ARGS=--twice` (a refusal and a promotion) or `DEMO_ARGS=--review` (a review decided
# with `d2ops approve`).
DEMO_ARGS ?=
.PHONY: demo
demo: install  ## the whole pipeline offline on a synthetic dataset (bootstraps a fresh clone first)
	@$(BIN)/python -m d2ops.setup_check --for demo --wheels $(D2OPS_WHEELS)
	$(BIN)/python -m d2ops demo $(DEMO_ARGS)
