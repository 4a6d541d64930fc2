"""`eagle3 inspect`: preview a shard's generations and show its stored gate results.

    eagle3 inspect --shard N [--data-dir DIR] [--model PROFILE] [-n K] [--sample-id ID ...]
    eagle3 report [--data-dir URI] [--work-dir DIR] [--out FILE]   (run_report: the offline HTML report,
                                                                    after the GX Data Docs index refresh)

Reads data/generations/shard=NNNN/part-*.parquet and data/tokenized_prompts/shard=NNNN/part-*.parquet,
prints the same Markdown preview the Dagster asset shows, then every stored gate result for the shard.
"""

from __future__ import annotations

import argparse
import sys
from datetime import timedelta
from pathlib import Path

from ..config import WORK_DIR_ENV, Settings, settings
from ..profiles import ProfileError, resolve_profile
from ..quality.gate import read_gate_result
from ..quality.suites import GATES
from ..schemas import GENERATIONS, TOKENIZED_PROMPTS
from ..storage import DataPath, StorageError, data_root, read_parquet_dir, shard_dir
from .previews import histograms_markdown, sample_preview_markdown


def _data_dir(prog: str, arg: str | None, s: Settings) -> DataPath | None:
    """The --data-dir argument opened (or the configured one); None after printing why it is refused."""
    try:
        return data_root(arg) if arg else s.storage.data_dir
    except StorageError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return None


def run_inspect(args: argparse.Namespace) -> int:
    """`eagle3 inspect` with its parsed arguments (app/cli.py declares them); the exit code."""
    s = settings()
    data_dir = _data_dir("eagle3 inspect", args.data_dir, s)
    if data_dir is None:
        return 2
    if args.shard < 0 or args.n < 0:
        print("eagle3 inspect: --shard and -n must be >= 0", file=sys.stderr)
        return 2
    try:
        profile = resolve_profile(args.model or s.model.name, s.storage.models_dir, s.model.tokenizer_override)
    except ProfileError as e:
        print(f"eagle3 inspect: {e}", file=sys.stderr)
        return 2
    try:
        gens_dir = shard_dir(data_dir, "generations", args.shard)
        tok_dir = shard_dir(data_dir, "tokenized_prompts", args.shard)
    except StorageError as e:
        print(f"eagle3 inspect: {e}", file=sys.stderr)
        return 2
    gens = read_parquet_dir(gens_dir, schema=GENERATIONS)
    tokenized = read_parquet_dir(tok_dir, schema=TOKENIZED_PROMPTS)
    results = {g: read_gate_result(data_dir, g, args.shard) for g in GATES}
    if gens.height == 0 and not any(results.values()):
        print(
            f"eagle3 inspect: no generations in {gens_dir} and no stored gate results for shard {args.shard}",
            file=sys.stderr,
        )
        return 1
    if gens.height:
        from ..tokenize.loading import load_tokenizer

        tokenizer = load_tokenizer(profile.tokenizer, trust_remote_code=profile.trust_remote_code)
        print(
            sample_preview_markdown(
                gens, tokenized if tokenized.height else None, tokenizer, profile, n=args.n, sample_ids=args.sample_id
            )
        )
        if args.histograms:
            from ..quality.features import generation_features, prompt_features

            feats = generation_features(gens, tokenized if tokenized.height else None, profile, tokenizer)
            print()
            print("### Generation features")
            print(histograms_markdown(feats, ["reasoning_len", "answer_len", "think_end_pos", "output_len"]))
            if tokenized.height:
                print(histograms_markdown(prompt_features(tokenized, profile), ["prompt_len"]))
    else:
        print(f"(no generations in {gens_dir})")
    for gate, res in results.items():
        print()
        if res is None:
            print(f"### gate `{gate}`: no stored result for shard {args.shard}")
            continue
        print(f"### Stored gate result ({res.created_at}, suite {res.suite_sha256})")
        print(res.summary_markdown())
        if res.row_failures.height:
            print()
            print(f"quarantined rows (first 10 of {res.row_failures.height}):")
            for row in res.row_failures.head(10).iter_rows(named=True):
                print(f"- `{row['row_id']}`: {'; '.join(row['reasons'])}")
        if res.data_docs_page and Path(res.data_docs_page).is_file():  # built by the run's quality report
            print(f"\nData Docs: {res.data_docs_page}")
    return 0


# ---------------------------------------------------------------------------------------------
# `eagle3 report`


def run_report(args: argparse.Namespace) -> int:
    """`eagle3 report` with its parsed arguments (app/cli.py declares them); the exit code."""
    from ..config import work_dir_for
    from .html import write_report

    s = settings()  # validates every setting (EAGLE3_SNAPSHOT_MAX_AGE too: the report compares LATEST's age to it)
    data_dir = _data_dir("eagle3 report", args.data_dir, s)
    if data_dir is None:
        return 2
    work = (
        Path(args.work_dir).expanduser().resolve()
        if args.work_dir
        else (s.storage.work_dir if not args.data_dir else work_dir_for(data_dir, _configured_work_dir(s)))
    )
    _build_docs(work, s.stages.gx_keep_validations)
    max_age = s.shards.snapshot_max_age
    try:
        path = write_report(
            data_dir, work, out=args.out, n_shards=s.shards.n_shards, profile=args.model, max_age=max_age
        )
    except (StorageError, OSError) as e:
        print(f"eagle3 report: {e}", file=sys.stderr)
        return 1
    print(path)
    _print_latest_age(data_dir, max_age)
    return 0


def _configured_work_dir(s: Settings) -> Path | None:
    """EAGLE3_WORK_DIR when it is set (else a --data-dir gets the work dir that follows it)."""
    return s.storage.work_dir if WORK_DIR_ENV in s.configured else None


def _build_docs(work: Path, keep: int) -> None:
    """The gates' GX Data Docs built (pruned, the missing pages, the index) before the report links their
    pages; a failure is a warning on stderr (the report is still written)."""
    from ..quality.gx_docs import build_data_docs

    try:
        build_data_docs(work / "gx", keep)
    except Exception as e:
        print(f"eagle3 report: GX Data Docs not built: {type(e).__name__}: {e}", file=sys.stderr)


def _print_latest_age(data_dir: DataPath | Path, max_age: timedelta) -> None:
    """How old snapshots/LATEST is (against `max_age`), on stderr (stdout stays the report path, for scripts)."""
    from .html import latest_age

    try:
        age = latest_age(data_dir, max_age=max_age)
    except (StorageError, OSError, ValueError) as e:
        print(f"eagle3 report: LATEST age unknown: {e}", file=sys.stderr)
        return
    print(
        f"eagle3 report: {age.describe() if age else 'no snapshot published yet (no snapshots/LATEST)'}",
        file=sys.stderr,
    )
