"""`eagle3`: the command line, one argparse tree. Each subcommand runs the same domain code as the assets.

    eagle3 ingest FILE --out DIR        ingest one prompt file outside Dagster
    eagle3 render --model P IN OUT      render + encode conversations exactly as the pipeline does
    eagle3 inspect --shard N            preview a shard's generations and its gate result
    eagle3 report [--out FILE]          rebuild the offline HTML data-quality report (shards x gates)
    eagle3 demo                         run the whole graph on a local Dagster instance and summarize
    eagle3 backfill                     the same graph against EAGLE3_SGLANG_URL (a real fleet), and summarize
    eagle3 ui                           the Dagster UI on 127.0.0.1:3000 with a simulator behind it
    eagle3 plan [--tokens-per-s-per-server X] [--servers N]
                                        before a run: prompts, tokens, cached requests, ETA, GPU-hours, disk
    eagle3 check [--offline]            validate settings, source YAMLs and files, the data dir and (unless
                                        --offline) the SGLang endpoints; create the instance
    eagle3 drafters compare --candidate URL[,URL...] [--baseline ID] [--json PATH]
                                        judge a candidate drafter against production's on the probe sets

Every subcommand's arguments are declared here (one `_<command>_args` function each); its handler takes
the parsed Namespace and returns the exit code. Building the tree imports nothing heavy (no Dagster,
polars, GX or transformers), so `eagle3 --help` and `eagle3 <command> --help` answer at once: a handler
imports its domain code when it runs. A bad setting, source YAML or shard key ends any command with one
line per problem and exit code 2; a bad argument is argparse's usage line and exit code 2.
"""

from __future__ import annotations

import argparse
import errno
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

Handler = Callable[[argparse.Namespace], int]


class _LazyChoices:
    """Choices named by a domain module, read the first time argparse needs them (a value to check, a
    `--help` to print): the module is not imported while the tree is built."""

    def __init__(self, load: Callable[[], Iterable[str]]) -> None:
        self._load = load
        self._names: tuple[str, ...] | None = None

    def _get(self) -> tuple[str, ...]:
        if self._names is None:
            self._names = tuple(self._load())
        return self._names

    def __contains__(self, value: object) -> bool:
        return value in self._get()

    def __iter__(self) -> Iterator[str]:
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())


def _format_names() -> list[str]:
    from ..ingest.normalize import FORMAT_ALIASES

    return sorted(FORMAT_ALIASES)


def _prompt_rules() -> Iterable[str]:
    from ..ingest.normalize import PROMPT_RULES

    return PROMPT_RULES


# ---------------------------------------------------------------------------------------------
# The arguments of each subcommand


def _ingest_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="the data file (or a quoted glob); a path or a URI, e.g. s3://bucket/x/*.jsonl.gz")
    p.add_argument(
        "--out", required=True, help="output folder for accepted/rejects Parquet (a path or a URI, e.g. s3://bucket/x)"
    )
    # choices set after add_argument: argparse formats them while adding, which would import the ingest stage
    p.add_argument("--format", default="auto", help="record layout (default: auto)").choices = _LazyChoices(
        _format_names
    )
    p.add_argument("--name", help="source name written on every row (default: the file name's stem)")
    p.add_argument("--prompt-rule", default="last_user_or_tool").choices = _LazyChoices(_prompt_rules)
    p.add_argument("--n-shards", type=int, default=None, help="1 to 4096; default: EAGLE3_N_SHARDS (4)")
    p.add_argument("--max-bytes", type=int, default=200_000, help="rows larger than this are rejected (too_large)")
    p.add_argument("--limit", type=int, default=None, help="stop after this many accepted prompts")
    p.add_argument(
        "--allow-empty", action="store_true", help="exit 0 even when no prompt was accepted (default: exit 1)"
    )
    p.add_argument(
        "--function-docs", metavar="DIR", help="BFCL multi-turn files: their multi_turn_func_doc/ folder (docs/bfcl.md)"
    )
    p.add_argument(
        "--field",
        action="append",
        default=[],
        metavar="CANONICAL=SOURCE",
        help="field_map entry, e.g. --field messages=dialog (repeatable)",
    )


def _render_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="profile name (in <assets>/models) or path to a profile YAML")
    p.add_argument(
        "--tokenizer", help="tokenizer folder or Hugging Face id; overrides the profile (and EAGLE3_TOKENIZER)"
    )
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        help="answer budget for the length check (default: the profile's sampling.max_new_tokens)",
    )
    p.add_argument("input", type=Path, help="input JSONL file")
    p.add_argument("output", type=Path, help="output JSONL file (written atomically)")


_DATA_DIR_HELP = "data directory, a path or a URI such as s3://bucket/prefix (default: EAGLE3_DATA_DIR or ./data)"


