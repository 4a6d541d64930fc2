"""Ingest one source into accepted/rejected Parquet, and combine sources into the prompts table.

Counts always reconcile: every record read is accepted, rejected (with a reason code), a duplicate
of an earlier prompt in the same source, or (only with sample_fraction) sampled out:

    read == accepted + rejected + duplicates + sampled_out

"Duplicate" means the same prompt_id, i.e. the same prompt AFTER the prompt rule (plus tools):
two conversations that differ only in the dropped final assistant turn are duplicates.

Memory stays flat in the number of rows: records stream from the reader, accepted rows are written
in batches with a ParquetWriter, and deduplication keeps one 16-byte digest per prompt.
Outputs are written under temporary names and renamed into place only when the whole source
succeeded, so a failed run leaves the previous outputs untouched.

Decontamination (decontaminate.py): combine_sources takes the eval sources (`role: eval`) apart from
the training sources; their prompts are only the reference, never written to prompts.parquet, and
every training prompt overlapping one becomes a reject row `eval_overlap` in prompt_rejects.parquet
(counted in `rejects` and in `eval_overlap`); prompts/decontamination.json has the per-eval-source
figures for the report.

Probe sets (`role: probe`, docs/probes.md) are the other way round: their prompts ARE written to
prompts.parquet (they are tokenized and generated, for every drafter the fleet runs) and are kept out
of training by the training stage; combine_sources takes their names (`probe_sources`, passed last in
`source_dirs`) and quarantines every training prompt overlapping one as `probe_overlap`, by the same
rules and index as an eval overlap.

`source_file` (lineage, on accepted and rejected rows) is the local path of the file read, or for
a source named by a URI (remote.py) the URI without its query: `s3://bucket/prompts/part-1.jsonl.gz`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow as pa

from .. import schemas
from ..storage import DataPath, ParquetSink, as_data_path, parquet_file
from .bfcl import FunctionDocs, join_function_docs, tool_changes
from .canonical import canonical_json, shard_of
from .counts import PROBE_OVERLAP, CombineCounts, SourceCounts
from .decontaminate import DEFAULT_OVERLAP_THRESHOLD, EvalIndex, Overlap, user_texts
from .decontaminate import REASON as EVAL_OVERLAP
from .errors import EmptySourceError, IngestFileError, RowReject
from .health import empty_source_message
from .normalize import FORMAT_ALIASES, build_conversation, build_prompt, detect_layout
from .prompts_table import ShardSortedWriter
from .readers import RawRecord, cut_utf8, iter_records, safe_text
from .spec import CONTROL_TEXT_POLICIES, SourceSpec
from .turns import regenerate_options

ACCEPTED_FILE = "accepted.parquet"
REJECTS_FILE = "rejects.parquet"
COUNTS_FILE = "counts.json"
PROMPTS_FILE = "prompts.parquet"
PROMPT_REJECTS_FILE = "prompt_rejects.parquet"
DECONTAMINATION_FILE = "decontamination.json"

_BATCH_ROWS = 8192
OutDir = Path | str | DataPath


@dataclass(frozen=True)
class EvalSet:
    """An eval source's ingest folder (accepted.parquet + counts.json), the decontamination reference."""

    name: str
    out_dir: OutDir
    overlap_threshold: float = DEFAULT_OVERLAP_THRESHOLD


class _AtomicParquetWriter:
    """Batched ParquetWriter that appears under its final name only on commit() (storage.ParquetSink:
    local temp file + rename, or on object storage a local spool uploaded in one call)."""

    def __init__(self, path: DataPath, schema: pa.Schema) -> None:
        self.path = path
        self.schema = schema
        self._sink = ParquetSink(path, schema, compression="zstd")
        self._columns: dict[str, list[Any]] = {n: [] for n in schema.names}
        self._pending = 0
        self.rows = 0

    def add(self, row: dict[str, Any]) -> None:
        for name, values in self._columns.items():
            values.append(row[name])
        self._pending += 1
        if self._pending >= _BATCH_ROWS:
            self.flush()

    def add_table(self, table: pa.Table) -> None:
        self.flush()
        self._sink.write_table(table.select(self.schema.names).cast(self.schema))
        self.rows += table.num_rows

    def flush(self) -> None:
        if self._pending:
            self._sink.write_table(pa.table(self._columns, schema=self.schema))
            self.rows += self._pending
            self._columns = {n: [] for n in self.schema.names}
            self._pending = 0

    def close(self) -> None:
        self.flush()
        self._sink.close()

    def commit(self) -> None:
        self._sink.commit()

    def abort(self) -> None:
        self._sink.abort()


