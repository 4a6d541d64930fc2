"""`eagle3 ingest FILE --out DIR`: ingest one prompt file outside Dagster, with the same code.

Writes DIR/accepted.parquet, DIR/rejects.parquet and DIR/counts.json, and prints the counts as one
JSON object on the last line of stdout. Exit status: 0 when at least one prompt was accepted (even if
rows were rejected), 1 when nothing was accepted (the outputs are still written, so rejects.parquet says
why; one stderr line names the counts, as the pipeline's source asset fails then; `--allow-empty`
makes it 0, like `allow_empty: true` in a source YAML), 2 for a usage error or a file that cannot be
read (the message names it, on stderr).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from urllib.parse import urlsplit

from .errors import IngestFileError, SourceSpecError
from .pipeline import ingest_source
from .spec import SourceSpec

_WILDCARD = re.compile(r"[*?\[]")


def default_source_name(path: str) -> str:
    """--name's default: the file name's stem, up to its first wildcard when it is a glob
    (`chats-*.jsonl` -> `chats`); a part with nothing left (`dir/*.jsonl`, `dir/**/*.jsonl`) gives way to
    the folder above it (`dir`). The name keeps letters, digits, '_', '-' and '.' (a source name's rule)."""
    for part in reversed([p for p in re.split(r"[/\\]", path) if p not in ("", ".", "..")]):
        stem = _WILDCARD.split(part)[0].split(".")[0]
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", stem).strip("_.-")
        if name:
            return name
    return "cli"


def run(args: argparse.Namespace) -> int:
    """`eagle3 ingest` with its parsed arguments (app/cli.py declares them); the exit code."""
    field_map: dict[str, str] = {}
    for item in args.field:
        canonical, sep, source = item.partition("=")
        if not sep or not canonical or not source:
            print(f"eagle3 ingest: --field expects CANONICAL=SOURCE, got {item!r}", file=sys.stderr)
            return 2
        field_map[canonical] = source
    if args.n_shards is None:
        from ..config import settings

        args.n_shards = settings().shards.n_shards
    else:
        from ..config import check_n_shards

        try:
            check_n_shards(args.n_shards, "--n-shards")
        except ValueError as e:
            print(f"eagle3 ingest: {e}", file=sys.stderr)
            return 2
    from ..storage import StorageError, data_root

    try:
        out = data_root(args.out if "://" in args.out else Path(args.out).expanduser().absolute())
    except StorageError as e:
        print(f"eagle3 ingest: {e}", file=sys.stderr)
        return 2
    from .remote import is_uri

    # A URI (s3://bucket/x/*.jsonl.gz?region=..., memory://..., file://...) is passed through as is.
    uri = is_uri(args.file)
    name = args.name or default_source_name(
        urlsplit(args.file).path if uri else str(Path(args.file).expanduser().absolute())
    )
    try:
        spec = SourceSpec(
            name=name,
            path=args.file if uri else str(Path(args.file).expanduser().absolute()),
            format=args.format,
            field_map=field_map,
            limit=args.limit,
            prompt_rule=args.prompt_rule,
            max_bytes=args.max_bytes,
            function_docs=str(Path(args.function_docs).expanduser().absolute()) if args.function_docs else None,
        )
        counts = ingest_source(spec, out, n_shards=args.n_shards)
    except (IngestFileError, SourceSpecError, ValueError) as e:
        print(f"eagle3 ingest: {e}", file=sys.stderr)
        return 2
    print(f"accepted -> {out / 'accepted.parquet'}; rejects -> {out / 'rejects.parquet'}")
    summary = {k: getattr(counts, k) for k in ("read", "accepted", "rejected", "duplicates", "rejects_by_reason")}
    if counts.sampled_out:
        summary["sampled_out"] = counts.sampled_out
    print(json.dumps(summary, sort_keys=False))
    if counts.accepted == 0 and not args.allow_empty:
        from .health import describe_counts

        print(
            f"eagle3 ingest: no prompt accepted from {args.file} ({describe_counts(counts)}); "
            f"see {out / 'rejects.parquet'} (--allow-empty to exit 0)",
            file=sys.stderr,
        )
        return 1
    return 0
