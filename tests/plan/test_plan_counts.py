"""The plan's plain functions on real parts: the demo sources, the shared Kimi tokenizer, real Parquet
(a generations store after a partial run, a published snapshot)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eagle3_dagster import schemas
from eagle3_dagster.config import PROJECT_ROOT
from eagle3_dagster.generate.config import sample_key
from eagle3_dagster.ingest import load_source_specs
from eagle3_dagster.plan.actual import plan_headlines
from eagle3_dagster.plan.counts import PlanKeys, count_cached, count_prompts, stored_revision, tokenize_for_plan
from eagle3_dagster.plan.estimate import (
    DEFAULT_BYTES_PER_TOKEN,
    bytes_per_token,
    fleet_estimate,
    output_expectation,
)
from eagle3_dagster.storage import data_root
from eagle3_dagster.tokenize import PromptRenderer

DEMO_SOURCES = PROJECT_ROOT / "assets" / "sources"
REV, S_HASH = "moonshotai/Kimi-K2.5@default", "s" * 16


@pytest.fixture(scope="module")
def demo_rows(tmp_path_factory, kimi_profile):
    """The demo sources ingested and tokenized as the plan does it (4 shards)."""
    scratch = tmp_path_factory.mktemp("scratch")
    counts, prompts_path = count_prompts(load_source_specs(DEMO_SOURCES), n_shards=4, scratch=scratch)
    rows = tokenize_for_plan(prompts_path, PromptRenderer(kimi_profile), max_new_tokens=2048, control_text={})
    return counts, prompts_path, rows


def _write_generations(shard_dir: Path, rows: list[dict], name: str = "part-00000000000000000001-a.parquet") -> None:
    shard_dir.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    full = [
        {f.name: None for f in schemas.GENERATIONS}
        | {"output_ids": [1, 2, 3], "completion_tokens": 3, "generated_at": now, "e2e_latency": 0.5}
        | r
        for r in rows
    ]
    pq.write_table(pa.Table.from_pylist(full, schema=schemas.GENERATIONS), shard_dir / name)


def test_prompts_and_prompt_tokens_are_the_stages_own(demo_rows, kimi_profile):
    counts, prompts_path, rows = demo_rows
    prompts = pl.read_parquet(prompts_path)
    # the demo file has 35 records, one of them a duplicate: counts reconcile
    assert counts.read == counts.prompts + counts.rejected + counts.duplicates + counts.sampled_out
    assert counts.prompts == prompts.height > 0 and counts.duplicates >= 1
    assert rows.frame.height + sum(rows.rejects_by_reason.values()) == prompts.height
    # exact tokens: the renderer's own ids for each prompt, summed (a Kimi prompt ends with <think>)
    renderer = PromptRenderer(kimi_profile)
    first = prompts.row(0, named=True)
    import json

    from eagle3_dagster.tokenize import RenderRequest

    ids = renderer.render_batch([RenderRequest(json.loads(first["messages"]), None)])[0].input_ids
    assert ids[-1] == 163606
    assert rows.frame.filter(pl.col("prompt_id") == first["prompt_id"])["prompt_len"].item() == len(ids)
    assert rows.prompt_tokens == int(rows.frame["prompt_len"].sum()) > prompts.height * 5
    assert len(rows.probe_ids) == min(16, rows.frame.height) and rows.probe_ids[0][-1] == 163606


def test_cached_count_after_a_partial_run(demo_rows, tmp_path):
    _, _, rows = demo_rows
    data = data_root(tmp_path / "data")
    shard0 = rows.frame.filter(pl.col("shard") == 0)
    assert shard0.height >= 3
    keys = [sample_key(p, REV, t, S_HASH, None) for p, t in zip(shard0["prompt_id"], shard0["template_hash"])]
    # a partial run stored two of shard 0's samples, and one failed for good (a 400) the run will not resend
    gen0 = tmp_path / "data" / "generations" / "shard=0000"
    stored = [{"sample_id": k, "prompt_id": p, "model_revision": REV} for k, p in zip(keys[:2], shard0["prompt_id"])]
    _write_generations(gen0, stored)
    errors = [{"sample_id": keys[2], "prompt_id": shard0["prompt_id"][2], "shard": 0, "reason": "http_400"}]
    pq.write_table(pa.Table.from_pylist(errors, schema=schemas.GENERATION_ERRORS), gen0 / "errors.parquet")

    c = count_cached(rows.frame, data, PlanKeys(REV, S_HASH, None))
    n = rows.frame.height
    assert (c.requested, c.cached, c.failed_before, c.to_send) == (n, 2, 1, n - 3)
    assert c.send.height == n - 3 and not set(c.send["prompt_id"]) & set(shard0["prompt_id"][:3])
    # another revision, sampling or seed: another cache key, nothing is cached
    assert count_cached(rows.frame, data, PlanKeys("other@1", S_HASH, None)).cached == 0
    assert count_cached(rows.frame, data, PlanKeys(REV, S_HASH, 1)).to_send == n
    # a resend of permanent failures counts them as to send
    again = count_cached(rows.frame, data, PlanKeys(REV, S_HASH, None), retry_permanent_errors=True)
    assert (again.failed_before, again.to_send) == (0, n - 2)
    # without any revision known nothing can match
    assert count_cached(rows.frame, data, PlanKeys(None, S_HASH, None)).to_send == n
    assert stored_revision(data, range(4)) == REV
    assert stored_revision(data_root(tmp_path / "empty"), range(4)) is None


def _snapshot(root: Path, version: str, rows: list[tuple[str, int, int]]) -> None:
    folder = root / "snapshots" / version / "training_samples"
    folder.mkdir(parents=True)
    t = pa.table(
        {
            "source": [r[0] for r in rows],
            "prompt_len": pa.array([r[1] for r in rows], pa.int32()),
            "output_len": pa.array([r[2] for r in rows], pa.int32()),
            "total_len": pa.array([r[1] + r[2] for r in rows], pa.int32()),
        }
    )
    pq.write_table(t, folder / "shard=0000.parquet")
    (root / "snapshots" / "LATEST").write_text(version + "\n")


def test_expected_output_tokens_come_from_the_latest_snapshot(tmp_path):
    data = data_root(tmp_path)
    none = output_expectation(data, 8192)
    assert (none.basis, none.overall_mean) == ("max_new_tokens", 8192.0)
    _snapshot(tmp_path, "v1", [("a", 10, 100), ("a", 10, 300), ("b", 10, 1000)])
    e = output_expectation(data, 8192)
    assert e.basis == "snapshot v1" and e.snapshot_rows == 3
    assert e.per_request_mean == {"a": 200.0, "b": 1000.0}
    assert e.overall_mean == pytest.approx(1400 / 3)
    # per source, and a source the snapshot lacks gets the overall mean
    assert e.expected(pl.Series(["a", "a", "b", "new"])) == pytest.approx(200 + 200 + 1000 + 1400 / 3)


def test_disk_bytes_per_token_are_measured_once_tables_exist(tmp_path):
    data = data_root(tmp_path)
    bpt, basis = bytes_per_token(data)
    assert bpt == DEFAULT_BYTES_PER_TOKEN and all(b.startswith("rule:") for b in basis.values())
    _snapshot(tmp_path, "v1", [("a", 100, 400)] * 50)
    bpt, basis = bytes_per_token(data)
    snap_bytes = sum(f.stat().st_size for f in (tmp_path / "snapshots" / "v1").rglob("*") if f.is_file())
    assert bpt["snapshot"] == pytest.approx(snap_bytes / (50 * 500)) and basis["snapshot"] == "measured on snapshot v1"
    assert basis["generations"].startswith("rule:")


def test_eta_and_gpu_hours():
    f = fleet_estimate(3_600_000, 500.0, 4, 8, "declared")
    assert f.eta_s == pytest.approx(1800.0)  # 3.6M tokens at 4 x 500 tokens/s
    assert f.gpu_hours == pytest.approx(4 * 8 * 0.5)
    with pytest.raises(ValueError):
        fleet_estimate(1, 0.0, 1, 1, "declared")


def test_prompts_asset_metadata_names_a_stale_plan():
    plan = {"prompts": 34, "prompt_tokens": 1655, "created_at": "2026-01-01T00:00:00+00:00", "fleet": {"eta_s": 9.0}}
    meta, warning = plan_headlines(plan, 34)
    assert meta["plan_prompts"] == 34 and meta["plan_eta_s"] == 9.0 and warning is None
    _, warning = plan_headlines(plan, 40)
    assert warning is not None and "34" in warning and "40" in warning and "eagle3 plan" in warning
    assert plan_headlines(None, 3) == ({}, None)


def test_plan_vs_actual_counts_only_what_was_generated_since_the_plan(tmp_path):
    from eagle3_dagster.plan.actual import plan_vs_actual

    plan_at = dt.datetime(2026, 1, 2, tzinfo=dt.UTC)
    gen0 = tmp_path / "generations" / "shard=0000"
    old = [{"sample_id": f"{i:032x}", "generated_at": plan_at - dt.timedelta(hours=1)} for i in range(5)]
    new = [
        {
            "sample_id": f"{100 + i:032x}",
            "generated_at": plan_at + dt.timedelta(seconds=10 + i),
            "completion_tokens": 40,
            "e2e_latency": 2.0,
        }
        for i in range(3)
    ]
    _write_generations(gen0, old, "part-00000000000000000001-a.parquet")
    _write_generations(gen0, new, "part-00000000000000000002-b.parquet")
    plan = {"created_at": plan_at.isoformat(), "prompts": 8, "requests_to_send": 3, "expected_output_tokens": 90.0}
    view = plan_vs_actual(data_root(tmp_path), plan)
    assert view is not None
    got = {r["metric"]: (r["planned"], r["actual"]) for r in view["rows"]}
    # the 5 samples of an earlier night are not this run's cost
    assert got["requests generated"] == (3, 3)
    assert got["output tokens"] == (90.0, 120)
    # from the first request's start (10 s - its 2 s latency) to the last answer (12 s)
    assert got["generate time (s)"][1] == pytest.approx(4.0)
    assert plan_vs_actual(data_root(tmp_path), None) is None