def _write_json_atomic(obj: Any, path: DataPath) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def _keep_sample(digest: bytes, fraction: float, seed: int) -> bool:
    # Content-hashed, so the same prompt is kept or dropped whatever its row, file or run.
    h = hashlib.sha256(seed.to_bytes(8, "little", signed=True) + digest).digest()
    return int.from_bytes(h[:8], "big") < fraction * 2**64


@dataclass
class _Prompt:
    """One record as a prompt: canonical JSON of its messages and tools (and for all_turns its whole
    conversation and regenerate options), and the bytes its prompt_id hashes."""

    messages_json: str
    tools_json: str | None
    n_messages: int
    payload: bytes
    conversation_json: str | None = None
    regenerate_json: str | None = None


def _record_prompt(value: Any, spec: SourceSpec, docs: FunctionDocs | None) -> _Prompt:
    """The prompt of one record; a record that cannot be one raises RowReject."""
    value, added = join_function_docs(value, docs) if docs is not None else (value, {})
    conversation: Any = None
    options: dict[str, Any] = {}
    if spec.all_turns:  # turns.py: messages = turn 1's prompt, the whole conversation beside it
        conversation, tools = build_conversation(value, fmt=spec.format, field_map=spec.field_map)
        messages, options = regenerate_options(
            conversation, max_turns=spec.max_turns, on_tool_mismatch=spec.on_tool_mismatch
        )
        if added:  # BFCL miss_func: the tools from the turn a function is added on
            options["tools_from"] = tool_changes(conversation, value, added, tools)
    else:
        messages, tools = build_prompt(value, fmt=spec.format, field_map=spec.field_map, prompt_rule=spec.prompt_rule)
    try:
        return _canonical_prompt(messages, tools, conversation if spec.all_turns else None, options)
    except UnicodeEncodeError:
        raise RowReject("invalid_unicode", "text holds a lone surrogate (an unpaired \\ud800-\\udfff escape)") from None
    except ValueError as e:  # allow_nan=False: canonical JSON has no NaN/Infinity
        raise RowReject("bad_number", f"a number in the prompt or tools is NaN or Infinity: {e}") from None


def _canonical_prompt(messages: list[Any], tools: Any, conversation: Any, options: dict[str, Any]) -> _Prompt:
    messages_json = canonical_json(messages)
    tools_json = canonical_json(tools) if tools is not None else None
    # Same bytes as canonical_json({"messages": ..., "tools": ...}) ("messages" sorts
    # before "tools"), without serializing the prompt twice.
    payload = f'{{"messages":{messages_json},"tools":{tools_json or "null"}}}'.encode()
    prompt = _Prompt(messages_json, tools_json, len(messages), payload)
    if conversation is not None:
        # another unit of work than the final-turn prompt of the same record: its own id
        prompt.conversation_json = canonical_json(conversation)
        prompt.regenerate_json = canonical_json(options)
        prompt.payload += f"|all_turns|{prompt.regenerate_json}|{prompt.conversation_json}".encode()
    return prompt


