"""`eagle3`: the command line. Each subcommand runs the same domain code as the assets.

    eagle3 ingest FILE --out DIR        ingest one prompt file outside Dagster
    eagle3 render --model P IN OUT      render + encode conversations exactly as the pipeline does
    eagle3 inspect --shard N            preview a shard's generations and its gate result
    eagle3 report [--out FILE]          rebuild the offline HTML data-quality report (shards x gates)
    eagle3 demo                         run the whole graph on a local Dagster instance and summarize
    eagle3 ui                           the Dagster UI on 127.0.0.1:3000 with a simulator behind it
    eagle3 plan [--tokens-per-s-per-server X] [--servers N]
                                        before a run: prompts, tokens, cached requests, ETA, GPU-hours, disk
    eagle3 check [--offline]            validate settings, source YAMLs and files, the data dir and (unless
                                        --offline) the SGLang endpoints; create the instance

A bad setting, source YAML or shard key ends any command with one line per problem and exit code 2.
"""

from __future__ import annotations

import argparse
import errno
import re
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .config import Settings
    from .generate.fleet_capacity import EndpointCapacity
    from .orchestration.pools import PoolSizing


def _ingest(argv: list[str]) -> int:
    from .ingest.cli import main

    return main(argv)


def _render(argv: list[str]) -> int:
    from .tokenize.cli import main

    return main(argv)


def _inspect(argv: list[str]) -> int:
    from .quality.report.cli import main

    return main(argv)


def _report(argv: list[str]) -> int:
    from .quality.report.cli import report_main

    return report_main(argv)


def _demo(argv: list[str]) -> int:
    from .demo import main

    return main(argv)


def _ui(argv: list[str]) -> int:
    from .demo import ui_main

    return ui_main(argv)


def _plan(argv: list[str]) -> int:
    from .plan.cli import main

    return main(argv)


def _check(argv: list[str]) -> int:
    """Validate settings, source YAMLs and files, the data dir and the endpoints; create the Dagster instance
    (make instance runs this). Every problem is one line; any problem: exit 2 and no instance written.

    The instance's `sglang` pool and run queue are sized from the fleet (orchestration/pools.py):
    each configured endpoint's max_running_requests from /server_info (a router: its workers', one line
    each router), and the prompts per shard of the last ingest when there is one. `--offline` skips the
    endpoint probe (the pool is then sized as for an unknown fleet).
    """
    from .checkup import source_problems, writable_dir_problem
    from .config import settings
    from .demo import ensure_dagster_home, instance_yaml
    from .generate.fleet_capacity import endpoint_problems

    args = _check_parser().parse_args(argv)  # --help prints what check does; an unknown argument is exit code 2
    s = settings()
    specs, problems = source_problems(s.sources_dir)
    dirs = [("EAGLE3_DATA_DIR", s.data_dir.local_path)] if s.data_dir.is_local else []
    dirs += [("EAGLE3_WORK_DIR", s.work_dir)] if s.work_dir not in [d for _, d in dirs] else []
    problems += [p for name, d in dirs if (p := writable_dir_problem(name, d))]
    sizing, routers, fleet = _fleet_pool_sizing(s, probe=not args.offline)
    problems += endpoint_problems(fleet)
    if problems:
        for line in problems:
            print(f"eagle3 check: error: {line}", file=sys.stderr)
        print(f"eagle3 check: {len(problems)} problem(s); nothing was written", file=sys.stderr)
        return 2
    home = ensure_dagster_home(instance_config=instance_yaml(sizing.pool_limit, sizing.max_concurrent_runs))
    probed = "endpoints not probed (--offline)" if args.offline and s.sglang_url_configured else ""
    print(
        f"eagle3 check: settings OK (model {s.model}, {s.n_shards} shards, data {s.data_dir}); "
        f"{len(specs)} source(s) OK; instance ready at {home}" + (f"; {probed}" if probed else "")
    )
    for line in routers:
        print(f"eagle3 check: {line}")
    own = (home / "dagster.yaml").read_text() == instance_yaml(sizing.pool_limit, sizing.max_concurrent_runs)
    print(f"eagle3 check: {sizing.describe()}" + ("" if own else "; NOT written: dagster.yaml is your own file"))
    return 0


def _check_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="eagle3 check",
        description="Validate every EAGLE3_* setting and every source YAML (each missing source file, an "
        "unwritable data or work dir, and each configured SGLang endpoint that does not answer as SGLang too: "
        "one line per problem, exit code 2, nothing written), then create or update the Dagster instance in "
        "DAGSTER_HOME, its `sglang` pool and run queue sized from the fleet: each EAGLE3_SGLANG_URL endpoint's "
        "max_running_requests and the prompts per shard of the last ingest. Nothing is run.",
    )
    ap.add_argument("--offline", action="store_true", help="do not probe the SGLang endpoints")
    return ap


