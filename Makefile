# The two commands a newcomer needs: `make demo` and `make test`. Both set everything up.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# the older SGLang releases' tokenizer_manager.py the schema lane reads (scripts/sglang_releases.py)
SGLANG_RELEASES := $(VENV)/sglang-releases/.fetched

export DAGSTER_HOME ?= $(CURDIR)/.dagster_home
export EAGLE3_MODEL ?= kimi-k2.5
# Use the tokenizer from ../shared when it is there (offline); otherwise the profile's own location.
# The same defaults as eagle3_dagster/config.py project_env_defaults, which `eagle3` applies in a plain
# shell (tests/test_cli_plain_shell.py checks the two agree).
SHARED_TOKENIZER := $(abspath $(CURDIR)/../shared/tokenizers/$(EAGLE3_MODEL))
ifneq ($(wildcard $(SHARED_TOKENIZER)),)
export EAGLE3_TOKENIZER ?= $(SHARED_TOKENIZER)
export HF_HUB_OFFLINE ?= 1
endif

.PHONY: install instance bytecode services demo test test-full test-fast lint ruff typecheck format-check format constraints ui \
	check-defs bench backfill clean docs gpu-smoke

# The project with the simulator (sim), the test tools (test), lint / type check / pre-commit (dev) and the
# SpecForge lane (specforge: a CPU torch==2.13.0 and what specforge.data imports), the real sglang-router and
# smg (router: tests/generate/test_sglang_router.py and test_smg.py start them in front of simulator workers), the speculators
# lane (speculators: what vllm speculators' package import needs on CPU, with the SpecForge torch;
# tests/publish/test_speculators_lane.py, docs/exports.md), the SGLang
# schema lane (sglang_schema: what SGLang's request/response code needs on CPU, with the SpecForge torch;
# tests/generate/test_sglang_schema.py, docs/sglang-schema.md) and the docs site (docs: MkDocs Material,
# `make docs`).
EXTRAS := test,sim,dev,specforge,speculators,router,sglang_schema,docs
# What constraints.txt pins: everything but the SpecForge lane (torch comes from local disk, never a resolve).
CONSTRAINT_EXTRAS := test,sim,dev,k8s,router,sglang_schema,speculators,docs
# Reproducible installs: every package pinned to the versions in constraints.txt (`make constraints` refreshes it).
CONSTRAINTS := constraints.txt
PIP_INSTALL := $(PY) -m pip install -q --disable-pip-version-check
# Installs go through uv (parallel downloads and unpacking, bytecode compiled on both cores): about half of pip's
# time here. uv reads no pip.conf: scripts/uv_install.py hands it pip's configured indexes, find-links and constraints.
UV_INSTALL := $(PY) scripts/uv_install.py

$(STAMP): pyproject.toml $(CONSTRAINTS)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@# pip's own failures fail the target (pipefail); only the notes about absent local indexes are filtered.
	set -o pipefail; $(PIP_INSTALL) -c $(CONSTRAINTS) uv 2>&1 | { grep -v "is ignored" || true; }
	$(UV_INSTALL) -c $(CONSTRAINTS) -e '.[$(EXTRAS)]'
	@# SpecForge lane: its data code only; --no-deps because its pins pull sglang and a CUDA torch.
	$(UV_INSTALL) --no-deps specforge==0.2.0
	@# speculators lane: its data preparation only; --no-deps because its pins pull torchvision, torchaudio and
	@# an older transformers and datasets (hs-connectors, which its import needs, is pure Python on the lane's torch).
	$(UV_INSTALL) --no-deps speculators==0.9.0 hs-connectors==0.9.0
	@# SGLang schema lane: SGLang's own request/response code only; --no-deps because its pins pull CUDA
	@# torch, triton and the GPU kernels (the lane loads what it checks without them: docs/sglang-schema.md).
	$(UV_INSTALL) --no-deps sglang==0.5.23
	$(PY) -c "import eagle3_dagster, dagster, great_expectations, polars, transformers, aiohttp"
	@# the gateways the router tests start (test_sglang_router.py, test_smg.py skip without them)
	$(PY) -c "import sglang_router" && test -x $(VENV)/bin/smg
	$(PY) -c "import specforge.data.preprocessing, specforge.data.prompt_builder"
	$(PY) -c "import speculators.cli.prepare_data, speculators.data_generation.preprocessing"
	PYTHONPATH=tests/generate $(PY) -c "import sglang_source; sglang_source.load()"
	@# torch only for the SpecForge lane, and only the CPU 2.13.0 build from local disk (a CUDA build is GBs)
	@$(PY) -c "import importlib.metadata as m, sys; v = m.version('torch'); sys.exit(0 if v.startswith('2.13.0') else f'torch {v} got installed, expected the local CPU 2.13.0 build: find what pulled it in (pip show torch)')"
	touch $(STAMP)

