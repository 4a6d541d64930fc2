"""`eagle3 plan`: what the next run will cost, before it runs (docs/plan.md).

Reads the source YAMLs (<EAGLE3_ASSETS_DIR>/sources), ingests and tokenizes them with the pipeline's own code
into a scratch folder (nothing generated), counts the requests already cached in the data dir, and
with a declared (`--tokens-per-s-per-server`) or probed throughput prints the ETA, GPU-hours and
disk. Writes the plan as JSON to <data dir>/plan/plan.json (and to `--json PATH`).

Exit status: 0 with a plan; 2 for a bad setting, flag, source, an endpoint that cannot be probed or one
that serves another model than the profile's (one line naming it; no probe request is sent).
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..config import Settings
    from ..generate.config import GenerationConfig
    from .build import Fleet


def _positive(args: argparse.Namespace) -> list[str]:
    problems = []
    for name in ("servers", "gpus_per_server", "probe_requests", "probe_max_new_tokens", "max_new_tokens"):
        v = getattr(args, name)
        if v is not None and v < 1:
            problems.append(f"--{name.replace('_', '-')} must be at least 1, got {v}")
    tps = args.tokens_per_s_per_server
    if tps is not None and not tps > 0:
        problems.append(f"--tokens-per-s-per-server must be positive, got {tps}")
    return problems


def _fleet(args: argparse.Namespace, s: Settings, config: GenerationConfig) -> Fleet:
    """The fleet as declared; with no throughput declared and no endpoint answering, the last measured one
    (one line says so), else as declared (the probe then fails naming the endpoint). An endpoint serving
    another model is refused here, before the sources are tokenized (ServedModelError)."""
    from ..generate.fleet_capacity import endpoint_problems, probe_fleet, served_model_problems
    from .actual import last_measured_throughput
    from .build import Fleet, read_plan
    from .probe import ServedModelError

    fleet = Fleet(
        tokens_per_s_per_server=args.tokens_per_s_per_server,
        servers=args.servers,
        gpus_per_server=args.gpus_per_server,
        probe_requests=args.probe_requests,
        probe_max_new_tokens=args.probe_max_new_tokens,
    )
    if args.tokens_per_s_per_server is not None:
        return fleet
    key = config.api_key.reveal() if config.api_key is not None else None
    capacity = probe_fleet(config.endpoints, headers={"Authorization": f"Bearer {key}"} if key else None)
    refused = served_model_problems(capacity, config.served_model_expectation())
    if refused:
        raise ServedModelError(refused)
    dead = endpoint_problems(capacity)
    last = last_measured_throughput(s.storage.data_dir, read_plan(s.storage.data_dir)) if dead else None
    if last is None:
        return fleet
    tps, servers, basis = last
    print(
        f"eagle3 plan: no endpoint answered ({dead[0].split('; ')[0]}); using the last measured throughput, "
        f"{tps:,.1f} output tokens/s per server ({basis}); --tokens-per-s-per-server X to declare one",
        file=sys.stderr,
    )
    fleet.tokens_per_s_per_server, fleet.throughput_basis = tps, basis
    fleet.servers = args.servers or servers
    return fleet


def run(args: argparse.Namespace) -> int:
    """`eagle3 plan` with its parsed arguments (app/cli.py declares them); the exit code."""
    problems = _positive(args)
    if problems:
        for line in problems:
            print(f"eagle3 plan: error: {line}", file=sys.stderr)
        return 2
    from ..config import settings
    from ..generate.config import generation_config
    from ..ingest import load_source_specs
    from ..ingest.errors import IngestFileError
    from ..profiles import ProfileError, resolve_profile
    from ..tokenize import PromptRenderer
    from .build import PlanDirs, PlanModel, build_plan, plan_table, write_plan
    from .probe import ProbeError, ServedModelError

    s = settings()
    specs = load_source_specs(s.storage.sources_dir)
    if not specs:
        print(
            f"eagle3 plan: error: no source YAML in {s.storage.sources_dir} (<EAGLE3_ASSETS_DIR>/sources)",
            file=sys.stderr,
        )
        return 2
    try:
        profile = resolve_profile(s.model.name, s.storage.models_dir, s.model.tokenizer_override)
        config = generation_config(
            profile,
            s.fleet.urls,
            s,
            {"max_new_tokens": args.max_new_tokens, "regen_seed": args.regen_seed, "probe_seed": args.probe_seed},
        )
        plan = build_plan(
            specs,
            dirs=PlanDirs(s.storage.data_dir, s.storage.work_dir),
            model=PlanModel(profile, PromptRenderer(profile), config, model_revision=args.model_revision),
            n_shards=s.shards.n_shards,
            control_text={spec.name: spec.control_text for spec in specs},
            fleet=_fleet(args, s, config),
        )
    except ServedModelError as e:
        for line in e.lines:
            print(f"eagle3 plan: error: {line}", file=sys.stderr)
        print("eagle3 plan: no probe request was sent; nothing was written", file=sys.stderr)
        return 2
    except ProbeError as e:
        print(f"eagle3 plan: error: {e}", file=sys.stderr)
        print(
            "eagle3 plan: start the servers named by EAGLE3_SGLANG_URL, or declare the throughput with "
            "--tokens-per-s-per-server X (no earlier run measured one)",
            file=sys.stderr,
        )
        return 2
    except (IngestFileError, ProfileError, ValueError) as e:
        print(f"eagle3 plan: error: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
        return 2
    print(plan_table(plan))
    for path in write_plan(plan, s.storage.data_dir, args.json):
        print(f"plan -> {path}")
    return 0