def _fleet_pool_sizing(s: Settings, *, probe: bool = True) -> tuple[PoolSizing, list[str], list[EndpointCapacity]]:
    """PoolSizing from the configured endpoints (probed unless `probe` is false) and the last ingest's
    prompts per shard, a line per router endpoint (its workers, their slots, any worker counted as the
    mean), and what each endpoint answered."""
    from .generate.endpoint_info import display_url
    from .generate.fleet_capacity import probe_fleet
    from .orchestration.pools import size_pools
    from .storage import parquet_num_rows

    routers: list[str] = []
    fleet: list[EndpointCapacity] = []
    if s.sglang_url_configured and not probe:
        capacity: dict[str, int | None] = {display_url(u): None for u in s.sglang_urls}  # no credentials
    elif s.sglang_url_configured:
        headers = {"Authorization": f"Bearer {s.sglang_api_key.reveal()}"} if s.sglang_api_key else None
        fleet = probe_fleet(s.sglang_urls, headers=headers)
        capacity = {c.endpoint: c.slots for c in fleet}
        routers = [c.describe() for c in fleet if c.workers is not None]
    else:  # `eagle3 demo` / `eagle3 ui` start their own simulator: nothing to probe yet
        capacity = {"the simulator eagle3 demo/ui starts": None}
    prompts = s.data_dir / "prompts" / "prompts.parquet"
    per_shard = None
    if prompts.exists():
        per_shard = max(1, parquet_num_rows(prompts) // s.n_shards)
    return size_pools(capacity, shard_requests=per_shard), routers, fleet


COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "ingest": _ingest,
    "render": _render,
    "inspect": _inspect,
    "report": _report,
    "demo": _demo,
    "ui": _ui,
    "plan": _plan,
    "check": _check,
}


# OSErrors that mean "this folder cannot be written": a condition the user fixes, not a bug to trace
UNWRITABLE_ERRNOS = frozenset(
    {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.ENOTDIR, errno.EEXIST}
)


def _one_line(e: Exception) -> str:
    """The line of an error that says why: a simulator's failure carries its log's tail, whose last
    ERROR line names the cause (e.g. the TokenizerLoadError); anything else is its first line."""
    lines = [re.sub(r"^\[[^]]*\] ERROR [\w.]+: ", "", ln.strip()) for ln in str(e).splitlines() if ln.strip()]
    errors = [ln for ln in lines if " ERROR " in ln or "Error:" in ln]
    return (errors or lines or [type(e).__name__])[-1 if errors else 0]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(__doc__)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd not in COMMANDS:
        print(f"eagle3: unknown command {cmd!r}; one of: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    from .config import PartitionKeyError, SettingsError, apply_project_env_defaults
    from .ingest.errors import SourceSpecError
    from .sim.process import SimulatorError
    from .tokenize.loading import TokenizerLoadError

    apply_project_env_defaults()  # a plain shell gets what `make` gets (config.project_env_defaults)
    try:
        return COMMANDS[cmd](rest)
    except (TokenizerLoadError, SimulatorError) as e:
        # the tokenizer (or the simulator that loads it) cannot start: one line naming the setting
        print(f"eagle3 {cmd}: error: {_one_line(e)}", file=sys.stderr)
        print(
            f"eagle3 {cmd}: the tokenizer comes from EAGLE3_TOKENIZER (or the profile named by EAGLE3_MODEL): "
            "point it at a local tokenizer folder",
            file=sys.stderr,
        )
        return 2
    except OSError as e:
        if e.errno not in UNWRITABLE_ERRNOS:
            raise
        # a data/work dir that cannot be written (read-only, full, a file in the way): one line, the fix
        print(
            f"eagle3 {cmd}: error: cannot write {e.filename or 'a file'}: {e.strerror}; EAGLE3_DATA_DIR and "
            "EAGLE3_WORK_DIR must be folders you can write to, with free space (`eagle3 check` tests them)",
            file=sys.stderr,
        )
        if cmd == "demo":
            print("next:       fix the folder named above, then rerun `make demo`\nresult:     FAILED", flush=True)
        return 2
    except (SettingsError, SourceSpecError, PartitionKeyError) as e:
        # a configuration mistake: one readable line per problem, no traceback
        for line in str(e).splitlines():
            print(f"eagle3 {cmd}: error: {line}", file=sys.stderr)
        if cmd == "demo":
            print(
                "next:       nothing was run; fix the setting or file named above (`eagle3 check` validates "
                "without running), then rerun `make demo`\nresult:     FAILED",
                flush=True,
            )
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
