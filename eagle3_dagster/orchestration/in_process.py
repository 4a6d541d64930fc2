"""One run of a job, executed in this process, that the Dagster UI lists as a run of the project's code location.

`JobDefinition.execute_in_process` creates its run without a code-location origin, and the UI's Overview
timeline skips every run without one ("No runs or scheduled ticks in this time period" after a whole demo).
Here the run is created with the origin of the UI's workspace entry (workspace.yaml: the module
`eagle3_dagster.definitions`, attribute `defs`), the location named by name only
(RegisteredCodeLocationOrigin: the workspace knows how to load it), and then executed in this process
exactly as `execute_in_process` executes it (its ephemeral job, the in-process executor, its run tags).

This reaches into Dagster 1.13's execution internals (pinned: tests/pipeline/test_demo_named_jobs.py reads the
demo's runs back from the instance, their origin against workspace.yaml's location; the browser test opens the
UI's first screen on them; a Dagster upgrade that moves them fails there).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import dagster as dg

# The UI's code location and repository, as `dagster dev -w workspace.yaml` names them: a `python_module`
# entry is named "<module>:<attribute>", and Definitions make the repository "__repository__".
UI_LOCATION = "eagle3_dagster.definitions:defs"
UI_REPOSITORY = "__repository__"
# The tag the UI's Jobs page lists a job's runs by (its code location, "<repository>@<location>").
REPOSITORY_LABEL_TAG = ".dagster/repository"
UI_REPOSITORY_LABEL = f"{UI_REPOSITORY}@{UI_LOCATION}"


def ui_job_origin(job_name: str) -> Any:
    """The origin of the UI's job `job_name`: its code location by name, its repository, the job."""
    from dagster._core.remote_origin import RegisteredCodeLocationOrigin, RemoteJobOrigin, RemoteRepositoryOrigin

    repository = RemoteRepositoryOrigin(RegisteredCodeLocationOrigin(UI_LOCATION), UI_REPOSITORY)
    return RemoteJobOrigin(repository, job_name)


def execute_as_ui_run(
    job_def: dg.JobDefinition,
    *,
    instance: dg.DagsterInstance,
    resources: Mapping[str, object],
    run_config: Mapping[str, Any],
    partition_key: str | None,
    tags: Mapping[str, str],
) -> str:
    """Execute `job_def` in this process as `execute_in_process` does (never raising on a step's failure),
    its run carrying the UI's origin for this job; the run's id. What the run did is read from its records
    (orchestration/run_records.py)."""
    from dagster._core.definitions.job_base import InMemoryJob
    from dagster._core.execution.api import create_execution_plan, execute_run
    from dagster._core.execution.execute_in_process import merge_run_tags, type_check_and_normalize_args

    config, op_selection, asset_selection, resource_defs, key, inputs = type_check_and_normalize_args(
        run_config=dict(run_config), partition_key=partition_key, resources=dict(resources)
    )
    job = job_def.as_ephemeral_job(
        resource_defs=resource_defs, input_values=inputs, op_selection=op_selection, asset_selection=asset_selection
    )
    if not config and job.partitioned_config and key:
        config = job.partitioned_config.get_run_config_for_partition_key(key)
    in_memory = InMemoryJob(job_def=job)
    plan = create_execution_plan(
        in_memory, run_config=config, instance_ref=instance.get_ref() if instance.is_persistent else None
    )
    run = instance.create_run_for_job(
        job_def=job,
        execution_plan=plan,
        run_config=config,
        tags=merge_run_tags(
            job_def=job_def,
            partition_key=key,
            tags={**tags, REPOSITORY_LABEL_TAG: UI_REPOSITORY_LABEL},
            asset_selection=asset_selection,
            instance=instance,
            run_config=config,
        ),
        remote_job_origin=ui_job_origin(job_def.name),
    )
    execute_run(in_memory, run, instance, raise_on_error=False)
    return run.run_id
