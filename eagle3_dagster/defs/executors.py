"""Which Dagster executor runs the steps of a run, chosen by configuration (EAGLE3_EXECUTOR).

Run config can *configure* an executor but cannot *choose* one; the choice is part of the code
location. Reading it from the environment here keeps scale-out a deployment decision: the same
code runs steps in one process on a laptop and one Kubernetes pod per step in a cluster.

    EAGLE3_EXECUTOR=multiprocess   (default) each step in its own process on this machine;
                                   `execution: {config: {in_process: {}}}` in run config still
                                   selects in-process, as with Dagster's stock default
    EAGLE3_EXECUTOR=in_process     every step in the run's process
    EAGLE3_EXECUTOR=k8s            dagster_k8s.k8s_job_executor: one Kubernetes Job per step
                                   (needs `pip install "eagle3-dagster[k8s]"`)
"""

from __future__ import annotations

import os

import dagster as dg

EXECUTOR_ENV = "EAGLE3_EXECUTOR"
CHOICES = ("multiprocess", "in_process", "k8s")


class ExecutorConfigError(ValueError):
    pass


def executor_from_env(environ: dict[str, str] | None = None) -> dg.ExecutorDefinition:
    env = os.environ if environ is None else environ
    name = (env.get(EXECUTOR_ENV) or "multiprocess").strip().lower().replace("-", "_")
    if name in ("multiprocess", "default"):
        return dg.multi_or_in_process_executor
    if name == "in_process":
        return dg.in_process_executor
    if name in ("k8s", "k8s_job"):
        try:
            from dagster_k8s import k8s_job_executor
        except ImportError as e:  # a clear message instead of a failed code location with a bare traceback
            raise ExecutorConfigError(
                f"{EXECUTOR_ENV}=k8s needs dagster-k8s: pip install 'eagle3-dagster[k8s]' "
                "(dagster-k8s==0.29.27, matching dagster 1.13.27)"
            ) from e
        return k8s_job_executor
    raise ExecutorConfigError(f"{EXECUTOR_ENV}={name!r} is not one of {', '.join(CHOICES)}")
