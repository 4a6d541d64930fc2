"""A quality report that cannot be written (the disk fills while it is written) is named: the run's
warning reaches the demo summary, the summary's `report:` line says it was not written by this run and
the result is not SUCCESS (real Dagster runs, the simulator as the server, the write failing in-process)."""

from __future__ import annotations

import errno

import dagster as dg
import pytest
from graph_helpers import graph_resources, shard_with_most_prompts

from eagle3_dagster.app.demo import summarize
from eagle3_dagster.config import settings
from eagle3_dagster.definitions import defs
from eagle3_dagster.orchestration.run import GraphScope, materialize_graph
from eagle3_dagster.report import html as report_html
from eagle3_dagster.sim.process import start_simulator
from eagle3_dagster.storage import data_root

pytestmark = pytest.mark.integration


def _disk_full(*_a, **_k):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_report_that_could_not_be_written_is_named_and_not_a_success(tmp_path, kimi_profile, monkeypatch):
    data = tmp_path / "data"
    with dg.instance_for_test() as instance, start_simulator() as sim:
        res = graph_resources(data, kimi_profile.tokenizer, sim.url)
        assert materialize_graph(defs, instance, scope=GraphScope(shards=[]), resources=res).ingest_success
        shard = shard_with_most_prompts(data)
        night1 = materialize_graph(
            defs,
            instance,
            scope=GraphScope(shards=[shard], run_ingest=False, run_publish=True, allow_partial=True),
            resources=res,
        )
        assert night1.success and night1.report_error is None, night1
        monkeypatch.setattr(report_html, "_write", _disk_full)  # every write of the page fails: ENOSPC
        night2 = materialize_graph(
            defs,
            instance,
            scope=GraphScope(shards=[shard], run_ingest=False, run_publish=True, allow_partial=True),
            resources=res,
        )
    assert night2.data_success and not night2.success
    assert night2.report_error and "No space left on device" in night2.report_error
    summary = summarize(night2, data_root(data), settings())
    assert "result:     FAILED: the quality report was not written" in summary
    assert "report:     NOT written by this run (quality report not written: OSError" in summary
    assert "warning:    report: quality report not written: OSError" in summary
    warnings = next(line for line in summary.splitlines() if line.startswith("warnings:"))
    assert warnings != "warnings:   none" and "warning(s) logged by the runs" in warnings
    assert "eagle3 report` rebuilds it" in summary  # what to do next
