"""The resources and the executor every asset and job of the code location uses, bound here once.

Values come from the one validated settings object the definitions are built from (definitions.py);
a run's config can override every resource field (see orchestration/resources.py). The executor
is a deployment choice (EAGLE3_EXECUTOR): run config can configure it, not choose it.
"""

from __future__ import annotations

import dagster as dg

from ...config import Settings
from ...orchestration.executors import executor_for
from ...orchestration.resources import resources_from_settings


def build_defs(s: Settings) -> dg.Definitions:
    return dg.Definitions(resources=resources_from_settings(s), executor=executor_for(s.dagster.executor))