class _SourceOutputs:
    """A source's accepted and reject rows being written, with their counts and the prompt ids seen."""

    def __init__(self, spec: SourceSpec, out_dir: DataPath, n_shards: int) -> None:
        self.spec, self.n_shards = spec, n_shards
        self.counts = SourceCounts()
        self.seen: set[bytes] = set()
        self.accepted = _AtomicParquetWriter(out_dir / ACCEPTED_FILE, schemas.PROMPTS)
        self.rejects = _AtomicParquetWriter(out_dir / REJECTS_FILE, schemas.PROMPT_REJECTS)

    def reject(self, file: str, rec: RawRecord, reason: str, detail: str) -> None:
        self.counts.rejected += 1
        self.counts.rejects_by_reason[reason] = self.counts.rejects_by_reason.get(reason, 0) + 1
        self.rejects.add(
            {
                "source": self.spec.name,
                "source_file": file,
                "source_row": rec.row,
                "reason": reason,
                "detail": safe_text(detail)[:500],
                "excerpt": rec.excerpt(),
            }
        )

    def offer(self, file: str, rec: RawRecord, prompt: _Prompt) -> None:
        """Accept the prompt unless sampled out or a duplicate of one already accepted."""
        spec = self.spec
        digest = hashlib.sha256(prompt.payload).digest()[:16]
        if spec.sample_fraction is not None and not _keep_sample(digest, spec.sample_fraction, spec.seed):
            self.counts.sampled_out += 1
            return
        if digest in self.seen:
            self.counts.duplicates += 1
            return
        self.seen.add(digest)
        prompt_id = digest.hex()
        self.accepted.add(
            {
                "prompt_id": prompt_id,
                "source": spec.name,
                "source_file": file,
                "source_row": rec.row,
                "shard": shard_of(prompt_id, self.n_shards),
                "messages": prompt.messages_json,
                "tools": prompt.tools_json,
                "n_messages": prompt.n_messages,
                "conversation": prompt.conversation_json,
                "regenerate": prompt.regenerate_json,
            }
        )
        self.counts.accepted += 1

    def full(self) -> bool:
        return self.spec.limit is not None and self.counts.accepted >= self.spec.limit

    def abort(self) -> None:
        self.accepted.abort()
        self.rejects.abort()


def _read_source(spec: SourceSpec, files: Sequence[Any], docs: FunctionDocs | None, out: _SourceOutputs) -> None:
    """Every record of the source's files, rejected or offered, until the source's limit."""
    for path in files:
        file = safe_text(str(path))
        for rec in iter_records(path, max_bytes=spec.max_bytes):
            out.counts.read += 1
            if rec.error is not None:
                out.reject(file, rec, *rec.error)
                continue
            try:
                prompt = _record_prompt(rec.value, spec, docs)
            except RowReject as r:
                out.reject(file, rec, r.reason, r.detail)
                continue
            out.offer(file, rec, prompt)
            if out.full():
                return


def ingest_source(spec: SourceSpec, out_dir: OutDir, *, n_shards: int, require_accepted: bool = False) -> SourceCounts:
    """Read every file of `spec`; write out_dir/accepted.parquet, rejects.parquet and counts.json.

    Raises IngestFileError (naming the file) when a file is missing or unreadable as a whole;
    then nothing is written. Bad rows never raise: they become reject rows. With
    `require_accepted`, a source with no accepted prompt raises EmptySourceError (naming the
    source and its reject counts) and writes nothing, so the previous outputs stay.
    """
    if n_shards < 1:
        raise ValueError(f"n_shards must be >= 1, got {n_shards}")
    files = spec.files()
    docs_folder = spec.function_docs_folder()
    docs = FunctionDocs(docs_folder, spec.name) if docs_folder is not None else None  # bfcl.py
    out_dir = as_data_path(out_dir)
    out = _SourceOutputs(spec, out_dir, n_shards)
    counts = out.counts
    try:
        _read_source(spec, files, docs, out)
        out.accepted.close()
        out.rejects.close()
        if require_accepted and counts.accepted == 0:
            raise EmptySourceError(empty_source_message(spec, counts))
    except BaseException:
        out.abort()
        raise
    out.accepted.commit()
    out.rejects.commit()
    _write_json_atomic(
        {
            "source": spec.name,
            "role": spec.role,
            **counts.as_dict(),
            "max_reject_rate": spec.max_reject_rate,
            "allow_empty": spec.allow_empty,
        },
        out_dir / COUNTS_FILE,
    )
    assert counts.reconciles(), counts  # an internal bug, not bad input
    return counts


FIRST_RECORDS = 20  # the records `eagle3 check` reads of each local source (first_records_problem)