def _inspect_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shard", type=int, required=True, help="shard number (e.g. 3 for shard=0003)")
    p.add_argument("--data-dir", default=None, help=_DATA_DIR_HELP)
    p.add_argument("--model", default=None, help="model profile name or YAML path (default: EAGLE3_MODEL)")
    p.add_argument("-n", type=int, default=3, help="how many samples to preview (default 3)")
    p.add_argument("--sample-id", action="append", default=None, help="preview these sample ids (repeatable)")
    p.add_argument("--histograms", action="store_true", help="also print feature histograms (computes features)")


def _report_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", default=None, help=_DATA_DIR_HELP)
    p.add_argument(
        "--work-dir",
        default=None,
        help="local work dir holding gx/ (default: EAGLE3_WORK_DIR, else the data dir when local)",
    )
    p.add_argument("--out", default=None, help="output HTML file (default: <work dir>/reports/index.html)")
    p.add_argument("--model", default=None, help="model profile shown in the header (default: from the gate results)")


_ALLOW_PARTIAL_HELP = (
    "publish a snapshot even when some shards did not pass: they are left out, and its manifest and data card "
    "name each and why (default: a snapshot is published only when every shard passed)"
)


def _graph_args(p: argparse.ArgumentParser) -> None:
    """What `eagle3 demo` and `eagle3 backfill` share."""
    p.add_argument("--shards", help="comma-separated shard keys (default: all)")
    p.add_argument("--allow-partial", action="store_true", help=_ALLOW_PARTIAL_HELP)


def _demo_args(p: argparse.ArgumentParser) -> None:
    _graph_args(p)
    p.add_argument("--sim-arg", action="append", default=[], help="extra argument for eagle3-sim (repeatable)")
    p.add_argument("--samples", type=int, help="one big shard of N distinct prompts from ../shared/datasets")
    p.add_argument("--output-tokens", type=int, help="simulator outputs of about T tokens (long reasoning)")
    p.add_argument(
        "--speculative",
        action="store_true",
        help="the simulator speculates with an EAGLE3 drafter and the example probe set "
        "(examples/speculative-demo) joins the sources: every row carries the drafter's acceptance",
    )


def _ui_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--port", default="3000", help="the UI's port on 127.0.0.1 (default: %(default)s)")


def _plan_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--tokens-per-s-per-server",
        metavar="X",
        type=float,
        default=None,
        help="declared output tokens/s of one server; default: measured by a short probe of EAGLE3_SGLANG_URL",
    )
    p.add_argument(
        "--servers",
        metavar="N",
        type=int,
        default=None,
        help="servers in the fleet (default: one per endpoint, a router's listed workers)",
    )
    p.add_argument(
        "--gpus-per-server", metavar="G", type=int, default=8, help="GPUs one server uses, for GPU-hours (default 8)"
    )
    p.add_argument(
        "--probe-requests",
        metavar="K",
        type=int,
        default=8,
        help="concurrent probe requests per server (a router: per worker; default 8)",
    )
    p.add_argument(
        "--probe-max-new-tokens", metavar="T", type=int, default=128, help="tokens a probe request asks for (128)"
    )
    p.add_argument(
        "--max-new-tokens", metavar="M", type=int, default=None, help="as the run's (default: the profile's)"
    )
    p.add_argument(
        "--model-revision", metavar="REV", default=None, help="the revision cache keys use (default: as the run)"
    )
    p.add_argument(
        "--regen-seed", metavar="S", type=int, default=None, help="as the sglang resource's regen_seed (default none)"
    )
    p.add_argument(
        "--probe-seed",
        metavar="S",
        type=int,
        default=None,
        help="as the sglang resource's probe_seed (default none): in the keys of the role: probe sources only",
    )
    p.add_argument("--json", metavar="PATH", type=Path, default=None, help="also write the plan JSON here")


def _check_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--offline", action="store_true", help="do not probe the SGLang endpoints")


