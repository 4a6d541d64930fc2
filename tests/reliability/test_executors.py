"""Scale-out by configuration: the step executor is chosen by EAGLE3_EXECUTOR, not by editing code.

What this machine can run is run for real: the multiprocess executor (each step its own process)
on the PostgreSQL-backed instance of docs/dagster.yaml.postgres, via `dg launch`. The k8s executor
cannot run here (no cluster), so it is checked as far as Dagster itself checks it before talking
to Kubernetes: the code location loads with it, the shard job carries it, and the run config that
docs/scale-out.md tells users to paste validates against that job's schema.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
import yaml
from dagster import DagsterEventType
from rel_helpers import PYTHON, ROOT, child_env, postgres_cluster

from eagle3_dagster.orchestration.executors import ExecutorConfigError, executor_from_env
from eagle3_dagster.sim.process import start_simulator

DOC = ROOT / "docs" / "scale-out.md"
WORKER = str(Path(__file__).with_name("shard_worker.py"))


def test_executor_is_chosen_by_environment():
    assert executor_from_env({}).name == "multi_or_in_process_executor"
    assert executor_from_env({"EAGLE3_EXECUTOR": "multiprocess"}).name == "multi_or_in_process_executor"
    assert executor_from_env({"EAGLE3_EXECUTOR": "in_process"}).name == "in_process"
    assert executor_from_env({"EAGLE3_EXECUTOR": "in-process"}).name == "in_process"
    assert executor_from_env({"EAGLE3_EXECUTOR": "k8s"}).name == "k8s"
    with pytest.raises(
        ExecutorConfigError, match="EAGLE3_EXECUTOR must be one of multiprocess, in_process, k8s, got 'celery'"
    ):
        executor_from_env({"EAGLE3_EXECUTOR": "celery"})


def _documented_step_pod_run_config() -> dict:
    """The `execution:` YAML block of docs/scale-out.md, as a user would paste it into the launchpad."""
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), flags=re.S)
    found = [yaml.safe_load(b) for b in blocks if b.lstrip().startswith("execution:")]
    assert len(found) == 1, "docs/scale-out.md should show exactly one executor run config"
    return found[0]


@pytest.mark.integration
@pytest.mark.full  # the multiprocess executor, another deployment: `make test-full`
def test_step_processes_fork_from_a_server_that_never_loaded_polars():
    """The default multiprocess executor starts steps from a forkserver that preloaded the slow imports;
    a process that loaded Polars must never fork (Polars' thread pool does not survive it)."""
    from eagle3_dagster.orchestration.executors import STEP_PRELOAD_MODULES, _forkserver_by_default

    config = _forkserver_by_default({"multiprocess": {}})
    assert config == {"multiprocess": {"start_method": {"forkserver": {"preload_modules": list(STEP_PRELOAD_MODULES)}}}}
    # a user's own choice stands
    assert _forkserver_by_default({"in_process": {}}) == {"in_process": {}}
    spawn = {"multiprocess": {"max_concurrent": 2, "start_method": {"spawn": {}}}}
    assert _forkserver_by_default(spawn) == spawn
    loaded = subprocess.run(
        [
            PYTHON,
            "-c",
            f"import sys, json; [__import__(m) for m in {list(STEP_PRELOAD_MODULES)!r}]; print(json.dumps(list(sys.modules)))",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    tops = {name.split(".")[0] for name in json.loads(loaded)}
    assert {"great_expectations", "dagster", "transformers"} <= tops
    assert "polars" not in tops and "eagle3_dagster" not in tops


@pytest.mark.integration
@pytest.mark.full  # the k8s executor, another deployment: `make test-full`
def test_k8s_executor_from_config_alone_loads_and_accepts_the_documented_run_config():
    # A fresh process, as a code server would start: only the environment differs.
    probe = r"""
import json, dagster as dg
from dagster import RunConfig
from eagle3_dagster.definitions import defs
job = defs.resolve_job_def("shard_pipeline")
run_config = json.loads(input())
res = dg.validate_run_config(job, run_config)
print(json.dumps({"executor": job.executor_def.name, "valid": bool(res)}))
"""
    run_config = _documented_step_pod_run_config()
    assert run_config["execution"]["config"]["job_namespace"]
    env = child_env(EAGLE3_EXECUTOR="k8s")
    r = subprocess.run(
        [PYTHON, "-c", probe],
        input=json.dumps(run_config),
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out == {"executor": "k8s", "valid": True}

    # and a typo in that config is refused before any pod would be created
    bad = json.loads(json.dumps(run_config))
    bad["execution"]["config"]["job_namespce"] = bad["execution"]["config"].pop("job_namespace")
    r = subprocess.run(
        [PYTHON, "-c", probe], input=json.dumps(bad), env=env, cwd=ROOT, capture_output=True, text=True, timeout=180
    )
    assert r.returncode != 0 and "job_namespce" in r.stderr


@pytest.mark.integration
def test_unknown_executor_fails_the_code_location_with_a_clear_error():
    r = subprocess.run(
        [PYTHON, "-c", "import eagle3_dagster.definitions"],
        env=child_env(EAGLE3_EXECUTOR="celery"),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert (
        r.returncode != 0 and "EAGLE3_EXECUTOR must be one of multiprocess, in_process, k8s, got 'celery'" in r.stderr
    )


@pytest.mark.integration
@pytest.mark.full  # the multiprocess executor on Postgres, another deployment: `make test-full`
def test_multiprocess_executor_on_postgres_instance_runs_each_step_in_its_own_process(tmp_path):
    """`dg launch` of a shard run with the default executor, against the documented Postgres instance."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text((ROOT / "docs" / "dagster.yaml.postgres").read_text())
    data = tmp_path / "data"
    dg_bin = str(Path(sys.executable).parent / "dg")
    with postgres_cluster() as pg, start_simulator(log_dir=tmp_path) as sim:
        env = child_env(
            DAGSTER_HOME=str(home), DAGSTER_PG_URL=pg.url, EAGLE3_DATA_DIR=str(data), EAGLE3_SGLANG_URL=sim.url
        )
        env.pop("EAGLE3_EXECUTOR", None)  # the default is what is under test
        ingest = subprocess.run(
            [PYTHON, WORKER, "--ingest"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=240
        )
        assert ingest.returncode == 0, ingest.stdout + ingest.stderr[-3000:]
        r = subprocess.run(
            [dg_bin, "launch", "--job", "shard_pipeline", "--partition", "0002"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=400,
        )
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]

        os.environ["DAGSTER_PG_URL"] = pg.url
        try:
            with dg.DagsterInstance.from_config(str(home)) as instance:
                assert type(instance.run_storage).__name__ == "PostgresRunStorage"
                runs = [x for x in instance.get_runs() if x.job_name == "shard_pipeline"]
                assert len(runs) == 1 and runs[0].status == dg.DagsterRunStatus.SUCCESS
                run = runs[0]
                assert run.tags.get("dagster/partition") == "0002"
                logs = instance.all_logs(run.run_id)
                materialized = instance.fetch_materializations(dg.AssetKey("training_samples"), limit=5).records
        finally:
            os.environ.pop("DAGSTER_PG_URL", None)

    events = [rec.dagster_event for rec in logs if rec.dagster_event]
    starting = {e.step_key for e in events if e.event_type == DagsterEventType.STEP_WORKER_STARTING}
    started = {e.step_key for e in events if e.event_type == DagsterEventType.STEP_WORKER_STARTED}
    succeeded = {e.step_key for e in events if e.event_type == DagsterEventType.STEP_SUCCESS}
    steps = {"tokenized_prompts", "generations", "training_samples"}
    # the multiprocess executor announces a worker process for each step; in-process emits none
    assert steps <= starting and steps <= started, sorted(starting | started)
    # each step in its own process, forked from the run's forkserver (executors.STEP_PRELOAD_MODULES)
    pids = {rec.step_key: rec.dagster_event.pid for rec in logs if rec.dagster_event and rec.step_key in steps}
    assert len(set(pids.values())) == len(steps) and os.getpid() not in pids.values(), pids
    assert steps <= succeeded
    assert [m.partition_key for m in materialized] == ["0002"]
    assert (data / "training_samples" / "shard=0002" / "part-0000.parquet").exists()