def first_records_problem(spec: SourceSpec, n: int = FIRST_RECORDS) -> str | None:
    """None when one of the source's first `n` records makes a prompt as the ingest reads it (its `format`,
    `field_map`, `prompt_rule`); else one line: how many were read, the commonest reason with its first
    detail, and the layout the first record looks like when `format` names another. An empty source is the
    ingest's to judge (`allow_empty`). Raises IngestFileError as the ingest does (a missing file)."""
    from collections import Counter

    docs_folder = spec.function_docs_folder()
    docs = FunctionDocs(docs_folder, spec.name) if docs_folder is not None else None
    reasons: Counter[str] = Counter()
    details: dict[str, str] = {}
    first: Any = None
    for rec in _first_records(spec, n):
        if rec.error is not None:
            reason, detail = rec.error
        else:
            first = rec.value if first is None else first
            try:
                _record_prompt(rec.value, spec, docs)
                return None
            except RowReject as r:
                reason, detail = r.reason, r.detail
        reasons[reason] += 1
        details.setdefault(reason, detail)
    if not reasons:
        return None
    (reason, count), read = reasons.most_common(1)[0], sum(reasons.values())
    looks = ""
    if isinstance(first, dict):
        try:
            layout = detect_layout(first)
            if FORMAT_ALIASES.get(spec.format) not in (layout, "auto"):
                looks = f"; the first record looks like format {layout!r}"
        except RowReject:
            pass
    return (
        f"field 'format': none of the first {read} record(s) makes a prompt as format {spec.format!r}"
        f"{' with its field_map' if spec.field_map else ''} ({count} rejected as {reason}: "
        f"{safe_text(details[reason])[:200]}){looks}"
    )


def _first_records(spec: SourceSpec, n: int):
    """The first `n` raw records of the source's files, in the ingest's order."""
    read = 0
    for path in spec.files():
        for rec in iter_records(path, max_bytes=spec.max_bytes):
            yield rec
            read += 1
            if read >= n:
                return


def _source_outputs(d: DataPath) -> tuple[DataPath, DataPath, DataPath]:
    acc_path, rej_path, counts_path = d / ACCEPTED_FILE, d / REJECTS_FILE, d / COUNTS_FILE
    for p in (acc_path, rej_path, counts_path):
        if not p.is_file():
            raise IngestFileError(f"{p}: missing; ingest the source first")
    return acc_path, rej_path, counts_path


def build_eval_index(eval_sets: Sequence[EvalSet]) -> EvalIndex:
    """Every eval source's accepted prompts (user turns), indexed for `EvalIndex.match`."""
    index = EvalIndex()
    for es in eval_sets:
        d = as_data_path(es.out_dir)
        acc_path, _, counts_path = _source_outputs(d)
        index.add_source(es.name, es.overlap_threshold)
        try:
            expected = int(json.loads(counts_path.read_text())["accepted"])
            columns = ["prompt_id", "source_row", "messages", "conversation"]
            for batch in parquet_file(acc_path).iter_batches(batch_size=_BATCH_ROWS, columns=columns):
                for row in batch.to_pylist():
                    index.add(
                        es.name, row["prompt_id"], row["source_row"], user_texts(row["messages"], row["conversation"])
                    )
        except (OSError, pa.ArrowException, KeyError, ValueError, TypeError) as e:
            raise IngestFileError(f"{d}: cannot read the eval source's outputs: {e}") from None
        if index.stats[es.name].eval_prompts != expected:
            raise IngestFileError(
                f"{d}: {COUNTS_FILE} does not match {ACCEPTED_FILE} (mixed runs?); re-ingest the source"
            )
    return index


def strictest_first(source_dirs: Sequence[DataPath], control_text: Mapping[str, str]) -> list[DataPath]:
    """The source folders in the given order, stably re-ordered so that a stricter `control_text` policy
    (CONTROL_TEXT_POLICIES, strictest first; a source not named: reject) comes first. The first occurrence
    of a prompt wins the dedupe and tokenize applies the policy of the source it kept, so a prompt held by
    sources with different policies is tokenized under the strictest of them, whatever their order."""

    def rank(d: DataPath) -> int:
        try:
            name = json.loads((d / COUNTS_FILE).read_text()).get("source")
        except (OSError, ValueError, AttributeError):
            return 0  # the combine below names the missing or unreadable file
        policy = control_text.get(name, CONTROL_TEXT_POLICIES[0])
        return CONTROL_TEXT_POLICIES.index(policy) if policy in CONTROL_TEXT_POLICIES else 0

    return sorted(source_dirs, key=rank)


def _reference_overlap(
    row: dict[str, Any], index: EvalIndex, probe_index: EvalIndex, probe_names: frozenset[str]
) -> tuple[str, Overlap] | None:
    """(reason, overlap) when this training prompt overlaps an eval or probe prompt; a probe prompt is
    not checked (it is never trained on, and would match itself)."""
    if row["source"] in probe_names or not (len(index) or len(probe_index)):
        return None
    texts = user_texts(row["messages"], row["conversation"])
    overlap = index.match(texts) if len(index) else None
    if overlap is not None:
        index.record(overlap)
        return EVAL_OVERLAP, overlap
    overlap = probe_index.match(texts) if len(probe_index) else None
    if overlap is not None:
        probe_index.record(overlap)
        return PROBE_OVERLAP, replace(overlap, kind_of_set="probe")
    return None