def _drafters_args(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="drafters_action", metavar="ACTION", title="actions", required=True)
    c = sub.add_parser(
        "compare",
        help="judge a candidate drafter against production's on the probe sets",
        description="Send the probe prompts (role: probe sources), and only those, to the candidate endpoints with "
        "production's sampling and probe seed; compare the candidate's accept length with the baseline drafter's "
        "stored results on the identical prompts, per probe source and overall, with a paired bootstrap interval; "
        "decide promote or hold by expectations/drafter_promotion.json. Exit 0 promote, 1 hold, 2 refused.",
    )
    c.add_argument("--candidate", required=True, metavar="URL[,URL...]", help="the candidate's SGLang endpoint(s)")
    c.add_argument(
        "--baseline", metavar="DRAFTER_ID", default=None, help="default: the production fleet's current drafter"
    )
    c.add_argument("--json", metavar="PATH", type=Path, default=None, help="also write the comparison JSON here")
    c.add_argument(
        "--trained-on",
        metavar="SNAPSHOT",
        default=None,
        help="the snapshot that trained the candidate (default: the eagle3-lineage.json beside its checkpoint)",
    )
    c.add_argument(
        "--max-new-tokens", metavar="M", type=int, default=None, help="as production's run (default: the profile's)"
    )
    c.add_argument("--regen-seed", metavar="S", type=int, default=None, help="as the sglang resource's regen_seed")
    c.add_argument("--probe-seed", metavar="S", type=int, default=None, help="as the sglang resource's probe_seed")


# ---------------------------------------------------------------------------------------------
# The handlers: each imports its domain code when it runs


def _ingest(args: argparse.Namespace) -> int:
    from ..ingest.cli import run

    return run(args)


def _render(args: argparse.Namespace) -> int:
    from ..tokenize.cli import run

    return run(args)


def _inspect(args: argparse.Namespace) -> int:
    from ..report.cli import run_inspect

    return run_inspect(args)


def _report(args: argparse.Namespace) -> int:
    from ..report.cli import run_report

    return run_report(args)


def _demo(args: argparse.Namespace) -> int:
    from .demo import run

    return run(args)


def _backfill(args: argparse.Namespace) -> int:
    from .backfill import run

    return run(args)


def _ui(args: argparse.Namespace) -> int:
    from .ui import run

    return run(args)


def _plan(args: argparse.Namespace) -> int:
    from ..plan.cli import run

    return run(args)


def _check(args: argparse.Namespace) -> int:
    from .checkup import run_check

    return run_check(args)


def _drafters(args: argparse.Namespace) -> int:
    from ..drafters.cli import run

    return run(args)


# ---------------------------------------------------------------------------------------------
# The tree


@dataclass(frozen=True)
class Command:
    name: str
    summary: str  # its line in `eagle3 --help`
    description: str  # the head of `eagle3 <name> --help`
    add_arguments: Callable[[argparse.ArgumentParser], None]
    handler: Handler


COMMANDS: tuple[Command, ...] = (
    Command(
        "ingest",
        "ingest one prompt file outside Dagster",
        "Ingest one prompt file (JSONL, JSON, Parquet; gzip ok).",
        _ingest_args,
        _ingest,
    ),
    Command(
        "render",
        "render + encode conversations exactly as the pipeline does",
        "Render chat requests to exact prompt token ids.",
        _render_args,
        _render,
    ),
    Command(
        "inspect",
        "preview a shard's generations and its gate result",
        "Preview a shard's generations and its gate results.",
        _inspect_args,
        _inspect,
    ),
    Command(
        "report",
        "rebuild the offline HTML data-quality report (shards x gates)",
        "Rebuild the offline HTML data-quality report (shards x gates, failed expectations, quarantine by reason, "
        "snapshots) from the stored gate results. No scripts or external resources: opens on an air-gapped machine.",
        _report_args,
        _report,
    ),
    Command(
        "demo",
        "run the whole graph on a local Dagster instance and summarize",
        "The whole graph on a local instance, with a simulator if needed. The simulator is started only when "
        "EAGLE3_SGLANG_URL is unset; pointing that variable at a real SGLang server (or router) runs the very same "
        "code against it. Nothing here writes the process environment: the instance is opened from its folder, "
        "the simulator's URL reaches the runs as the `sglang` resource.",
        _demo_args,
        _demo,
    ),
    Command(
        "backfill",
        "the whole graph against EAGLE3_SGLANG_URL (a real fleet) on the local instance, and summarize",
        "Ingest, every shard, the snapshot, the quality report: the same graph, order and publish rule as the "
        "demo and the nightly (a snapshot only when every shard passed, unless --allow-partial; the report "
        "last), against the SGLang server or router EAGLE3_SGLANG_URL names, on the Dagster instance in "
        "DAGSTER_HOME. A failed shard does not stop the others. Exit 0 when everything passed.",
        _graph_args,
        _backfill,
    ),
    Command(
        "ui",
        "the Dagster UI on 127.0.0.1:3000 with a simulator behind it",
        "Start the Dagster UI (dagster dev: webserver, daemon, code server) on 127.0.0.1 for this project's "
        "definitions, with an SGLang simulator behind it unless EAGLE3_SGLANG_URL is set. Settings and source YAMLs "
        "are validated first. Ctrl-C stops everything.",
        _ui_args,
        _ui,
    ),
    Command(
        "plan",
        "before a run: prompts, tokens, cached requests, ETA, GPU-hours, disk",
        "Plan a run: prompts, tokens, cache, ETA, disk.",
        _plan_args,
        _plan,
    ),
    Command(
        "check",
        "validate settings, source YAMLs and files, the data dir and (unless --offline) the SGLang endpoints; "
        "create the instance",
        "Validate every EAGLE3_* setting (a misspelt one named with what was meant) and every source YAML (each "
        "missing source file, a source whose first records make no prompt in its format, the model profile and its "
        "tokenizer, an unwritable data or work dir, and each configured SGLang endpoint that does not answer as "
        "SGLang or serves another model than the profile's (its /model_info; a router: each worker's; "
        "EAGLE3_SERVED_MODEL pins one) too: one line per problem, "
        "exit code 2, nothing written), then create or update the Dagster instance in DAGSTER_HOME, its `sglang` "
        "pool and run queue sized from the fleet: each EAGLE3_SGLANG_URL endpoint's max_running_requests and the "
        "prompts per shard of the last ingest. Nothing is run.",
        _check_args,
        _check,
    ),
    Command(
        "drafters",
        "judge a candidate drafter against production's on the probe sets (`drafters compare`)",
        "Drafter versions on the probe sets. `eagle3 drafters compare --candidate URL` judges a candidate drafter "
        "against production's before it ships (docs/drafter-compare.md).",
        _drafters_args,
        _drafters,
    ),
)
COMMAND_NAMES = tuple(c.name for c in COMMANDS)


