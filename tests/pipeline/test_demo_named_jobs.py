"""The demo's runs are the project's named jobs of the UI's code location: listed under Jobs and Runs (not as
`__ephemeral_asset_job__`, which no page of the UI shows a history for) and, carrying the code location's
origin, on the Overview timeline, the UI's first screen (which skips a run without one)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.workspace.load import location_origins_from_yaml_paths
from proc_helpers import EAGLE3, command_env

from eagle3_dagster.config import PROJECT_ROOT
from eagle3_dagster.orchestration.run import REPOSITORY_LABEL_TAG

pytestmark = pytest.mark.integration


def test_demo_runs_are_the_named_jobs_of_the_code_location(tmp_path: Path):
    env = command_env(tmp_path)
    r = subprocess.run(
        [EAGLE3, "demo", "--shards", "0000", "--allow-partial"],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    [location] = location_origins_from_yaml_paths([str(PROJECT_ROOT / "workspace.yaml")])
    label = f"__repository__@{location.location_name}"  # how the UI's job pages filter their runs
    with dg.DagsterInstance.from_config(str(tmp_path / "home")) as instance:
        runs = list(reversed(instance.get_runs()))  # newest first -> in the order they ran
        assert [run.job_name for run in runs] == ["ingest", "shard_pipeline", "publish", "report"]
        assert all(run.tags.get(REPOSITORY_LABEL_TAG) == label for run in runs)
        # the origin the UI matches a run to its workspace by: the code location's name and its repository
        origins = {
            (r.remote_job_origin.location_name, r.remote_job_origin.repository_origin.repository_name)
            for r in runs
            if r.remote_job_origin is not None
        }
        assert len(origins) == 1 and origins == {(location.location_name, "__repository__")}, origins
        assert all(r.remote_job_origin is not None and r.remote_job_origin.job_name == r.job_name for r in runs)
        assert runs[1].tags.get("dagster/partition") == "0000"
        shown = instance.get_runs(filters=dg.RunsFilter(job_name="shard_pipeline", tags={REPOSITORY_LABEL_TAG: label}))
        assert [run.run_id for run in shown] == [runs[1].run_id]
