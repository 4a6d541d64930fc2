"""Publishing in flat memory: exports, content identity and summary streamed from the shard tables.

- the exports list every row shard by shard, in sample_id order within a shard, byte-identical however
  the shard tables were written (row groups, row order, file order);
- the streamed identity (ContentHasher.update_file) is the whole-table one, the streamed summary too;
- a snapshot 8x larger (real Parquet, real build_snapshot with the real exporters, a fresh process per
  size) adds to the peak RSS of the publish far less than what it holds decoded: a regression to
  whole-snapshot reads (the publish of 2026-12 read every shard into one frame and sorted it) fails it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eagle3_dagster.config import PROJECT_ROOT
from eagle3_dagster.profiles import load_profile
from eagle3_dagster.publish.export import (
    CONVERSATIONS_FILE,
    SPECFORGE_FILE,
    export_conversations,
    export_specforge_prompts,
    snapshot_row_batches,
)
from eagle3_dagster.publish.identity import ContentHasher
from eagle3_dagster.publish.snapshot import ShardDecision, content_and_summary
from eagle3_dagster.schemas import TRAINING_SAMPLES
from eagle3_dagster.storage import as_data_path
from eagle3_dagster.train.summary import sample_stats, summarize

PROFILE = load_profile("kimi-k2.5", PROJECT_ROOT / "assets" / "models")
THINK_END = 163607  # kimi-k2.5 </think>: some outputs have one, so the summary's lengths are not all null


def training_table(n: int, tokens: int, *, seed: int, prefix: str = "s") -> pa.Table:
    """n training rows with ~`tokens` ids each (3 prompt ids), random sample ids, varied flags."""
    rng = np.random.default_rng(seed)
    lens = rng.integers(max(4, tokens // 2), tokens * 3 // 2 + 4, n).astype(np.int32)
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    ids = rng.integers(1000, 150000, int(offsets[-1])).astype(np.int32)
    ids[offsets[:-1] + 3] = np.where(rng.random(n) < 0.7, THINK_END, ids[offsets[:-1] + 3])
    mask = np.ones(int(offsets[-1]), np.int8)
    for k in range(3):
        mask[offsets[:-1] + k] = 0
    text_exact = rng.choice([True, False, None], n, p=[0.8, 0.1, 0.1]).tolist()
    conv = json.dumps(
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "reasoning_content": "r"}]
    )
    cols = {
        "sample_id": [f"{prefix}{int(x):09d}" for x in rng.permutation(n * 10)[:n]],
        "prompt_id": [f"p{i}" for i in range(n)],
        "source": rng.choice(["a", "b"], n).tolist(),
        "input_ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids)),
        "loss_mask": pa.ListArray.from_arrays(pa.array(offsets), pa.array(mask)),
        "prompt_len": np.full(n, 3, np.int32),
        "output_len": lens - 3,
        "total_len": lens,
        "model_revision": rng.choice(["m1", "m2"], n).tolist(),
        "template_hash": ["t"] * n,
        "tokenizer_fingerprint": ["f"] * n,
        "sampling_hash": ["h"] * n,
        "endpoint": ["e"] * n,
        "finish_reason": rng.choice(["stop", "length"], n).tolist(),
        "generated_at": pa.nulls(n, pa.timestamp("us", tz="UTC")),
        "conversation": [conv] * n,
        "tools": [None] * n,
        "text_exact": text_exact,
        "text_mismatch_pos": [None if t is not False else 5 for t in text_exact],
        "control_text_in_content": rng.choice([False, True], n, p=[0.9, 0.1]).tolist(),
        "worker": rng.choice(["http://w1:30000", "http://w2:30000"], n).tolist(),
        "sglang_version": rng.choice(["0.5.12", "0.5.18"], n).tolist(),
    }
    return pa.table({f.name: pa.array(cols[f.name], f.type) for f in TRAINING_SAMPLES}, schema=TRAINING_SAMPLES)


def _sorted(t: pa.Table) -> pa.Table:
    return t.sort_by("sample_id")


def write_snapshot_tables(snap: Path, parts: list[pa.Table], *, row_group_size: int) -> Path:
    (snap / "training_samples").mkdir(parents=True, exist_ok=True)
    for k, t in enumerate(parts):
        pq.write_table(t, snap / "training_samples" / f"shard={k:04d}.parquet", row_group_size=row_group_size)
    return snap


def _exports(snap: Path) -> tuple[dict[str, bytes], dict]:
    info = {**export_specforge_prompts(snap, snap / "exports"), **export_conversations(snap, snap / "exports")}
    return {rel: (snap / rel).read_bytes() for rel in (SPECFORGE_FILE, CONVERSATIONS_FILE)}, info


def test_exports_are_the_same_bytes_in_shard_then_sample_id_order_however_the_tables_were_written(tmp_path):
    rows = training_table(700, 12, seed=1)
    shards = [rows.slice(0, 300), rows.slice(300, 300), rows.slice(600)]
    # sorted shard tables in row groups of 17 rows (many batches per shard, BATCH_ROWS crossed)
    a = write_snapshot_tables(tmp_path / "a", [_sorted(t) for t in shards], row_group_size=17)
    # the same shard tables written last shard first, other row groups, one of them NOT in sample_id order
    order = np.random.default_rng(2).permutation(300)
    b_tables = [_sorted(shards[0]), shards[1].take(pa.array(order)), _sorted(shards[2])]
    (tmp_path / "b" / "training_samples").mkdir(parents=True)
    for k in (2, 1, 0):
        pq.write_table(b_tables[k], tmp_path / "b" / "training_samples" / f"shard={k:04d}.parquet", row_group_size=64)
    (a_bytes, a_info), (b_bytes, b_info) = _exports(a), _exports(tmp_path / "b")
    assert a_bytes == b_bytes and a_info == b_info
    again, _ = _exports(a)
    assert again == a_bytes
    lines = [json.loads(x) for x in a_bytes[SPECFORGE_FILE].decode().splitlines()]
    assert [r["id"] for r in lines] == [sid for t in shards for sid in sorted(t.column("sample_id").to_pylist())]
    want = dict(zip(rows.column("sample_id").to_pylist(), rows.column("input_ids").to_pylist()))
    assert all(r["input_ids"] == want[r["id"]] for r in lines)  # token ids as stored
    conv = [json.loads(x)["id"] for x in a_bytes[CONVERSATIONS_FILE].decode().splitlines()]
    assert conv == [r["id"] for r in lines]
    te = rows.column("text_exact").to_pylist()
    assert a_info[SPECFORGE_FILE]["rows"] == 700 and a_info[SPECFORGE_FILE]["rows_not_text_exact"] == te.count(False)
    assert a_info[SPECFORGE_FILE]["max_total_len"] == max(rows.column("total_len").to_pylist())


def test_row_batches_are_bounded_and_come_shard_by_shard(tmp_path):
    rows = training_table(90, 6, seed=3)
    shards = [rows.slice(i * 30, 30) for i in range(3)]
    snap = write_snapshot_tables(tmp_path / "s", [_sorted(t) for t in shards], row_group_size=8)
    batches = list(snapshot_row_batches(snap, ["sample_id", "total_len"], batch_rows=7))
    assert max(len(b) for b in batches) == 7 and sum(len(b) for b in batches) == 90
    assert [r["sample_id"] for b in batches for r in b] == [
        sid for t in shards for sid in sorted(t.column("sample_id").to_pylist())
    ]


@pytest.mark.parametrize("in_order", [True, False])
def test_streamed_identity_and_summary_are_the_whole_table_ones(tmp_path, in_order):
    t = training_table(300, 10, seed=4)
    t = _sorted(t) if in_order else t
    data = as_data_path(tmp_path)
    f = tmp_path / "training_samples" / "shard=0000" / "part-0000.parquet"
    f.parent.mkdir(parents=True)
    pq.write_table(t, f, row_group_size=23)
    whole = ContentHasher()
    whole.update(t)
    streamed = ContentHasher()
    streamed.update_file(f, batch_rows=7)
    assert streamed.hexdigest() == whole.hexdigest() and streamed.rows == 300
    digest, summary = content_and_summary(data, [ShardDecision("0000", True, "ok", rows=300)], PROFILE)
    assert digest == whole.hexdigest()
    assert summary == summarize(sample_stats(pl.DataFrame(t), PROFILE))
    assert summary is not None and summary["lengths"]["reasoning_len"]["n"] > 0


_PUBLISH_CHILD = r"""
import json, sys
from pathlib import Path
from types import SimpleNamespace
from eagle3_dagster.config import PROJECT_ROOT
from eagle3_dagster.profiles import load_profile
from eagle3_dagster.publish.export import EXPORTERS
from eagle3_dagster.publish.snapshot import SnapshotContent, build_snapshot