def build_parser() -> argparse.ArgumentParser:
    """The whole `eagle3` tree: one subparser per command, its handler set as `handler`."""
    parser = argparse.ArgumentParser(
        prog="eagle3",
        description="The EAGLE-3 drafter training-data pipeline's command line: each command runs the same "
        "domain code as the Dagster assets.",
        epilog="A bad setting, source YAML or shard key ends any command with one line per problem and exit "
        "code 2. `eagle3 COMMAND --help` shows a command's arguments.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    for cmd in COMMANDS:
        p = sub.add_parser(cmd.name, help=cmd.summary, description=cmd.description)
        cmd.add_arguments(p)
        p.set_defaults(handler=cmd.handler)
    return parser


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
    parser = build_parser()
    if not argv or argv == ["help"]:
        parser.print_help()
        return 0 if argv else 2
    if not argv[0].startswith("-") and argv[0] not in COMMAND_NAMES:
        print(f"eagle3: unknown command {argv[0]!r}; one of: {', '.join(COMMAND_NAMES)}", file=sys.stderr)
        return 2
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help (0) or a bad argument (2; argparse printed the usage and why)
        return e.code if isinstance(e.code, int) else 2
    if args.command is None:
        parser.print_help()
        return 2
    try:
        code = _run(args.command, args.handler, args)
        sys.stdout.flush()  # what is still buffered goes now, while a closed pipe can be answered here
        return code
    except BrokenPipeError:
        return _reader_gone()


# the exit code of a command whose reader closed the pipe (`eagle3 inspect | head`): 128 + SIGPIPE, as a
# command killed by SIGPIPE exits
PIPE_CLOSED = 141


def _reader_gone() -> int:
    """The reader of stdout went away: no traceback, and nothing more is written to the closed pipe (stdout
    points at /dev/null, so the interpreter's last flush at exit finds nothing to complain about)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return PIPE_CLOSED


def _run(cmd: str, handler: Handler, args: argparse.Namespace) -> int:
    """The handler, with every mistake the user fixes (a setting, a file, a folder) as one line, exit code 2."""
    from ..config import PartitionKeyError, SettingsError, apply_project_env_defaults
    from ..ingest.errors import SourceSpecError
    from ..profiles import ProfileError
    from ..sim.process import SimulatorError
    from ..tokenize.loading import TokenizerLoadError

    apply_project_env_defaults()  # a plain shell gets what `make` gets (config.project_env_defaults)
    try:
        return handler(args)
    except (TokenizerLoadError, SimulatorError) as e:
        # the tokenizer (or the simulator that loads it) cannot start: one line naming the setting
        line = _one_line(e)
        print(f"eagle3 {cmd}: error: {line}", file=sys.stderr)
        if "ProfileError" in line:
            hint = "EAGLE3_MODEL names a model profile (assets/models/<name>.yaml, or a YAML path): fix it or the file"
        else:
            hint = (
                "the tokenizer comes from EAGLE3_TOKENIZER (or the profile named by EAGLE3_MODEL): point it at a "
                "local tokenizer folder"
            )
        print(f"eagle3 {cmd}: {hint} (`eagle3 check` loads both without running)", file=sys.stderr)
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
    except (SettingsError, SourceSpecError, PartitionKeyError, ProfileError) as e:
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
