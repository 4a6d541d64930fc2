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


def _spread(drafter: str, path: str, base: float, n: int = 30) -> pl.DataFrame:
    """n probe prompts whose accept lengths vary around `base` (the same prompts for every drafter)."""
    return _rows(drafter, path, [base + 0.4 * ((i * 7) % 10) / 10 for i in range(n)])


def test_each_version_gets_the_interval_against_the_one_before(tmp_path) -> None:
    data = tmp_path / "data"
    update_shard_results(data, 0, _spread("eagle3-a", "m/a", 2.0), "eagle3-a", T0)
    update_shard_results(data, 0, _spread("eagle3-b", "m/b", 2.5), "eagle3-b", T0 + timedelta(days=1))
    update_shard_results(data, 0, _spread("eagle3-c", "m/c", 2.5), "eagle3-c", T0 + timedelta(days=2))
    view = collect_probes(data)
    assert view is not None
    b, c = view["intervals"]["eagle3-b"], view["intervals"]["eagle3-c"]
    assert "eagle3-a" not in view["intervals"]  # the first version has none before it
    assert b["verdict"] == "better" and b["prompts"] == 30 and b["interval"][0] > 0
    assert c["verdict"] == "no_difference" and c["difference"] == 0 and c["interval"][0] <= 0 <= c["interval"][1]
    page = "\n".join(probes_section(view))
    assert "accept length vs previous: difference [95% interval]" in page
    lo, hi = b["interval"]
    assert f"{b['difference']:+.3f} [{lo:+.3f}, {hi:+.3f}] better, 30 shared prompts" in page


def _comparison(tmp_path) -> dict:
    """A comparison document made by the comparison's own functions (paired figures, judge, decide)."""
    from eagle3_dagster.drafters.compare import decide, interval_text, judge
    from eagle3_dagster.drafters.lineage import Lineage, headline
    from eagle3_dagster.drafters.rule import PromotionRule
    from eagle3_dagster.drafters.units import pair

    base = _spread("eagle3-a", "m/a", 2.0)
    cand = _spread("eagle3-z", "m/z", 2.4).with_columns(
        pl.when(pl.col("prompt_id").is_in(["p0", "p1", "p2"]))
        .then(pl.lit("probe_prose"))
        .otherwise(pl.col("source"))
        .alias("source")
    )
    base = base.with_columns(cand["source"])
    rule = PromotionRule()
    overall, sources = judge(pair(base, cand), rule, rates_compared=True)
    decision, reasons = decide(overall, sources, rule)
    return {
        "decision": decision,
        "reasons": reasons,
        "notes": [s.too_few for s in sources if s.too_few],
        "headline": headline(Lineage("20261201T0200Z-n", "--trained-on"), None, interval_text(overall.length)),
        "compared_at": "2026-12-02T10:00:00+00:00",
        "production": {"drafter_id": "eagle3-a", "spec_algorithm": "EAGLE3", "spec_draft_model_path": "m/a"},
        "candidate": {
            "drafter_id": "eagle3-z",
            "spec_algorithm": "EAGLE3",
            "spec_draft_model_path": "m/z",
            "trained_on": {"snapshot": "20261201T0200Z-n"},
        },
        "overall": overall.as_json(rule.confidence),
        "sources": [s.as_json(rule.confidence) for s in sources],
        "rule": rule.as_dict(),
    }


def test_the_candidate_drafters_section_shows_every_comparison(tmp_path) -> None:
    from eagle3_dagster.drafters.store import write_comparison
    from eagle3_dagster.report.candidates import candidates_section, collect_candidates
    from eagle3_dagster.storage import as_data_path

    data = as_data_path(tmp_path / "data")
    assert candidates_section(collect_candidates(data)) == []
    doc = _comparison(tmp_path)
    write_comparison(data, doc)
    refused = {"decision": "hold", "reasons": ["candidate serves other/model@default ..."], "refused": "x",
               "compared_at": "2026-12-03T10:00:00+00:00", "candidate": {"drafter_id": "eagle3-y"}, "sources": []}  # fmt: skip
    write_comparison(data, refused)
    (tmp_path / "data" / "probes" / "comparisons" / "broken.json").write_text("{")
    docs = collect_candidates(data)
    assert [d["candidate"]["drafter_id"] for d in docs] == ["eagle3-y", "eagle3-z"]  # newest first, broken one left out
    page = "\n".join(candidates_section(docs))
    assert '<h2 id="candidate-drafters">Candidate drafters</h2>' in page
    assert "drafter trained on snapshot 20261201T0200Z-n vs production (trained on an unknown snapshot): +0.3" in page
    assert f'<span class="badge {"PASS" if doc["decision"] == "promote" else "FAIL"}">' in page
    assert "<svg" in page and "accept length, candidate - production (95% interval)" in page
    assert "<td><code>probe_prose</code></td>" in page and "<td><code>overall</code></td>" in page
    assert "candidate serves other/model@default" in page  # a refused comparison says why
