"""The code location is built from the one settings object it is given: two definitions built from two
settings in one process each have their own shard partitions, sensors and resources (no import-time global)."""

from __future__ import annotations

import dataclasses
import types
import uuid

import dagster as dg
import pytest

from eagle3_dagster import definitions
from eagle3_dagster.config import settings
from eagle3_dagster.definitions import build_definitions
from eagle3_dagster.defs.automation import NIGHTLY_SENSOR, NIGHTLY_TAG
from eagle3_dagster.orchestration.asset_names import SHARD_ASSETS
from eagle3_dagster.orchestration.run import graph_shard_keys


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
    two = build_definitions(dataclasses.replace(s, n_shards=2))
    three = build_definitions(dataclasses.replace(s, n_shards=3))
    for defs, keys in ((two, ["0000", "0001"]), (three, ["0000", "0001", "0002"])):
        for name in SHARD_ASSETS:
            assert list(defs.resolve_assets_def(name).partitions_def.get_partition_keys()) == keys, name
        assert list(defs.resolve_job_def("shard_pipeline").partitions_def.get_partition_keys()) == keys
        assert graph_shard_keys(defs) == keys
        assert _night_fanout(defs) == keys  # the sensor fans out over the same shards
    # building them neither changed nor was bound to this process's settings
    assert settings().n_shards == s.n_shards


def test_the_ingest_assets_and_resources_come_from_the_settings_given(tmp_path):
    s = settings()
    assets = tmp_path / "assets"
    (assets / "sources").mkdir(parents=True)
    (assets / "sources" / "only.yaml").write_text("path: data/only.jsonl\nformat: openai\n")
    defs = build_definitions(dataclasses.replace(s, assets_dir=assets))
    sources = sorted(k.to_user_string() for a in defs.assets or [] for k in a.keys if "source__" in k.to_user_string())
    assert sources == ["source__only"]
    assert defs.resources is not None and defs.resources["pipeline"].assets_dir == str(assets)
    assert settings().assets_dir == s.assets_dir


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
