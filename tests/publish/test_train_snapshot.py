"""Snapshots: only gated shards, identical inputs -> identical snapshot, retention, exports readable."""

from __future__ import annotations

import datetime as dt
import json
from types import SimpleNamespace

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from eagle3_dagster.publish.export import CONVERSATIONS_FILE, EXPORTERS, SPECFORGE_FILE
from eagle3_dagster.publish.snapshot import PublishPolicy, SnapshotContent, build_snapshot, sha256_file
from eagle3_dagster.quality.gate import GateResult
from eagle3_dagster.quality.request_failures import failure_budget_outcome, with_outcome
from eagle3_dagster.schemas import GENERATION_ERRORS, TRAINING_SAMPLES
from eagle3_dagster.storage import write_frame_atomic


def _write_shard(data, shard: int, n: int, **over) -> None:
    now = over.pop("generated_at", dt.datetime(2026, 12, 1, tzinfo=dt.UTC))
    rows = []
    for i in range(n):
        sid = f"s{shard}-{i}"
        rows.append(
            {
                "sample_id": sid,
                "prompt_id": f"p{shard}-{i}",
                "source": "demo",
                "input_ids": [1, 2, 3, 10 + i],
                "loss_mask": [0, 0, 0, 1],
                "prompt_len": 3,
                "output_len": 1,
                "total_len": 4,
                "model_revision": "m",
                "template_hash": "t",
                "tokenizer_fingerprint": "f",
                "sampling_hash": "h",
                "endpoint": "e",
                "finish_reason": "stop",
                "generated_at": now,
                "conversation": json.dumps(
                    [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "reasoning_content": "r"}]
                ),
                "tools": None,
            }
        )
        rows[-1].update(over)
    df = pl.DataFrame(rows, schema=pl.from_arrow(TRAINING_SAMPLES.empty_table()).schema)
    write_frame_atomic(
        df, data / "training_samples" / f"shard={shard:04d}" / "part-0000.parquet", schema=TRAINING_SAMPLES
    )


def _gates(failed: dict[tuple[str, int], bool] | None = None, missing: set | None = None):
    failed, missing = failed or {}, missing or set()

    def status(gate: str, shard: int):
        if (gate, shard) in missing:
            return None
        return SimpleNamespace(success=not failed.get((gate, shard), False))

    return status


def test_manifest_names_the_request_failure_rate_that_excluded_a_shard(tmp_path):
    """A shard over its failure budget: its stored generations gate failed on the request failure rate; the
    manifest says so, with the rate and the top reason (a shard within the budget stays in)."""
    for k in (0, 1):
        _write_shard(tmp_path, k, 3)

    def gate_result(rate_failed: int) -> GateResult:
        outcome = failure_budget_outcome(
            requested=100,
            failed=rate_failed,
            errors_by_kind={"http_400": rate_failed},
            failure_details={"http_400": "The input (9000 tokens) is longer than the model's context length"},
            max_failed_rate=0.01,
        )
        return with_outcome(GateResult(gate="generations", success=True, outcomes=[]), outcome)

    # shard 1's errors.parquet (as generate_shard writes it): 5 refusals and 1 retries_exhausted
    rows = [
        {
            "sample_id": f"x{i}",
            "prompt_id": f"p1-{i}",
            "shard": 1,
            "reason": "http_400",
            "status": 400,
            "detail": f"The input ({9000 + i} tokens) is longer than the model's context length",
        }
        for i in range(5)
    ] + [
        {
            "sample_id": "y",
            "prompt_id": "p1-y",
            "shard": 1,
            "reason": "retries_exhausted",
            "status": None,
            "detail": "reset after 7 attempts: connection reset",
        }
    ]
    (tmp_path / "generations" / "shard=0001").mkdir(parents=True)
    pq.write_table(
        pa.Table.from_pylist(rows, schema=GENERATION_ERRORS), tmp_path / "generations" / "shard=0001" / "errors.parquet"
    )
    results = {0: gate_result(1), 1: gate_result(5)}  # 1% (a warning) and 5% (over the budget)
    assert (results[0].success, results[1].success) == (True, False)

    def status(gate: str, shard: int):
        return results[shard] if gate == "generations" else SimpleNamespace(success=True, failed_critical=[])

    snap = build_snapshot(tmp_path, range(2), status, SnapshotContent(config={"c": 1}, exporters=EXPORTERS))
    m = json.loads((snap.path / "manifest.json").read_text())
    by_shard = {s["shard"]: s for s in m["shards"]}
    assert by_shard["0000"]["included"]
    assert not by_shard["0001"]["included"]
    assert by_shard["0001"]["reason"] == (
        "generations gate failed: request failure rate 5.00% (budget 1.00%), top reason http_400=5"
    )
    assert m["request_failures"] == {
        "0001": {
            "http_400": {
                "count": 5,
                "last_detail": "The input (9004 tokens) is longer than the model's context length",
                "prompt_ids": ["p1-0", "p1-1", "p1-2"],
            },
            "retries_exhausted": {
                "count": 1,
                "last_detail": "reset after 7 attempts: connection reset",
                "prompt_ids": ["p1-y"],
            },
        }
    }


