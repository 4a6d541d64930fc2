"""The code location is built from the one settings object it is given: two definitions built from two
settings in one process each have their own shard partitions, sensors and resources (no import-time global),
and a step run from them sees exactly those settings, whatever the environment says when it runs."""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import time
import types
import uuid

import dagster as dg
import pytest

from eagle3_dagster import definitions
from eagle3_dagster.config import settings
from eagle3_dagster.definitions import build_definitions
from eagle3_dagster.defs.automation import NIGHTLY_SENSOR, NIGHTLY_TAG
from eagle3_dagster.orchestration.asset_names import SHARD_ASSETS
from eagle3_dagster.orchestration.run import QUIET, graph_shard_keys


def _night_fanout(defs: dg.Definitions) -> list[str]:
    """The shard keys the `nightly` sensor of `defs` requests after a successful nightly ingest run."""
    repo = defs.get_repository_def()
    sensor = repo.get_sensor_def(NIGHTLY_SENSOR)
    with dg.instance_for_test() as instance:
        run = dg.DagsterRun(
            job_name="ingest", run_id=str(uuid.uuid4()), status=dg.DagsterRunStatus.SUCCESS, tags={NIGHTLY_TAG: "true"}
        )
        instance.add_run(run)
        data = sensor.evaluate_tick(dg.build_sensor_context(instance=instance, repository_def=repo))
    return sorted(str(r.partition_key) for r in data.run_requests)


def test_each_definitions_has_the_shard_partitions_of_its_own_settings():
    s = settings()
    two = build_definitions(dataclasses.replace(s, shards=dataclasses.replace(s.shards, n_shards=2)))
    three = build_definitions(dataclasses.replace(s, shards=dataclasses.replace(s.shards, n_shards=3)))
    for defs, keys in ((two, ["0000", "0001"]), (three, ["0000", "0001", "0002"])):
        for name in SHARD_ASSETS:
            assert list(defs.resolve_assets_def(name).partitions_def.get_partition_keys()) == keys, name
        assert list(defs.resolve_job_def("shard_pipeline").partitions_def.get_partition_keys()) == keys
        assert graph_shard_keys(defs) == keys
        assert _night_fanout(defs) == keys  # the sensor fans out over the same shards
    # building them neither changed nor was bound to this process's settings
    assert settings().shards.n_shards == s.shards.n_shards


def test_the_ingest_assets_and_resources_come_from_the_settings_given(tmp_path):
    s = settings()
    assets = tmp_path / "assets"
    (assets / "sources").mkdir(parents=True)
    (assets / "sources" / "only.yaml").write_text("path: data/only.jsonl\nformat: openai\n")
    defs = build_definitions(dataclasses.replace(s, storage=dataclasses.replace(s.storage, assets_dir=assets)))
    sources = sorted(k.to_user_string() for a in defs.assets or [] for k in a.keys if "source__" in k.to_user_string())
    assert sources == ["source__only"]
    assert defs.resources is not None and defs.resources["pipeline"].assets_dir == str(assets)
    assert settings().storage.assets_dir == s.storage.assets_dir


def test_a_step_sees_the_settings_its_definitions_were_built_from(tmp_path, monkeypatch):
    """Definitions built from settings A; the environment changes; a step run in process then uses A (the
    values bound into its resources and handed to its body), never the environment of the moment it runs."""
    a_data = tmp_path / "a" / "data"
    latest = a_data / "snapshots" / "LATEST"  # a snapshot published an hour ago
    latest.parent.mkdir(parents=True)
    latest.write_text("v1\n")
    an_hour_ago = time.time() - 3600
    os.utime(latest, (an_hour_ago, an_hour_ago))
    monkeypatch.setenv("EAGLE3_DATA_DIR", str(a_data))
    monkeypatch.setenv("EAGLE3_WORK_DIR", str(tmp_path / "a" / "work"))
    monkeypatch.setenv("EAGLE3_SNAPSHOT_MAX_AGE", "2h")
    defs = build_definitions(settings())  # A
    monkeypatch.setenv("EAGLE3_DATA_DIR", str(tmp_path / "b" / "data"))
    monkeypatch.setenv("EAGLE3_WORK_DIR", str(tmp_path / "b" / "work"))
    monkeypatch.setenv("EAGLE3_SNAPSHOT_MAX_AGE", "30m")
    assert settings().shards.snapshot_max_age == dt.timedelta(minutes=30)  # B is what the process reads now
    result = defs.resolve_job_def("report").execute_in_process(
        instance=dg.DagsterInstance.ephemeral(), run_config=QUIET
    )
    assert result.success
    page = (tmp_path / "a" / "work" / "reports" / "index.html").read_text()
    assert "within the allowed 2h" in page and "OLDER than" not in page  # A's limit, not B's 30 minutes
    assert not (tmp_path / "b").exists()


def test_a_defs_module_without_build_defs_fails_the_load_naming_it():
    stray = types.ModuleType("eagle3_dagster.defs.stray")
    stray.defs = lambda: dg.Definitions()  # type: ignore[attr-defined]  # the old @dg.definitions style
    with pytest.raises(TypeError, match=r"eagle3_dagster\.defs\.stray .* no `build_defs"):
        definitions._builder(stray)


def test_a_graph_run_over_every_shard_of_definitions_without_shards_is_refused(tmp_path):
    """Definitions without shard assets have no shard keys: "every shard" would silently generate nothing."""
    from eagle3_dagster.defs.ingest import build_ingest_assets
    from eagle3_dagster.orchestration.run import materialize_graph

    only_ingest = dg.Definitions(assets=build_ingest_assets(settings()))
    with pytest.raises(ValueError, match="no shard assets"):
        materialize_graph(only_ingest, dg.DagsterInstance.ephemeral())