# The schema lane also checks the simulator's acceptance-figure names against each older SGLang release's own
# tokenizer_manager.py: the official wheels, fetched with pip (--no-deps, about 50 MB, ~10 s), one file of each
# kept under .venv/sglang-releases/ (docs/sglang-schema.md).
$(SGLANG_RELEASES): $(STAMP) scripts/sglang_releases.py
	$(PY) scripts/sglang_releases.py
	touch $(SGLANG_RELEASES)

install: $(STAMP) $(SGLANG_RELEASES)

# Re-resolve every dependency (newest versions pyproject.toml allows) in a throwaway venv and write
# constraints.txt from it; commit the result. `make install` then reinstalls from the new pins.
constraints:
	rm -rf .constraints-venv
	$(PYTHON) -m venv .constraints-venv
	set -o pipefail; .constraints-venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip 2>&1 | { grep -v "is ignored" || true; }
	set -o pipefail; .constraints-venv/bin/python -m pip install -q --disable-pip-version-check -e '.[$(CONSTRAINT_EXTRAS)]' 2>&1 | { grep -v "is ignored" || true; }
	@! .constraints-venv/bin/python -m pip show -q torch 2>/dev/null || { echo "torch got resolved: refusing to pin it"; exit 1; }
	{ echo "# Pinned versions of every dependency of '.[$(CONSTRAINT_EXTRAS)]' (Python $$(.constraints-venv/bin/python -c 'import platform; print(platform.python_version())'), Linux)."; \
	  echo "# Written by \`make constraints\` (pip freeze of a fresh resolve); \`make install\` installs with -c this file."; \
	  .constraints-venv/bin/python -m pip freeze --exclude-editable; } > $(CONSTRAINTS).tmp
	mv $(CONSTRAINTS).tmp $(CONSTRAINTS)
	rm -rf .constraints-venv
	@echo "$(CONSTRAINTS): $$(grep -vc '^#' $(CONSTRAINTS)) pinned packages"

# Every EAGLE3_* setting and source YAML validated (one line per problem, exit 2), then the
# project-local Dagster instance (SQLite, concurrency pool limits) created once, under a file lock.
instance: $(STAMP)
	$(VENV)/bin/eagle3 check

demo: instance bytecode
	$(VENV)/bin/eagle3 demo

# This environment sets PYTHONDONTWRITEBYTECODE=1, so an import never caches the project's own modules: every
# process (a simulator, a run worker, a demo) would compile them again. pip compiled the installed packages;
# this compiles ours (only what changed since the last time; a stale file is never used, Python checks).
bytecode: $(STAMP)
	$(PY) -m compileall -q -j 0 eagle3_dagster tests > /dev/null

# OS packages the reliability tests drive: PostgreSQL (throwaway clusters) and Debian's Chromium.
# Installs them with apt-get when missing and root; not root: warns, and the tests that need them skip.
services:
	bash scripts/ci-services.sh

# Lint and format check run before the tests, the type check beside them (`make lint` runs the three alone;
# `make format` rewrites the tree).
ruff: $(STAMP)
	$(VENV)/bin/ruff check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy

format-check: $(STAMP)
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff format .

lint: ruff typecheck format-check

# The docs site under docs/ (mkdocs.yml) into .site/: first the generated reference pages are compared with
# what the code says (eagle3_dagster/devtools/docs_gen.py; `$(PY) -m eagle3_dagster.devtools.docs_gen` rewrites them), then
# `mkdocs build --strict` fails on any warning (a broken link, a page missing from the nav).
docs: $(STAMP)
	$(PY) -m eagle3_dagster.devtools.docs_gen --check
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet -d .site

