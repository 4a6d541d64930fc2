# The two commands a newcomer needs: `make demo` and `make test`. Both set everything up.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

export DAGSTER_HOME ?= $(CURDIR)/.dagster_home
export EAGLE3_MODEL ?= kimi-k2.5
# Use the tokenizer from ../shared when it is there (offline); otherwise the profile's own location.
SHARED_TOKENIZER := $(abspath $(CURDIR)/../shared/tokenizers/$(EAGLE3_MODEL))
ifneq ($(wildcard $(SHARED_TOKENIZER)),)
export EAGLE3_TOKENIZER ?= $(SHARED_TOKENIZER)
export HF_HUB_OFFLINE ?= 1
endif

.PHONY: install instance services demo test ui check-defs bench backfill clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@# pip's own failures fail the target (pipefail); only the notes about absent local indexes are filtered.
	set -o pipefail; $(PY) -m pip install -q --disable-pip-version-check --upgrade pip 2>&1 | { grep -v "is ignored" || true; }
	set -o pipefail; $(PY) -m pip install -q --disable-pip-version-check -e '.[test]' 2>&1 | { grep -v "is ignored" || true; }
	$(PY) -c "import eagle3_dagster, dagster, great_expectations, polars, transformers"
	touch $(STAMP)

install: $(STAMP)

# Every EAGLE3_* setting and source YAML validated (one line per problem, exit 2), then the
# project-local Dagster instance (SQLite, concurrency pool limits) created once, under a file lock.
instance: $(STAMP)
	$(VENV)/bin/eagle3 check

demo: instance
	$(VENV)/bin/eagle3 demo

# OS packages the reliability tests drive: PostgreSQL (throwaway clusters) and Debian's Chromium.
# Installs them with apt-get when missing (needs root), else does nothing.
services:
	bash scripts/ci-services.sh

test: instance services
	$(PY) -m pytest -q

ui: instance
	$(VENV)/bin/eagle3 ui

check-defs: instance
	cd $(CURDIR) && $(VENV)/bin/dg check defs

# One dg launch run per shard, then a snapshot. Needs EAGLE3_SGLANG_URL (a server or `eagle3-sim`).
backfill: instance
	@test -n "$$EAGLE3_SGLANG_URL" || { echo "set EAGLE3_SGLANG_URL (e.g. run .venv/bin/eagle3-sim --port 30000 and use http://127.0.0.1:30000)"; exit 2; }
	$(VENV)/bin/dg launch --job ingest
	for s in $$(seq 0 $$(( $${EAGLE3_N_SHARDS:-4} - 1 ))); do \
	  $(VENV)/bin/dg launch --job shard_pipeline --partition $$(printf %04d $$s) || exit 1; done
	$(VENV)/bin/dg launch --assets training_dataset

bench: $(STAMP)
	for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf data .dagster_home
