"""Nightly regeneration: the schedule's, the fan-out sensor's and the source sensor's evaluations."""

from __future__ import annotations

import datetime as dt
import shutil

import dagster as dg
import pytest

from eagle3_dagster.config import PROJECT_ROOT
from eagle3_dagster.definitions import defs
from eagle3_dagster.defs.publish import (
    FANOUT_ASSETS,
    NIGHTLY_TAG,
    build_nightly_schedule,
    nightly_fanout,
    prompt_source_sensor,
)
from eagle3_dagster.defs.resources import PipelineSettings


def test_schedule_launches_a_tagged_ingest_run_at_the_configured_time():
    sched = build_nightly_schedule("30 3 * * *", "Europe/Paris")
    assert (sched.cron_schedule, sched.execution_timezone) == ("30 3 * * *", "Europe/Paris")
    ctx = dg.build_schedule_context(scheduled_execution_time=dt.datetime(2026, 12, 2, 3, 30, tzinfo=dt.UTC))
    reqs = sched.evaluate_tick(ctx).run_requests
    assert len(reqs) == 1 and reqs[0].tags[NIGHTLY_TAG] == "true"
    assert sched.job_name == "ingest"
    default = defs.get_schedule_def("nightly_regeneration")
    assert (default.cron_schedule, default.execution_timezone) == ("0 2 * * *", "UTC")


@pytest.mark.integration
def test_fanout_backfills_every_shard_then_the_snapshot(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLE3_DATA_DIR", str(tmp_path / "data"))
    repo = defs.get_repository_def()
    with dg.instance_for_test() as instance:
        job = repo.get_job("ingest")
        result = job.execute_in_process(instance=instance, tags={NIGHTLY_TAG: "true"},
                                        resources={"pipeline": PipelineSettings(data_dir=str(tmp_path / "data"))})
        assert result.success
        run = instance.get_run_by_id(result.run_id)
        event = next(e for e in result.all_events if e.event_type_value == "PIPELINE_SUCCESS")
        ctx = dg.build_run_status_sensor_context(
            sensor_name="nightly_fanout", dagster_instance=instance, dagster_run=run, dagster_event=event,
            repository_def=repo,
        )
        req = nightly_fanout(ctx)
    subset = req.asset_graph_subset
    parts = repo.assets_defs_by_key[dg.AssetKey("generations")].partitions_def.get_partition_keys()
    for name in ("tokenized_prompts", "generations", "training_samples"):
        assert set(subset.get_partitions_subset(dg.AssetKey(name)).get_partition_keys()) == set(parts)
    assert dg.AssetKey("training_dataset") in subset.non_partitioned_asset_keys
    assert {k.to_user_string() for k in subset.asset_keys} == set(FANOUT_ASSETS)


def test_source_sensor_fires_on_new_or_changed_sources_only(tmp_path, monkeypatch):
    assets = tmp_path / "assets"
    shutil.copytree(PROJECT_ROOT / "assets", assets)
    monkeypatch.setenv("EAGLE3_ASSETS_DIR", str(assets))
    ctx = dg.build_sensor_context(cursor=None)
    first = prompt_source_sensor(ctx)
    assert isinstance(first, dg.RunRequest) and first.tags[NIGHTLY_TAG] == "true"
    ctx = dg.build_sensor_context(cursor=ctx.cursor)
    assert isinstance(prompt_source_sensor(ctx), dg.SkipReason)
    # a changed data file is noticed
    data = assets / "sources" / "data" / "demo_prompts.jsonl"
    data.write_text(data.read_text() + '{"messages": [{"role": "user", "content": "new prompt"}]}\n')
    ctx2 = dg.build_sensor_context(cursor=ctx.cursor)
    again = prompt_source_sensor(ctx2)
    assert isinstance(again, dg.RunRequest) and again.run_key != first.run_key
    # a new source file is noticed
    (assets / "sources" / "more.yaml").write_text("path: data/demo_prompts.jsonl\nformat: openai\n")
    assert isinstance(prompt_source_sensor(dg.build_sensor_context(cursor=ctx2.cursor)), dg.RunRequest)
