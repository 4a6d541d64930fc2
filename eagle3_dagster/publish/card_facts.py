"""The figures a snapshot's data card states (and the demo's summary), read from the data dir and the tables.

Plain functions, no Dagster: every figure is measured from a file (the snapshot's Parquet tables, the
sources' counts.json, the prompts table, the tokenize rejects, the stored gate results, the generation
errors), never taken from what a caller says. Figures about stages are for the counted shards (the ones the
snapshot includes, or a run's); the ingest figures (read, rejected, duplicates) are the sources' own, over
every shard, and `reconciliation` states how they all add up.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow.parquet as pq

from ..storage import DataPath
from ..train.samples import SERVED_BY_COLUMNS

ROW_GATES = ("prompts", "generations", "training_samples")
# a row whose table names no SGLang release (null, or a table built before training rows recorded it)
UNKNOWN_RELEASE = "unknown"
# what the card says about the model and the server, per distinct value in the snapshot's rows
PROVENANCE_COLUMNS = ("model_revision", "template_hash", "tokenizer_fingerprint", "sampling_hash")


@dataclass
class SourceCounts:
    """One source's figures: ingest (every shard) and the counted shards' stages (a snapshot's, a run's).

    Every prompt read ends in exactly one of the terms of `TERMS`, so they add up to `read` (`reconciles`):
    rejected at ingest, a duplicate (in the source or of an earlier source), sampled out, quarantined against
    an eval or probe set, in a shard not counted here, a probe prompt (role: probe: generated to compare
    drafters, never trained on), left without a training row (quarantined at tokenize or by a gate, its
    request failed for good, or skipped), or trained (one row, or one per turn of a multi-turn conversation)."""

    read: int | None = None  # None: no counts.json (the source was not ingested into this data dir)
    accepted: int | None = None
    rejected: int | None = None
    duplicates: int | None = None  # the same prompt earlier in this source
    cross_source_duplicates: int | None = None  # the same prompt already in an earlier source
    sampled_out: int | None = None
    eval_overlap: int = 0
    probe_overlap: int = 0  # training prompts quarantined because a probe set holds them
    prompts: int = 0  # unique prompts in the counted shards
    other_shards: int = 0  # unique prompts in the shards not counted (another snapshot's, not run)
    probe_prompts: int = 0  # the counted shards' prompts of a role: probe source
    no_row: int = 0  # the counted shards' training prompts without a training row (the next three and skips)
    tokenize_rejected: int = 0
    gate_quarantined: int = 0  # rows the row-level gates quarantined (prompts, generations, training_samples)
    generation_failed: int = 0  # requests that failed for good (generations errors.parquet)
    trained: int = 0  # the counted shards' training prompts with at least one training row
    rows: int = 0  # training rows in the counted shards

    # the terms `read` is the sum of, with their words
    TERMS = (
        ("rejected", "rejected at ingest"),
        ("duplicates", "duplicates"),
        ("cross_source_duplicates", "duplicates of an earlier source"),
        ("sampled_out", "sampled out"),
        ("eval_overlap", "eval overlap"),
        ("probe_overlap", "probe overlap"),
        ("other_shards", "in other shards"),
        ("probe_prompts", "probe prompts"),
        ("no_row", "quarantined or failed"),
        ("trained", "trained"),
    )

    def reconciles(self) -> bool:
        """read == the sum of TERMS (None: ingest figures missing, nothing to reconcile)."""
        values = [getattr(self, key) for key, _ in self.TERMS]
        return self.read is None or None in values or self.read == sum(values)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def total(counts: dict[str, SourceCounts], key: str) -> int:
    return sum(getattr(c, key) or 0 for c in counts.values())


def reconciliation(counts: dict[str, SourceCounts]) -> str:
    """The counts of every source as one equation that holds: read = the terms of TERMS (those that are not 0,
    and `trained` always); then the rows. The demo's summary and the data card both state it, from these figures."""
    kept = [(key, words) for key, words in SourceCounts.TERMS if key == "trained" or total(counts, key)]
    terms = " + ".join(f"{words} {total(counts, key):,}" for key, words in kept)
    trained, rows = total(counts, "trained"), total(counts, "rows")
    more = f", {rows - trained:,} of them further turns of multi-turn conversations" if rows > trained else ""
    return f"read {total(counts, 'read'):,} = {terms}; training rows {rows:,}{more}"


