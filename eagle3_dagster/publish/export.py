"""Exports from a snapshot, in the shapes trainers read as they are.

- `specforge_prompts.jsonl` (token level): one object per sample, `{"id", "input_ids", "loss_mask"}` —
  pre-tokenized, token-exact, EVERY row (also the non-text-exact ones); SpecForge's ONLINE path
  (`data.prompts_path`) and vllm speculators 0.9.0's `speculators prepare-data --data` (speculator-format
  rows pass through, with `--seq-length` >= the manifest's max_total_len) read it as it is.
- `specforge_preformatted.jsonl` (text level): `{"id", "text"}`, text = the row's ids decoded with
  special tokens kept — SpecForge's OFFLINE path (`data.is_preformatted` / `--is-preformatted`, with
  `train_only_last_turn` and its `kimi-k2-thinking` / `qwen3-thinking` template) re-tokenizes it to the
  training row's ids and supervises the generated turn. Only rows for which that holds are written:
  non-text-exact rows (non-canonical tokenization) are LEFT OUT and counted in the manifest.
- `conversations.jsonl` (text level): `{"id", "conversations": [{"role", "content", "reasoning_content"?,
  "tool_calls"?, "tool_call_id"?}], "tools", "text_exact", "text_mismatch_pos"}` — EVERY row, the
  non-text-exact ones FLAGGED; for trainers that render it with a chat template themselves (SpecForge's
  `train_data_path`, speculators' /render route) — not token-exact that way: see docs/exports.md. Tool calls in
  OpenAI's shape everywhere: `function.arguments` is a JSON string; in the generated turn it is the
  model's bytes exactly.

Every export lists the rows shard by shard (shard order), within a shard in sample_id order (the order
the content identity hashes them in; until 2026-12 the exports were one global sample_id sort of the
whole snapshot held in memory: same rows, in another order when there are several shards). They are
written by streaming: each shard table is read a batch at a time (ParquetFile.iter_batches, BATCH_ROWS
rows, bounded read buffers: snapshot_row_batches) and each JSONL line written as its row comes, so
memory grows neither with the snapshot nor with its number of shards. The same shard tables give
byte-identical exports however they were written (tests/publish/test_export_streaming.py).

Each exporter returns its manifest entry: rows written, rows flagged or left out, and how many rows
SpecForge reproduces exactly (`specforge_exact_rows`, with how that was established).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..generate.group_acceptance import LEFT_OUT
from ..storage import DataPath, PathLike, TextSink, as_data_path
from ..train.conversations import openai_tool_calls
from ..train.samples import ACCEPTANCE_COLUMNS

SPECFORGE_FILE = "exports/specforge_prompts.jsonl"
PREFORMATTED_FILE = "exports/specforge_preformatted.jsonl"
CONVERSATIONS_FILE = "exports/conversations.jsonl"

# SpecForge 0.2.0's TEMPLATE_REGISTRY entries for our profiles (specforge/data/template.py):
# (template name, assistant_header, end_of_turn_token). tests/publish/test_specforge_lane.py checks these
# against the installed SpecForge and proves check_preformatted() agrees with its own preprocessing.
SPECFORGE_TEMPLATES: dict[str, tuple[str, str, str]] = {
    "kimi-k2.5": ("kimi-k2-thinking", "<|im_assistant|>assistant<|im_middle|>", "<|im_end|>"),
    "qwen3": ("qwen3-thinking", "<|im_start|>assistant\n", "<|im_end|>\n"),
}
BATCH_ROWS = 256  # rows per batch read from a shard table (and per batched encode of the preformatted check)
STREAM_BUFFER_BYTES = 1 << 20  # read buffer per column of a streamed Parquet file
# absent from tables written before them (or, the acceptance columns, without EAGLE3_TRAIN_ACCEPTANCE): read as null
OPTIONAL_COLUMNS = ("text_exact", "text_mismatch_pos", "control_text_in_content", *ACCEPTANCE_COLUMNS, LEFT_OUT)
CHECKED_BY = (
    "eagle3 check_preformatted (SpecForge 0.2.0 preprocess_conversations, is_preformatted=True, "
    "train_only_last_turn=True; agreement proven by tests/publish/test_specforge_lane.py)"
)
log = logging.getLogger(__name__)


def snapshot_shard_files(snapshot_dir: PathLike) -> list[DataPath]:
    """The snapshot's copied shard tables (training_samples/shard=NNNN.parquet), sorted by name."""
    return as_data_path(snapshot_dir).joinpath("training_samples").glob("shard=*.parquet")


