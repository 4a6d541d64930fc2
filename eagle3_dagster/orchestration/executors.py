"""Which Dagster executor runs the steps of a run, chosen by configuration (EAGLE3_EXECUTOR).

Run config can *configure* an executor but cannot *choose* one; the choice is part of the code
location. Taking it from the settings (config.py, which reads the environment) keeps scale-out a
deployment decision: the same code runs steps in one process on a laptop and one Kubernetes pod per
step in a cluster.

    EAGLE3_EXECUTOR=multiprocess   (default) each step in its own process on this machine, forked
                                   from a per-run forkserver that preloads STEP_PRELOAD_MODULES;
                                   `execution: {config: {in_process: {}}}` in run config still
                                   selects in-process, as with Dagster's stock default
    EAGLE3_EXECUTOR=in_process     every step in the run's process
    EAGLE3_EXECUTOR=k8s            dagster_k8s.k8s_job_executor: one Kubernetes Job per step
                                   (needs `pip install "eagle3-dagster[k8s]"`)
"""

from __future__ import annotations

from collections.abc import Mapping

import dagster as dg

from ..config import EXECUTOR_CHOICES as CHOICES
from ..config import EXECUTOR_ENV, Settings, SettingsError


class ExecutorConfigError(SettingsError):
    def __init__(self, message: str) -> None:
        super().__init__([message])


def executor_from_env(env: Mapping[str, str]) -> dg.ExecutorDefinition:
    """The executor named by EAGLE3_EXECUTOR in the mapping `env` (unset: the declared default, config.py)."""
    try:
        name = Settings.from_env({EXECUTOR_ENV: env.get(EXECUTOR_ENV, "")}).dagster.executor
    except SettingsError as e:
        raise ExecutorConfigError(str(e)) from None
    return executor_for(name)


# The slow imports of every step process. The multiprocess executor forks its step processes from one
# forkserver per run that has imported these once, instead of spawning fresh interpreters that each import
# Dagster, Great Expectations and transformers again (about ten seconds of CPU per step). Polars, and so the
# project's own modules, stay out: Polars must not be loaded in a process that forks (its thread pool does
# not survive a fork), so each step imports it fresh (tests/reliability/test_executors.py). The tokenizer
# module is the one a tokenizer.json folder loads through (tokenize/loading.py), which needs no torch.
STEP_PRELOAD_MODULES = ("dagster", "great_expectations", "transformers.tokenization_utils_tokenizers")


def _forkserver_by_default(config: dict) -> dict:
    """Run config of the multiprocess executor with the forkserver start method unless it names its own."""
    if "multiprocess" not in config or "start_method" in (config["multiprocess"] or {}):
        return config
    forkserver = {"forkserver": {"preload_modules": list(STEP_PRELOAD_MODULES)}}
    return {"multiprocess": {**(config["multiprocess"] or {}), "start_method": forkserver}}


multiprocess_executor = dg.multi_or_in_process_executor.configured(
    _forkserver_by_default,
    name="multi_or_in_process_executor",
    config_schema=dg.multi_or_in_process_executor.config_schema.as_field(),
)


def executor_for(name: str) -> dg.ExecutorDefinition:
    """The executor for a validated EAGLE3_EXECUTOR value (Settings.executor)."""
    if name == "multiprocess":
        return multiprocess_executor
    if name == "in_process":
        return dg.in_process_executor
    if name == "k8s":
        try:
            from dagster_k8s import k8s_job_executor
        except ImportError as e:  # a clear message instead of a failed code location with a bare traceback
            raise ExecutorConfigError(
                f"{EXECUTOR_ENV}=k8s needs dagster-k8s: pip install 'eagle3-dagster[k8s]' "
                "(dagster-k8s==0.29.27, matching dagster 1.13.27)"
            ) from e
        return k8s_job_executor
    raise ExecutorConfigError(f"{EXECUTOR_ENV} must be one of {', '.join(CHOICES)}, got {name!r}")