@dataclass
class GateFacts:
    """One row-level gate over the snapshot's shards."""

    gate: str
    shards_passed: int = 0
    rows_checked: int = 0
    rows_quarantined: int = 0
    suites: list[str] = field(default_factory=list)  # suite_sha256 values seen


def _json(path: DataPath) -> dict[str, Any] | None:
    if not path.exists():
        return None
    try:
        d = json.loads(path.read_text())
    except ValueError:
        return None
    return d if isinstance(d, dict) else None


def _parquet(path: DataPath) -> pq.ParquetFile:
    return pq.ParquetFile(path.path if path.is_local else path.open_input_file())


def table_columns(path: DataPath) -> tuple[str, ...]:
    """A Parquet table's column names, in order."""
    return tuple(_parquet(path).schema_arrow.names)


def _column(path: DataPath, names: Sequence[str]) -> dict[str, list[Any]]:
    """Only `names` of one Parquet file (those it has), as Python lists."""
    pf = _parquet(path)
    have = [n for n in names if n in pf.schema_arrow.names]
    return pf.read(columns=have).to_pydict() if have else {}


def table_provenance(tables: Iterable[DataPath]) -> tuple[Counter[str], dict[str, Counter[str]]]:
    """(rows per source, {provenance column: rows per value}) over the snapshot's shard tables."""
    rows: Counter[str] = Counter()
    values: dict[str, Counter[str]] = {c: Counter() for c in PROVENANCE_COLUMNS}
    for t in tables:
        cols = _column(t, ("source", *PROVENANCE_COLUMNS))
        rows.update(str(s) for s in cols.get("source", []))
        for c in PROVENANCE_COLUMNS:
            values[c].update(str(v) for v in cols.get(c, []) if v is not None)
    return rows, values


def release_order(release: str) -> tuple[Any, ...]:
    """Sorts SGLang releases by version (0.5.9 before 0.5.12), `unknown` last."""
    parts = re.split(r"[.\-+]", release)
    return (release == UNKNOWN_RELEASE, *((0, int(p), "") if p.isdigit() else (1, 0, p) for p in parts))


def served_by(tables: Iterable[DataPath]) -> dict[str, Any]:
    """What served a snapshot's rows, read from its training tables (train/samples.py SERVED_BY_COLUMNS):
    `sglang_versions` {release: rows} (`unknown`: the row records none), `workers` (distinct servers named)
    and `rows_without_worker` (a gateway that names no worker, or a table from before the column)."""
    releases: Counter[str] = Counter()
    workers: set[str] = set()
    no_worker = 0
    for t in tables:
        pf = _parquet(t)
        have = [c for c in SERVED_BY_COLUMNS if c in pf.schema_arrow.names]
        if "sglang_version" not in have:
            releases[UNKNOWN_RELEASE] += pf.metadata.num_rows
        if "worker" not in have:
            no_worker += pf.metadata.num_rows
        for b in pf.iter_batches(batch_size=4096, columns=have) if have else ():
            cols = b.to_pydict()
            releases.update(str(v) if v else UNKNOWN_RELEASE for v in cols.get("sglang_version", ()))
            named = [str(w) for w in cols.get("worker", ()) if w]
            workers.update(named)
            no_worker += b.num_rows - len(named) if "worker" in cols else 0
    counts = dict(sorted(releases.items(), key=lambda kv: release_order(kv[0])))
    return {"sglang_versions": counts, "workers": len(workers), "rows_without_worker": no_worker}


def _prompt_sources(data: DataPath, shards: set[int]) -> tuple[Counter[str], dict[str, str]]:
    """(unique prompts per source over every shard, prompt_id -> source of the prompts in `shards`)."""
    f = data / "prompts" / "prompts.parquet"
    every: Counter[str] = Counter()
    owner: dict[str, str] = {}
    if not f.exists():
        return every, owner
    cols = _column(f, ("prompt_id", "source", "shard"))
    for pid, src, shard in zip(cols["prompt_id"], cols["source"], cols["shard"], strict=True):
        every[src] += 1
        if shard in shards:
            owner[pid] = src
    return every, owner


def _ingest_counts(data: DataPath, name: str, every_prompt: Counter[str], overlap: tuple[int, int]) -> SourceCounts:
    c = SourceCounts(eval_overlap=overlap[0], probe_overlap=overlap[1])
    counts = _json(data / "sources" / name / "counts.json")
    if counts is None:
        return c
    c.read, c.accepted = int(counts.get("read", 0)), int(counts.get("accepted", 0))
    c.rejected, c.sampled_out = int(counts.get("rejected", 0)), int(counts.get("sampled_out", 0))
    # accepted = kept in prompts + quarantined as eval or probe overlap + already in an earlier source
    c.duplicates = int(counts.get("duplicates", 0))
    c.cross_source_duplicates = c.accepted - every_prompt.get(name, 0) - c.eval_overlap - c.probe_overlap
    return c