# Two lanes (tests/serial_lane.py), run at the same time. The serial lane runs in the foreground, one test
# after another: the tests marked `serial` (wall-clock bounds on waits, stalls and timeouts, signals to
# process groups, the browser, the session's `eagle3 ui`). It keeps about one core busy. The parallel lane
# runs beside it on what is left: in a session of its own at the lowest CPU priority (nice 19, its scheduler
# group too, and every session it starts: tests/background/sitecustomize.py), so the serial lane's bounds
# see a quiet machine. Its report follows the serial lane's (it is written to PARALLEL_LOG meanwhile).
# The parallel lane runs in TEST_WORKERS pytest-xdist processes: most slow tests wait on the processes they
# start (simulator, Dagster, Postgres, moto), so 3 workers keep 2 cores busy. --dist loadfile keeps a module
# on one worker, so a module-scoped simulator or Dagster deployment is built once. Every test has its own tmp
# dirs and free ports: the workers share nothing. The longest modules are handed out first (LONG_MODULES in
# tests/serial_lane.py), so none runs alone at the end (--no-loadscope-reorder: xdist would otherwise hand
# out the modules with the most tests first). (Not --dist loadgroup with an xdist_group: with pytest 9.2
# xdist 3.8 silently ignores the groups, pytest-xdist issue 1386.) Both lanes always run; either failing
# fails the target; Ctrl-C stops both.
TEST_WORKERS ?= 3
# `make test` leaves out the tests marked `full` (a whole deployment for minutes: the real daemon's night and
# backfill, the GPU script's run); `make test-full` runs the same two lanes with them.
NOT_FULL ?= and not full
PARALLEL_LOG := .pytest-parallel-lane.log
# The type check (mypy, about a minute on one core) runs beside the lanes in the parallel lane's place (lowest
# priority, a session of its own): alone first, it would leave the other core idle. Its report comes last.
TYPECHECK_LOG := .mypy-beside-tests.log
test: install instance bytecode services ruff format-check docs
	@echo "[test] the parallel lane and mypy run beside the serial lane at the lowest CPU priority; their reports follow (logs: $(PARALLEL_LOG), $(TYPECHECK_LOG))"
	rc=0; \
	EAGLE3_TEST_BACKGROUND=1 PYTHONPATH=$(CURDIR)/tests/background nice -n 19 setsid \
	  $(VENV)/bin/mypy > $(TYPECHECK_LOG) 2>&1 & typecheck=$$!; \
	EAGLE3_TEST_BACKGROUND=1 PYTHONPATH=$(CURDIR)/tests/background nice -n 19 setsid \
	  $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not serial $(NOT_FULL)" --durations=30 \
	  > $(PARALLEL_LOG) 2>&1 & lane=$$!; \
	trap 'kill -TERM -- -$$lane -$$typecheck 2>/dev/null; exit 130' INT TERM; \
	$(PY) -m pytest -q -m "serial $(NOT_FULL)" --durations=30 || rc=1; \
	wait $$lane || rc=1; \
	echo "[test] the parallel lane:"; cat $(PARALLEL_LOG); \
	wait $$typecheck || rc=1; \
	echo "[test] mypy:"; cat $(TYPECHECK_LOG); \
	exit $$rc

# Everything `make test` runs and the `full` tests (tests/serial_lane.py says which): before a release, nightly.
test-full:
	$(MAKE) test NOT_FULL=

# In-process tests only: no simulator, Dagster or other child process, no apt, no Postgres/Chromium
# (pytest -m "not integration"; tests/conftest.py fails a test that starts a process without the marker,
# in an xdist worker as in a plain run). CPU-bound: one worker per core, then the serial lane's own.
test-fast: install instance bytecode ruff format-check typecheck docs
	rc=0; \
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder -m "not integration and not serial" || rc=1; \
	$(PY) -m pytest -q -m "serial and not integration" || rc=1; \
	exit $$rc

# `make ui PORT=3311` for another port (the same as `eagle3 ui --port 3311` from a plain shell).
PORT ?= 3000
ui: instance
	$(VENV)/bin/eagle3 ui --port $(PORT)

check-defs: instance
	cd $(CURDIR) && $(VENV)/bin/dg check defs

# The whole graph against EAGLE3_SGLANG_URL (a server, a router or `eagle3-sim`): ingest, every shard, the
# snapshot (only when every shard passed; ARGS=--allow-partial publishes the others), the report last.
backfill: instance
	$(VENV)/bin/eagle3 backfill $(ARGS)

# The GPU lane (docs/real-sglang.md): a real SGLang server (its own venv) with the local Qwen3-family model at
# EAGLE3_GPU_MODEL_PATH, the demo through it, one JSON line. Without a CUDA GPU: one line, exit 0.
gpu-smoke: $(STAMP)
	bash scripts/gpu-smoke.sh

bench: $(STAMP)
	for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf data .dagster_home .site
