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

.PHONY: install demo test ui check-defs bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip 2>&1 | grep -v "is ignored" || true
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test]' 2>&1 | grep -v "is ignored" || true
	$(PY) -c "import eagle3_dagster, dagster, great_expectations, polars, transformers" 
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/eagle3 demo

test: $(STAMP)
	$(PY) -m pytest -q

ui: $(STAMP)
	$(VENV)/bin/eagle3 ui

check-defs: $(STAMP)
	cd $(CURDIR) && $(VENV)/bin/dg check defs

bench: $(STAMP)
	for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf data .dagster_home