def _count_overlap(counts: CombineCounts, reason: str, src: str) -> None:
    if reason == EVAL_OVERLAP:
        counts.eval_overlap += 1
        counts.eval_overlap_by_source[src] = counts.eval_overlap_by_source.get(src, 0) + 1
    else:
        counts.probe_overlap += 1
        counts.probe_overlap_by_source[src] = counts.probe_overlap_by_source.get(src, 0) + 1
    counts.rejects += 1
    counts.rejects_by_reason[reason] = counts.rejects_by_reason.get(reason, 0) + 1


def combine_sources(
    source_dirs: Sequence[OutDir],
    out_dir: OutDir,
    *,
    n_shards: int,
    eval_sets: Sequence[EvalSet] = (),
    control_text: Mapping[str, str] | None = None,
    probe_sets: Sequence[EvalSet] = (),
) -> CombineCounts:
    """Union of the training sources' accepted rows, in the given order, first occurrence of a prompt wins.

    `control_text` (source name -> its YAML's policy, as tokenize reads it): sources with a stricter
    policy go first (strictest_first), so a prompt in several sources keeps the strictest policy.

    Writes out_dir/prompts.parquet (schemas.PROMPTS, shard recomputed for `n_shards`),
    out_dir/prompt_rejects.parquet (every training source's rejects, plus one `eval_overlap` row per
    training prompt that overlaps a prompt of `eval_sets`, decontaminate.py) and
    out_dir/decontamination.json. Raises IngestFileError naming the file when a source folder
    lacks its outputs. `probe_sets`: the probe sources (also in `source_dirs`, last): their prompts are
    combined like any source's, and training prompts overlapping one are quarantined as `probe_overlap`.
    """
    if n_shards < 1:
        raise ValueError(f"n_shards must be >= 1, got {n_shards}")
    out_dir = as_data_path(out_dir)
    dirs = strictest_first([as_data_path(d) for d in source_dirs], control_text or {})
    combiner = _Combiner(out_dir, n_shards, build_eval_index(eval_sets), build_eval_index(probe_sets), probe_sets)
    counts = combiner.counts
    counts.sources, counts.eval_sources = len(source_dirs), len(eval_sets)
    try:
        for d in dirs:
            combiner.add_source(d)
        combiner.prompts.close()
        combiner.rejects.close()
    except BaseException:
        combiner.prompts.abort()
        combiner.rejects.abort()
        raise
    combiner.prompts.commit()
    combiner.rejects.commit()
    summary = decontamination_summary(combiner.index, counts)
    summary["probe_overlap"] = counts.probe_overlap
    summary["probe_overlap_by_training_source"] = counts.probe_overlap_by_source
    summary["probe_sources"] = [{"source": name, **asdict(st)} for name, st in combiner.probe_index.stats.items()]
    _write_json_atomic(summary, out_dir / DECONTAMINATION_FILE)
    assert counts.reconciles(), counts  # an internal bug, not bad input
    return counts