def test_snapshot_includes_only_gated_shards_with_reasons(tmp_path):
    for k, n in [(0, 3), (1, 2), (2, 4)]:
        _write_shard(tmp_path, k, n)
    status = _gates(failed={("generations", 1): True}, missing={("prompts", 3)})
    snap = build_snapshot(tmp_path, range(4), status, SnapshotContent(config={"c": 1}, exporters=EXPORTERS))
    reasons = {d.shard: (d.included, d.reason) for d in snap.shards}
    assert reasons["0000"] == (True, "all gates passed") and reasons["0002"][0]
    assert reasons["0001"] == (False, "generations gate failed")
    assert reasons["0003"] == (False, "no prompts gate result")
    m = json.loads((snap.path / "manifest.json").read_text())
    assert m["rows"] == snap.rows == 7
    for rel, info in m["files"].items():
        assert sha256_file(snap.path / rel) == info["sha256"]
    assert set(m["exports"]) == {SPECFORGE_FILE, CONVERSATIONS_FILE}
    assert (tmp_path / "snapshots" / "LATEST").read_text().strip() == snap.version


def test_unchanged_inputs_give_the_identical_snapshot(tmp_path):
    _write_shard(tmp_path, 0, 3)
    a = build_snapshot(tmp_path, [0], _gates(), SnapshotContent(config={"c": 1}, exporters=EXPORTERS))
    a_bytes = {p.relative_to(a.path): p.read_bytes() for p in a.path.rglob("*") if p.is_file()}
    b = build_snapshot(tmp_path, [0], _gates(), SnapshotContent(config={"c": 1}, exporters=EXPORTERS))
    assert (b.version, b.created) == (a.version, False)
    assert {p.relative_to(b.path): p.read_bytes() for p in b.path.rglob("*") if p.is_file()} == a_bytes
    m = json.loads((a.path / "manifest.json").read_text())
    assert m["identity"]["sha256"].startswith(a.version) and "input_ids" in m["identity"]["of"]


def test_version_is_what_a_trainer_consumes(tmp_path):
    """Same tokens from another machine, port or day: same version. Other ids, mask or model: another one."""
    _write_shard(tmp_path, 0, 3)
    a = build_snapshot(tmp_path, [0], _gates(), SnapshotContent(config={"c": 1}, exporters=EXPORTERS))
    _write_shard(
        tmp_path, 0, 3, endpoint="http://other-host:31000", generated_at=dt.datetime(2026, 12, 9, tzinfo=dt.UTC)
    )
    b = build_snapshot(tmp_path, [0], _gates(), SnapshotContent(config={"c": 2}, exporters=EXPORTERS))
    assert b.version == a.version and not b.created
    versions = {a.version}
    for change in (
        {"model_revision": "m@v2"},
        {"template_hash": "t2"},
        {"sampling_hash": "h2"},
        {"input_ids": [1, 2, 3, 99]},
        {"loss_mask": [0, 0, 1, 1]},
    ):
        _write_shard(tmp_path, 0, 3, **change)
        v = build_snapshot(tmp_path, [0], _gates(), SnapshotContent(config={"c": 1})).version
        assert v not in versions, change
        versions.add(v)


def test_retention_keeps_the_newest(tmp_path):
    versions = []
    for i in range(4):
        _write_shard(tmp_path, 0, i + 1)
        t = dt.datetime(2026, 12, 1 + i, tzinfo=dt.UTC)
        versions.append(
            build_snapshot(
                tmp_path, [0], _gates(), SnapshotContent(config={}, now=t), policy=PublishPolicy(keep=2)
            ).version
        )
    left = sorted(p.name for p in (tmp_path / "snapshots").iterdir() if p.is_dir())
    assert left == sorted(versions[-2:])


def test_exports_load_with_a_reader_written_against_the_published_fields(tmp_path):
    _write_shard(tmp_path, 0, 2)
    snap = build_snapshot(tmp_path, [0], _gates(), SnapshotContent(config={}, exporters=EXPORTERS))
    sf = [json.loads(line) for line in (snap.path / SPECFORGE_FILE).read_text().splitlines()]
    assert len(sf) == 2
    for r in sf:
        assert set(r) == {"id", "input_ids", "loss_mask"} and len(r["input_ids"]) == len(r["loss_mask"])
    conv = [json.loads(line) for line in (snap.path / CONVERSATIONS_FILE).read_text().splitlines()]
    for r in conv:
        assert set(r) == {"id", "conversations", "tools", "text_exact", "text_mismatch_pos", "control_text_in_content"}
        turns = r["conversations"]
        assert all({"role", "content"} <= set(t) for t in turns) and turns[-1]["role"] == "assistant"
        assert "reasoning_content" in turns[-1]
