"""What `eagle3 check` finds wrong before anything runs: every problem, one line each, none hidden behind another.

Source YAMLs (every bad field of every file), the source files they name (local ones: a missing file fails
the ingest otherwise, and their first records must make prompts in the YAML's `format`), the model profile
EAGLE3_MODEL names and its tokenizer (it must load), the data and work dirs (writable), and the configured
SGLang endpoints (they answer, as SGLang, to our key, and serve the profile's model: what each server, or
each worker behind a router, names in /model_info, as the run judges it; EAGLE3_SERVED_MODEL pins another). `run_check` is the command: it prints what the plain functions return and, when
nothing is wrong, writes the Dagster instance sized from the fleet.
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from ..generate.fleet_capacity import endpoint_problems, served_model_problems, served_model_warnings
from ..ingest.errors import IngestFileError
from ..ingest.pipeline import first_records_problem
from ..ingest.remote import is_remote
from ..ingest.spec import SourceSpec, read_source_specs

if TYPE_CHECKING:
    from ..config import Settings
    from ..generate.fleet_capacity import EndpointCapacity
    from ..generate.served_model import ExpectedModel
    from ..orchestration.pools import PoolSizing


def source_problems(sources_dir: Path) -> tuple[list[SourceSpec], list[str]]:
    """The valid specs, and a line per problem: each bad field of each YAML, each local source file missing,
    each local source whose first records make no prompt in its `format`."""
    loaded, problems = read_source_specs(sources_dir)
    for yaml_file, spec in loaded:
        if is_remote(spec.path):
            continue  # listing a bucket needs its credentials and the network: the ingest names a missing one
        try:
            wrong = first_records_problem(spec)
        except IngestFileError as e:
            problems.append(f"{yaml_file}: field 'path': {str(e).removeprefix(f'source {spec.name!r}: ')}")
            continue
        if wrong:
            problems.append(f"{yaml_file}: {wrong}")
    return [spec for _, spec in loaded], problems


def model_problems(s: Settings) -> list[str]:
    """A line when the model profile EAGLE3_MODEL names is not there or not valid, or when its tokenizer
    (EAGLE3_TOKENIZER when set, else the profile's `tokenizer`) does not load; [] when both do."""
    from ..profiles import ProfileError, active_profile
    from ..tokenize.loading import TokenizerLoadError, load_tokenizer

    try:
        profile = active_profile(s.model.name, s.storage.models_dir, s.model.tokenizer_override)
    except ProfileError as e:
        return [f"EAGLE3_MODEL {s.model.name!r}: {one_line(str(e))}"]
    where = "EAGLE3_TOKENIZER" if s.model.tokenizer_override else f"the tokenizer of model profile {profile.name!r}"
    try:
        load_tokenizer(profile.tokenizer, trust_remote_code=profile.trust_remote_code)
    except TokenizerLoadError as e:
        return [f"{where} {profile.tokenizer!r} does not load: {one_line(str(e))}"]
    return []


def one_line(text: str) -> str:
    """An error's whole text on one line (a library's message may run over several)."""
    return " ".join(text.split())


def writable_dir_problem(setting: str, folder: Path) -> str | None:
    """None when the run can write in `folder`, else the line that says why not. Nothing is created: a
    missing folder is judged by the nearest existing one above it; an existing one by writing a probe file."""
    fix = f"point {setting} at a folder you can write to"
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{setting} {folder}: {existing} is a file, not a folder; {fix}"
    if existing != folder:
        if os.access(existing, os.W_OK | os.X_OK):
            return None
        return f"{setting} {folder}: cannot be created in {existing} (not writable); {fix}"
    probe = folder / f".eagle3-check-{uuid.uuid4().hex}"
    try:
        with open(probe, "wb") as f:
            f.write(b"eagle3 check\n")
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        return f"{setting} {folder}: not writable ({e.strerror or type(e).__name__}); {fix}"
    finally:
        probe.unlink(missing_ok=True)
    return None


def served_model_expected(s: Settings) -> ExpectedModel | None:
    """What every endpoint must serve, as the run judges it (generate/served_model.py): the active profile's
    model with the user's pin (EAGLE3_SERVED_MODEL). A profile that does not load (model_problems names it):
    the pin alone, or None (nothing to judge against)."""
    from ..generate.served_model import ExpectedModel
    from ..profiles import ProfileError, active_profile

    pin = s.model.served_model
    try:
        profile = active_profile(s.model.name, s.storage.models_dir, s.model.tokenizer_override)
    except ProfileError:
        return ExpectedModel("(no profile)").with_pin(pin) if pin else None
    return ExpectedModel.of(profile, pin)


def dead_endpoint_lines(s: Settings) -> list[str]:
    """At the start of an interactive run: a line per configured endpoint that does not answer as SGLang
    (3 s a probe) or serves another model than the profile's, so a wrong EAGLE3_SGLANG_URL is named before
    ingest and tokenize have run."""
    from ..generate.fleet_capacity import probe_fleet

    if not s.urls_configured:
        return []
    headers = {"Authorization": f"Bearer {s.fleet.api_key.reveal()}"} if s.fleet.api_key else None
    fleet = probe_fleet(s.fleet.urls, headers=headers)
    return endpoint_problems(fleet) + served_model_problems(fleet, served_model_expected(s))


def run_check(args: argparse.Namespace) -> int:
    """Validate settings, source YAMLs and files, the data dir and the endpoints; create the Dagster instance
    (make instance runs this). Every problem is one line; any problem: exit 2 and no instance written.

    The instance's `sglang` pool and run queue are sized from the fleet (orchestration/pools.py):
    each configured endpoint's max_running_requests from /server_info (a router: its workers', one line
    each router), and the prompts per shard of the last ingest when there is one. `--offline` skips the
    endpoint probe (the pool is then sized as for an unknown fleet). Each server (a router: each worker it
    lists that answers here) must serve the profile's model (its /model_info `model_type`, or the model_path
    EAGLE3_SERVED_MODEL pins), as the run requires: another model is a problem, naming both.
    """
    from ..config import settings
    from .instance import ensure_dagster_home, instance_yaml

    s = settings()
    specs, problems = source_problems(s.storage.sources_dir)
    problems += model_problems(s)
    dirs = [("EAGLE3_DATA_DIR", s.storage.data_dir.local_path)] if s.storage.data_dir.is_local else []
    dirs += [("EAGLE3_WORK_DIR", s.storage.work_dir)] if s.storage.work_dir not in [d for _, d in dirs] else []
    problems += [p for name, d in dirs if (p := writable_dir_problem(name, d))]
    sizing, routers, fleet = fleet_pool_sizing(s, probe=not args.offline)
    problems += endpoint_problems(fleet)
    expected = served_model_expected(s) if fleet else None  # --offline: nothing probed, nothing judged
    problems += served_model_problems(fleet, expected)
    for line in served_model_warnings(fleet, expected):
        print(f"eagle3 check: warning: {line}", file=sys.stderr)
    if problems:
        for line in problems:
            print(f"eagle3 check: error: {line}", file=sys.stderr)
        print(f"eagle3 check: {len(problems)} problem(s); nothing was written", file=sys.stderr)
        return 2
    home = ensure_dagster_home(
        s.dagster.home, instance_config=instance_yaml(sizing.pool_limit, sizing.max_concurrent_runs)
    )
    probed = "endpoints not probed (--offline)" if args.offline and s.urls_configured else ""
    print(
        f"eagle3 check: settings OK (model {s.model.name}, {s.shards.n_shards} shards, data {s.storage.data_dir}); "
        f"{len(specs)} source(s) OK; instance ready at {home}" + (f"; {probed}" if probed else "")
    )
    for line in routers:
        print(f"eagle3 check: {line}")
    own = (home / "dagster.yaml").read_text() == instance_yaml(sizing.pool_limit, sizing.max_concurrent_runs)
    print(f"eagle3 check: {sizing.describe()}" + ("" if own else "; NOT written: dagster.yaml is your own file"))
    return 0


def fleet_pool_sizing(s: Settings, *, probe: bool = True) -> tuple[PoolSizing, list[str], list[EndpointCapacity]]:
    """PoolSizing from the configured endpoints (probed unless `probe` is false) and the last ingest's
    prompts per shard, a line per router endpoint (its workers, their slots, any worker counted as the
    mean), and what each endpoint answered."""
    from ..generate.endpoint_info import display_url
    from ..generate.fleet_capacity import probe_fleet
    from ..orchestration.pools import size_pools
    from ..storage import parquet_num_rows

    routers: list[str] = []
    fleet: list[EndpointCapacity] = []
    if s.urls_configured and not probe:
        capacity: dict[str, int | None] = {display_url(u): None for u in s.fleet.urls}  # no credentials
    elif s.urls_configured:
        headers = {"Authorization": f"Bearer {s.fleet.api_key.reveal()}"} if s.fleet.api_key else None
        fleet = probe_fleet(s.fleet.urls, headers=headers)
        capacity = {c.endpoint: c.slots for c in fleet}
        routers = [c.describe() for c in fleet if c.workers is not None]
    else:  # `eagle3 demo` / `eagle3 ui` start their own simulator: nothing to probe yet
        capacity = {"the simulator eagle3 demo/ui starts": None}
    prompts = s.storage.data_dir / "prompts" / "prompts.parquet"
    per_shard = None
    if prompts.exists():
        per_shard = max(1, parquet_num_rows(prompts) // s.shards.n_shards)
    return size_pools(capacity, shard_requests=per_shard), routers, fleet