class _Combiner:
    """The prompts table and the prompt rejects being written from the sources' outputs, with the counts."""

    def __init__(
        self, out_dir: DataPath, n_shards: int, index: EvalIndex, probe_index: EvalIndex, probe_sets: Sequence[EvalSet]
    ) -> None:
        self.n_shards, self.index, self.probe_index = n_shards, index, probe_index
        self.probe_names = frozenset(p.name for p in probe_sets)
        self.counts = CombineCounts(eval_prompts=len(index), probe_sources=len(probe_sets))
        self.seen: set[bytes] = set()
        self.prompts = ShardSortedWriter(out_dir / PROMPTS_FILE, schemas.PROMPTS)  # read a shard at a time
        self.rejects = _AtomicParquetWriter(out_dir / PROMPT_REJECTS_FILE, schemas.PROMPT_REJECTS)

    def add_source(self, d: DataPath) -> None:
        """One source folder's accepted rows and rejects; its counts.json must match them."""
        counts = self.counts
        acc_path, rej_path, counts_path = _source_outputs(d)
        before = (counts.input_accepted, counts.rejects - counts.eval_overlap - counts.probe_overlap)
        try:
            source_counts = _training_source_counts(d, counts_path)
            counts.read += int(source_counts["read"])
            counts.source_duplicates += int(source_counts["duplicates"])
            counts.sampled_out += int(source_counts.get("sampled_out", 0))
            for batch in parquet_file(acc_path).iter_batches(batch_size=_BATCH_ROWS, columns=schemas.PROMPTS.names):
                for row in batch.to_pylist():
                    self._add_row(row)
            self._add_rejects(rej_path)
        except IngestFileError:
            raise
        except (OSError, pa.ArrowException, KeyError, ValueError, TypeError) as e:
            raise IngestFileError(f"{d}: cannot read the source's outputs: {e}") from None
        # The three files must come from the same run, or the totals would not reconcile.
        removed = counts.eval_overlap + counts.probe_overlap
        if (counts.input_accepted - before[0], counts.rejects - removed - before[1]) != (
            int(source_counts["accepted"]),
            int(source_counts["rejected"]),
        ):
            raise IngestFileError(
                f"{d}: {COUNTS_FILE} does not match the Parquet outputs (mixed runs?); re-ingest the source"
            )

    def _add_row(self, row: dict[str, Any]) -> None:
        """An accepted row: a cross-source duplicate, quarantined for an overlap, or a prompt."""
        counts = self.counts
        counts.input_accepted += 1
        digest = bytes.fromhex(row["prompt_id"])
        if digest in self.seen:
            counts.cross_source_duplicates += 1
            counts.duplicates_by_source[row["source"]] = counts.duplicates_by_source.get(row["source"], 0) + 1
            return
        self.seen.add(digest)
        found = _reference_overlap(row, self.index, self.probe_index, self.probe_names)
        if found is not None:
            reason, overlap = found
            # a quarantined prompt claims no prompt_id: the probe prompt itself (a later
            # source) must still get in, and a later copy gets its own reject row
            self.seen.discard(digest)
            _count_overlap(counts, reason, row["source"])
            self.rejects.add(
                {
                    "source": row["source"],
                    "source_file": row["source_file"],
                    "source_row": row["source_row"],
                    "reason": reason,
                    "detail": overlap.detail(),
                    "excerpt": cut_utf8(row["messages"], 200),
                }
            )
            return
        row["shard"] = shard_of(row["prompt_id"], self.n_shards)
        self.prompts.add(row)
        counts.prompts += 1
        counts.prompts_by_source[row["source"]] = counts.prompts_by_source.get(row["source"], 0) + 1

    def _add_rejects(self, rej_path: DataPath) -> None:
        for rej_batch in parquet_file(rej_path).iter_batches(
            batch_size=_BATCH_ROWS, columns=schemas.PROMPT_REJECTS.names
        ):
            self.rejects.add_table(pa.Table.from_batches([rej_batch]))
            self.counts.rejects += rej_batch.num_rows
            for reason in rej_batch.column("reason").to_pylist():
                self.counts.rejects_by_reason[reason] = self.counts.rejects_by_reason.get(reason, 0) + 1


def _training_source_counts(d: DataPath, counts_path: DataPath) -> dict[str, Any]:
    """A source's counts.json; an eval source is refused (it is the reference, never training data)."""
    source_counts: dict[str, Any] = json.loads(counts_path.read_text())
    if source_counts.get("role") == "eval":
        raise IngestFileError(
            f"{d}: source {source_counts.get('source')!r} was ingested as role: eval; an eval source is the "
            "decontamination reference, never training data: pass it in eval_sets (or re-ingest it after "
            "changing its role)"
        )
    return source_counts


def decontamination_summary(index: EvalIndex, counts: CombineCounts) -> dict[str, Any]:
    """prompts/decontamination.json: per eval source, its prompts and the training prompts it removed."""
    from .decontaminate import NGRAM

    return {
        "ngram": NGRAM,
        # every training prompt that was not a cross-source duplicate was checked
        "training_prompts_checked": counts.input_accepted - counts.cross_source_duplicates if len(index) else 0,
        "eval_overlap": counts.eval_overlap,
        "eval_overlap_by_training_source": counts.eval_overlap_by_source,
        "eval_sources": [{"source": name, **asdict(st)} for name, st in index.stats.items()],
    }