def _stage_counts(data: DataPath, shards: Sequence[int], owner: dict[str, str], by: dict[str, SourceCounts]) -> None:
    """Tokenize rejects, gate quarantines and failed requests of the counted shards, per source."""
    for k in shards:
        key = f"{k:04d}"
        rej = data / "tokenized_prompts" / f"shard={key}" / "rejects.parquet"
        if rej.exists():
            for src in _column(rej, ("source",)).get("source", []):
                by.setdefault(str(src), SourceCounts()).tokenize_rejected += 1
        for g in ROW_GATES:
            res = _json(data / "gates" / g / f"shard={key}.json") or {}
            for src, pair in (res.get("by_source") or {}).items():
                by.setdefault(str(src), SourceCounts()).gate_quarantined += int(pair[1])
        errors = data / "generations" / f"shard={key}" / "errors.parquet"
        if errors.exists():
            for pid in _column(errors, ("prompt_id",)).get("prompt_id", []):
                by.setdefault(owner.get(pid, "(unknown source)"), SourceCounts()).generation_failed += 1


def training_rows(tables: Iterable[DataPath]) -> tuple[Counter[str], dict[str, set[str]]]:
    """(rows per source, the prompt ids with a row per source) of training tables."""
    rows: Counter[str] = Counter()
    prompts: dict[str, set[str]] = {}
    for t in tables:
        cols = _column(t, ("source", "prompt_id"))
        sources = cols.get("source", [])
        for src, pid in zip(sources, cols.get("prompt_id") or [None] * len(sources), strict=True):
            rows[str(src)] += 1
            if pid is not None:
                prompts.setdefault(str(src), set()).add(str(pid))
    return rows, prompts


def source_counts(
    data: DataPath,
    names: Sequence[str],
    shards: Sequence[int],
    tables: Iterable[DataPath],
    probe_sources: Iterable[str] = (),
) -> dict[str, SourceCounts]:
    """Every source's figures (the configured `names` and any other source the prompts or rows name), by name,
    over the training tables `tables` of the counted `shards`; `probe_sources`: the role: probe ones."""
    every, owner = _prompt_sources(data, set(shards))
    rows_by_source, trained_prompts = training_rows(tables)
    decon = _json(data / "prompts" / "decontamination.json") or {}
    evals = decon.get("eval_overlap_by_training_source") or {}
    probes_overlap = decon.get("probe_overlap_by_training_source") or {}
    inside: Counter[str] = Counter(owner.values())
    by: dict[str, SourceCounts] = {}
    for name in dict.fromkeys([*names, *sorted(rows_by_source), *sorted(inside)]):
        by[name] = _ingest_counts(data, name, every, (int(evals.get(name, 0)), int(probes_overlap.get(name, 0))))
    _stage_counts(data, shards, owner, by)
    probe = set(probe_sources)
    for name, c in by.items():
        c.prompts, c.rows = inside.get(name, 0), rows_by_source.get(name, 0)
        c.other_shards = every.get(name, 0) - c.prompts
        if name in probe:
            c.probe_prompts = c.prompts
        else:
            c.trained = sum(1 for pid in trained_prompts.get(name, ()) if owner.get(pid) == name)
            c.no_row = c.prompts - c.trained
    return by


def gate_facts(data: DataPath, shards: Sequence[int]) -> list[GateFacts]:
    """What each row-level gate decided over the snapshot's shards (its stored results)."""
    out = []
    for g in ROW_GATES:
        f = GateFacts(g)
        for k in shards:
            res = _json(data / "gates" / g / f"shard={k:04d}.json")
            if res is None:
                continue
            f.shards_passed += bool(res.get("success"))
            f.rows_checked += int(res.get("n_rows") or 0)
            f.rows_quarantined += int(res.get("n_row_failures") or 0)
            sha = res.get("suite_sha256")
            if sha and sha not in f.suites:
                f.suites.append(str(sha))
        out.append(f)
    return out


def weight_versions(values: dict[str, Counter[str]]) -> list[str]:
    """The weight versions the rows' model revisions name (`model_path@weight_version`)."""
    return sorted({v.rsplit("@", 1)[1] for v in values.get("model_revision", {}) if "@" in v})