def stream_parquet_file(path: PathLike) -> pq.ParquetFile:
    """A Parquet file opened for reading in batches in bounded memory: column chunks are read through a
    STREAM_BUFFER_BYTES buffer, not pre-buffered whole, so a batch of a row group as big as the whole
    shard costs that batch, not the row group (the pipeline writes up to 64 MB row groups)."""
    dp = as_data_path(path)
    source = dp.path if dp.is_local else dp.open_input_file()
    return pq.ParquetFile(source, buffer_size=STREAM_BUFFER_BYTES, pre_buffer=False)


def in_sample_id_order(ids: pa.ChunkedArray | pa.Array) -> bool:
    if len(ids) < 2:
        return True
    arr = ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids
    return bool(pc.all(pc.less_equal(arr.slice(0, len(arr) - 1), arr.slice(1))).as_py())


def shard_batches(path: PathLike, columns: Sequence[str], *, batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    """One shard table's rows in sample_id order, in Arrow batches of at most `batch_rows` rows, reading
    only `columns`: a batch at a time (ParquetFile.iter_batches), since the pipeline writes every table in
    sample_id order. A table that is not (written by something else) is read whole and sorted, with a
    warning naming it. `text_exact` / `text_mismatch_pos` absent (tables from before those columns) read
    as null (not known); any other absent column is an error."""
    pf = stream_parquet_file(path)
    names = set(pf.schema_arrow.names)
    missing = [c for c in columns if c not in names]
    if any(c not in OPTIONAL_COLUMNS for c in missing):
        raise KeyError(f"{path}: no column(s) {[c for c in missing if c not in OPTIONAL_COLUMNS]}")
    read = [c for c in columns if c in names]

    def filled(b: pa.RecordBatch) -> pa.RecordBatch:
        if not missing:
            return b
        cols = {c: b.column(c) if c in names else pa.nulls(b.num_rows) for c in columns}
        return pa.RecordBatch.from_pydict(cols)

    if in_sample_id_order(pf.read(columns=["sample_id"]).column(0)):
        for b in pf.iter_batches(batch_size=batch_rows, columns=read):
            yield filled(b)
        return
    log.warning(f"{path}: not in sample_id order; read whole and sorted (the pipeline writes every table sorted)")
    t = pf.read(columns=read)
    t = t.take(pc.sort_indices(t, sort_keys=[("sample_id", "ascending")]))
    for b in t.to_batches(max_chunksize=batch_rows):
        yield filled(b)


def snapshot_row_batches(
    snapshot_dir: PathLike, columns: Sequence[str], *, batch_rows: int = BATCH_ROWS
) -> Iterator[list[dict[str, Any]]]:
    """Every row of a snapshot's shard tables as lists of at most `batch_rows` row dicts with `columns`:
    shard by shard in shard order (the files' names: shard=0000, shard=0001, ...), within a shard in
    sample_id order (shard_batches).

    Streamed: one shard file open at a time, one Arrow batch and its rows in memory, whatever the
    snapshot's size or number of shards (a global sample_id order would need every shard open at once).
    Deterministic: the same shard tables give the same rows in the same order however they were
    written (row groups, row order, the order the files were made)."""
    columns = list(dict.fromkeys(["sample_id", *columns]))
    for f in snapshot_shard_files(snapshot_dir):
        for b in shard_batches(f, columns, batch_rows=batch_rows):
            yield b.to_pylist()


def snapshot_rows(
    snapshot_dir: PathLike, columns: Sequence[str], *, batch_rows: int = BATCH_ROWS
) -> Iterator[dict[str, Any]]:
    """snapshot_row_batches, one row at a time."""
    for rows in snapshot_row_batches(snapshot_dir, columns, batch_rows=batch_rows):
        yield from rows


def _write_jsonl(path: PathLike, rows) -> int:
    """Atomic: a local temporary file, renamed (local data) or uploaded in one call (object storage)."""
    sink = TextSink(path)
    n = 0
    try:
        for row in rows:
            sink.write(json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n")
            n += 1
    except BaseException:
        sink.abort()
        raise
    sink.commit()
    return n


class _Tally:
    """What an export's manifest entry says about the rows it went through (counted while streaming)."""

    def __init__(self) -> None:
        self.rows = 0
        self.not_text_exact = 0  # text_exact false (null = not known: not counted)
        self.control_text_as_served = 0  # control_text_in_content true: the prompt's data text became special ids
        self.max_total_len = 0
        self.with_acceptance = 0  # rows whose acceptance figures are exported
        self.acceptance_left_out: dict[str, int] = {}  # failed figure check -> rows (their figures exported null)
        self.acceptance_left_out_rows = 0

    def see(self, r: dict[str, Any]) -> None:
        self.rows += 1
        self.not_text_exact += r.get("text_exact") is False
        self.control_text_as_served += r.get("control_text_in_content") is True
        self.max_total_len = max(self.max_total_len, int(r.get("total_len") or 0))
        self.with_acceptance += r.get(ACCEPTANCE_COLUMNS[0]) is not None
        if r.get(LEFT_OUT):
            self.acceptance_left_out_rows += 1
            for check in str(r[LEFT_OUT]).split(","):
                self.acceptance_left_out[check] = self.acceptance_left_out.get(check, 0) + 1

    def acceptance(self) -> dict[str, Any]:
        """The manifest's account of the acceptance keys: rows with figures, rows left out (null) and why."""
        return {
            "rows_with_figures": self.with_acceptance,
            "rows_left_out_flagged": self.acceptance_left_out_rows,
            "left_out_by_check": dict(sorted(self.acceptance_left_out.items())),
            "rows_without_figures": self.rows - self.with_acceptance - self.acceptance_left_out_rows,
            "left_out_because": "their speculative-decoding figures failed their checks (spec_metrics_inconsistent:"
            "<which> in the generations table): null here, never a lying figure",
        }


def snapshot_has_acceptance(snapshot_dir: PathLike) -> bool:
    """The snapshot's training tables carry the acceptance columns (built with EAGLE3_TRAIN_ACCEPTANCE)."""
    return any(
        ACCEPTANCE_COLUMNS[0] in stream_parquet_file(f).schema_arrow.names for f in snapshot_shard_files(snapshot_dir)
    )


def export_specforge_prompts(snapshot_dir: PathLike, exports_dir: PathLike) -> dict[str, Any]:
    """`{"id", "input_ids", "loss_mask"}` a row; plus its acceptance figures (`spec_accept_rate`,
    `spec_accept_length`, null where not speculated or where the figures failed their checks, counted in the
    manifest) when the tables carry them: extra keys both SpecForge's and speculators' loaders leave alone."""
    snapshot_dir = as_data_path(snapshot_dir)
    tally = _Tally()
    extra = list(ACCEPTANCE_COLUMNS) if snapshot_has_acceptance(snapshot_dir) else []
    tallied = [LEFT_OUT] if extra else []

    def rows() -> Iterator[dict[str, Any]]:
        cols = ["sample_id", "input_ids", "loss_mask", "total_len", "text_exact", "control_text_in_content"]
        cols += [*extra, *tallied]
        for r in snapshot_rows(snapshot_dir, cols):
            tally.see(r)
            yield {
                "id": r["sample_id"],
                "input_ids": r["input_ids"],
                "loss_mask": r["loss_mask"],
                **{c: r[c] for c in extra},
            }

    n = _write_jsonl(snapshot_dir / SPECFORGE_FILE, rows())
    max_len = tally.max_total_len
    return {
        SPECFORGE_FILE: {
            "rows": n,
            "format": "input_ids + loss_mask: SpecForge online (prompts_path), vllm speculators prepare-data",
            "rows_not_text_exact": tally.not_text_exact,  # kept: token level
            "rows_control_text_as_served": tally.control_text_as_served,  # kept: the ids the server was sent
            "specforge_exact_rows": n,
            "max_total_len": max_len,
            "specforge_exact_check": f"token level, copied ids; exact for every row when data.max_length >= {max_len}",
            # speculators clips rows past --seq-length (default 8192) with only a warning: the value that keeps all
            "speculators_settings": {"--seq-length": max_len},
            **({"acceptance": tally.acceptance()} if extra else {}),
        }
    }


def _encode_many(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    if not texts:
        return []
    return [list(x) for x in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def check_preformatted_batch(
    rows: list[tuple[list[int], int]], tokenizer: Any, profile_name: str
) -> list[tuple[str, str | None]]:
    """For each (input_ids, prompt_len): (text, None) when SpecForge's offline preformatted route reproduces
    the row exactly, else (text, reason).

    Mirrors SpecForge 0.2.0 (GeneralParser.parse with preformatted=True, train_only_last_turn=True): it
    encodes the text, matches `header(.*?(?:end_of_turn|$))` over it, keeps the last match and maps its
    characters to tokens by the lengths of encode(text[:start]) and encode(text[:end]). Exact: its ids
    are input_ids and the supervised span is the generated ids (optionally also the prefilled `<think>`
    at prompt_len - 1, SpecForge's convention for templates that prefill it). Batched encodes.
    """
    texts = tokenizer.batch_decode(
        [list(ids) for ids, _ in rows], skip_special_tokens=False, clean_up_tokenization_spaces=False
    )
    if profile_name not in SPECFORGE_TEMPLATES:
        return [(t, "no_specforge_template") for t in texts]
    _, header, eot = SPECFORGE_TEMPLATES[profile_name]
    full = _encode_many(tokenizer, texts)
    pattern = re.compile(re.escape(header) + r"([\s\S]*?(?:" + re.escape(eot) + "|$))", re.DOTALL)  # SpecForge's
    spans: list[tuple[int, int] | None] = []
    for t in texts:
        matches = list(pattern.finditer(t))  # SpecForge takes the last match
        spans.append((matches[-1].start(1), matches[-1].end(1)) if matches else None)
    prefix_texts = [t[: sp[0]] for t, sp in zip(texts, spans) if sp is not None]
    end_texts = [t[: sp[1]] for t, sp in zip(texts, spans) if sp is not None and sp[1] != len(t)]
    prefix_lens = iter(len(x) for x in _encode_many(tokenizer, prefix_texts))
    end_lens = iter(len(x) for x in _encode_many(tokenizer, end_texts))
    out: list[tuple[str, str | None]] = []
    for (ids, prompt_len), text, enc, sp in zip(rows, texts, full, spans):
        if sp is None:
            out.append((text, "supervised_span_differs"))
            continue
        s_tok = next(prefix_lens)
        e_tok = len(enc) if sp[1] == len(text) else next(end_lens)
        if enc != list(ids):
            out.append((text, "not_text_exact"))
        elif e_tok != len(ids) or s_tok not in (prompt_len, prompt_len - 1):
            out.append((text, "supervised_span_differs"))
        else:
            out.append((text, None))
    return out


def check_preformatted(
    input_ids: list[int], prompt_len: int, tokenizer: Any, profile_name: str
) -> tuple[str, str | None]:
    """check_preformatted_batch for one row."""
    return check_preformatted_batch([(input_ids, prompt_len)], tokenizer, profile_name)[0]


def make_preformatted_exporter(profile_name: str, tokenizer: Any | Callable[[], Any]) -> Callable[..., dict[str, Any]]:
    """The `specforge_preformatted.jsonl` exporter for one profile (the tokenizer may be given lazily)."""

    def export_specforge_preformatted(snapshot_dir: PathLike, exports_dir: PathLike) -> dict[str, Any]:
        snapshot_dir = as_data_path(snapshot_dir)
        tok = tokenizer() if callable(tokenizer) and not hasattr(tokenizer, "encode") else tokenizer
        columns = ["sample_id", "input_ids", "prompt_len", "total_len", "text_exact", "control_text_in_content"]
        left_out: dict[str, int] = {}
        tally = _Tally()

        def rows() -> Iterator[dict[str, Any]]:
            for chunk in snapshot_row_batches(snapshot_dir, columns, batch_rows=BATCH_ROWS):
                todo = []
                for r in chunk:
                    tally.see(r)
                    if r["text_exact"] is False:  # known non-canonical: no need to re-encode it to know
                        left_out["not_text_exact"] = left_out.get("not_text_exact", 0) + 1
                    else:
                        todo.append(r)
                checked = check_preformatted_batch([(r["input_ids"], r["prompt_len"]) for r in todo], tok, profile_name)
                for r, (text, reason) in zip(todo, checked):
                    if reason is not None:
                        left_out[reason] = left_out.get(reason, 0) + 1
                        continue
                    yield {"id": r["sample_id"], "text": text}

        n = _write_jsonl(snapshot_dir / PREFORMATTED_FILE, rows())
        template = SPECFORGE_TEMPLATES.get(profile_name, (None,))[0]
        max_len = tally.max_total_len
        return {
            PREFORMATTED_FILE: {
                "rows": n,
                "format": "specforge preformatted text (text): SpecForge offline",
                "snapshot_rows": tally.rows,
                "snapshot_rows_control_text_as_served": tally.control_text_as_served,
                "rows_left_out": sum(left_out.values()),
                "left_out_by_reason": left_out,
                "specforge_exact_rows": n if template else None,
                "specforge_exact_check": CHECKED_BY
                if template
                else f"not measured: no SpecForge template for {profile_name}",
                "specforge_settings": {
                    "data.chat_template": template,
                    "data.is_preformatted": True,
                    "data.train_only_last_turn": True,
                    "data.max_length": max_len,
                },
            }
        }

    return export_specforge_preformatted


def export_conversations(snapshot_dir: PathLike, exports_dir: PathLike) -> dict[str, Any]:
    snapshot_dir = as_data_path(snapshot_dir)
    columns = ["sample_id", "conversation", "tools", "text_exact", "text_mismatch_pos", "control_text_in_content"]
    tally = _Tally()

    def rows() -> Iterator[dict[str, Any]]:
        for r in snapshot_rows(snapshot_dir, columns):
            tally.see(r)
            yield {
                "id": r["sample_id"],
                "conversations": openai_tool_calls(json.loads(r["conversation"])),
                "tools": json.loads(r["tools"]) if r["tools"] else [],
                "text_exact": r["text_exact"],
                "text_mismatch_pos": r["text_mismatch_pos"],
                # true: control-token text in the prompt's data was sent as special ids (control_text: as_served)
                "control_text_in_content": r["control_text_in_content"],
            }

    n = _write_jsonl(snapshot_dir / CONVERSATIONS_FILE, rows())
    return {
        CONVERSATIONS_FILE: {
            "rows": n,
            "format": "conversations (re-rendered by the trainer's chat template); tool-call arguments as JSON strings",
            "rows_not_text_exact": tally.not_text_exact,  # flagged per row: text_exact false + text_mismatch_pos
            "rows_control_text_as_served": tally.control_text_as_served,  # flagged per row: control_text_in_content
            "specforge_exact_rows": None,
            "specforge_exact_check": "not measured in the pipeline: SpecForge re-renders conversations with the chat "
            "template (Kimi-K2.5 drops the reasoning of the final turn, a default system prompt is "
            "injected, tool-call arguments are re-serialized); use specforge_preformatted.jsonl",
        }
    }


EXPORTERS = (export_specforge_prompts, export_conversations)


def exporters_for(profile_name: str, tokenizer: Any | Callable[[], Any]) -> tuple[Callable[..., dict[str, Any]], ...]:
    """Every export of a snapshot for one model profile (the preformatted one needs its tokenizer)."""
    return (export_specforge_prompts, make_preformatted_exporter(profile_name, tokenizer), export_conversations)
