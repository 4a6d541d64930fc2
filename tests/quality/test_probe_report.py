"""The probe results table, the acceptance log's pure functions and the report's drafter section, on real
Parquet files in a data dir (generate/probe_results.py, quality/acceptance_drift.py, report/probes.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import polars as pl

from eagle3_dagster.generate.probe_results import (
    GENERATION_COLUMNS,
    RESULT_COLUMNS,
    drafter_versions,
    read_all_results,
    update_shard_results,
)
from eagle3_dagster.quality.acceptance_drift import (
    append_entry,
    drafter_change_line,
    drift_frame,
    night_entry,
    previous_night,
    read_log,
)
from eagle3_dagster.report.probes import collect_probes, probes_section

T0 = datetime(2026, 11, 1, 2, 0, tzinfo=UTC)


def _rows(drafter: str, path: str, lengths: list[float], source: str = "probe_math") -> pl.DataFrame:
    n = len(lengths)
    return pl.DataFrame(
        {
            "sample_id": [f"{drafter}-{i}" for i in range(n)],
            "prompt_id": [f"p{i}" for i in range(n)],
            "source": [source] * n,
            "drafter_id": [drafter] * n,
            "spec_draft_model_path": [path] * n,
            "spec_draft_model_revision": [None] * n,
            "spec_accept_length": lengths,
            "spec_accept_rate": [x / 4 for x in lengths],
            "completion_tokens": [100] * n,
            "generated_at": [T0] * n,
        },
        schema={c: RESULT_COLUMNS[c] for c in GENERATION_COLUMNS},
    )


def test_each_drafter_keeps_its_probe_results_and_first_seen(tmp_path) -> None:
    data = tmp_path / "data"
    update_shard_results(data, 0, _rows("eagle3-a", "m/a", [2.0, 3.0]), "eagle3-a", T0)
    update_shard_results(data, 0, _rows("eagle3-a", "m/a", [2.0, 3.0]), "eagle3-a", T0 + timedelta(days=1))
    update_shard_results(data, 0, _rows("eagle3-b", "m/b", [3.0, 3.5]), "eagle3-b", T0 + timedelta(days=2))
    update_shard_results(
        data, 1, _rows("eagle3-b", "m/b", [4.0], source="probe_code"), "eagle3-b", T0 + timedelta(days=2)
    )
    res = read_all_results(data)
    assert res.height == 5  # the second night of drafter a replaced nothing but its own rows
    v = drafter_versions(res).to_dicts()
    assert [x["drafter_id"] for x in v] == ["eagle3-a", "eagle3-b"]
    a, b = v
    assert (a["first_seen"], a["last_seen"]) == (T0, T0 + timedelta(days=1))
    assert (a["n_probe_prompts"], a["mean_accept_length"], a["mean_accept_rate"]) == (2, 2.5, 0.625)
    assert (b["n_probe_prompts"], b["mean_accept_length"]) == (2, 3.5)  # p0, p1 over two shards / sources

    view = collect_probes(data)
    assert view is not None
    page = "\n".join(probes_section(view))
    assert "<h2>Drafter versions on the probe sets</h2>" in page and "<svg" in page
    assert "<td><code>eagle3-b</code></td><td>m/b@default</td>" in page
    assert '<td class="num">3.500</td><td class="num">0.875</td><td>+40.0% accept length</td>' in page
    assert "<td><code>probe_code</code></td>" in page  # per source


def test_acceptance_log_compares_the_same_drafter_and_names_a_change(tmp_path) -> None:
    data = tmp_path / "data"
    rows = pl.DataFrame({"spec_accept_length": [2.0, 3.0, None], "spec_accept_rate": [0.4, 0.6, None]})
    e1 = night_entry(rows, run_at=T0, run_key="r1", drafter_key="eagle3-a")
    assert (e1["new_rows"], e1["mean_accept_length"], e1["mean_accept_rate"]) == (2, 2.5, 0.5)
    log = append_entry(data, 3, read_log(data, 3), e1)
    assert drafter_change_line(log, "eagle3-a", 3) is None
    line = drafter_change_line(log, "eagle3-b", 3)
    assert line is not None and "eagle3-a (last seen 2026-11-01 02:00 UTC) -> eagle3-b" in line
    assert previous_night(log, "eagle3-a", 2) == e1 and previous_night(log, "eagle3-a", 3) is None
    assert previous_night(log, "eagle3-b", 1) is None

    e2 = {**e1, "run_at": T0 + timedelta(days=1), "mean_accept_length": 2.0, "mean_accept_rate": 0.4}
    frame = drift_frame(e2, e1)
    assert frame.row(0, named=True)["accept_length_ratio"] == 0.8
    assert abs(frame.row(0, named=True)["accept_rate_change"] + 0.1) < 1e-12

    e3 = {**e1, "run_at": T0 + timedelta(days=2), "run_key": "r3", "drafter_key": "eagle3-b"}
    append_entry(data, 3, read_log(data, 3), e3)
    view = collect_probes(data)
    assert view is not None and [n["drafter_key"] for n in view["nights"]] == ["eagle3-a", "eagle3-b"]
    page = "\n".join(probes_section(view))
    assert "<h3>Tonight's new prompts, night by night</h3>" in page
    assert "<td>drafter changed from eagle3-a</td>" in page