def hwm():
    return next(int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmHWM:"))

profile = load_profile("kimi-k2.5", PROJECT_ROOT / "assets" / "models")
def publish(d):
    d = Path(d)
    shards = sorted(int(p.name.split("=")[1]) for p in (d / "training_samples").glob("shard=*"))
    content = SnapshotContent(config={}, exporters=EXPORTERS, profile=profile)
    return build_snapshot(d, shards, lambda g, k: SimpleNamespace(success=True), content)
snap = publish(sys.argv[1])
print(json.dumps({"peak_kb": hwm(), "rows": snap.rows}))
"""


def _publish_peak(data: Path) -> dict:
    r = subprocess.run([sys.executable, "-c", _PUBLISH_CHILD, str(data)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def _data_dir(d: Path, n_shards: int, rows_per_shard: int, tokens: int) -> Path:
    for k in range(n_shards):
        f = d / "training_samples" / f"shard={k:04d}" / "part-0000.parquet"
        f.parent.mkdir(parents=True)
        t = _sorted(training_table(rows_per_shard, tokens, seed=10 + k, prefix=f"k{k}-"))
        pq.write_table(t, f, row_group_size=256)  # in sample_id order, as the pipeline writes them
    return d


@pytest.mark.integration
def test_publish_peak_memory_does_not_grow_with_the_snapshot(tmp_path):
    """Real build_snapshot (hash, summary, copy, both exports) in a fresh process at two sizes 8x apart:
    the large publish's peak RSS exceeds the small one's by less than half the extra ids it holds decoded
    (int32 ids + int8 mask: 5 bytes a token, 67 MB). Reading the snapshot whole (one frame, sorted) needs
    all of them and more (measured: +200 MB); streamed, the two peaks differ by run-to-run noise (< 20 MB)."""
    tokens = 1000
    small = _data_dir(tmp_path / "small", 4, 500, tokens)  # already several batches a shard: the steady state
    large = _data_dir(tmp_path / "large", 4, 4000, tokens)
    s, big = _publish_peak(small), _publish_peak(large)
    assert (s["rows"], big["rows"]) == (2000, 16000)
    extra_decoded_kb = (16000 - 2000) * tokens * 5 / 1024
    assert big["peak_kb"] - s["peak_kb"] < 0.5 * extra_decoded_kb, (s, big, extra_decoded_kb)
