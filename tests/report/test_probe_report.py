"""The probe results table, the acceptance log's pure functions and the report's drafter section, on real
Parquet files in a data dir (generate/probe_results.py, quality/acceptance_drift.py, report/probes.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import polars as pl

from eagle3_dagster.config import PROJECT_ROOT
from eagle3_dagster.generate.group_acceptance import GroupAcceptance, trusted_figures
from eagle3_dagster.generate.probe_results import (
    GENERATION_COLUMNS,
    RESULT_COLUMNS,
    drafter_versions,
    read_all_results,
    update_shard_results,
)
from eagle3_dagster.quality.acceptance import acceptance_metadata, acceptance_rows, acceptance_summary
from eagle3_dagster.quality.acceptance_drift import (
    append_entry,
    drafter_change,
    drift_frame,
    judge_night,
    night_entry,
    previous_night,
    read_log,
)
from eagle3_dagster.report.probes import collect_probes, probes_section

T0 = datetime(2026, 11, 1, 2, 0, tzinfo=UTC)


def _rows(drafter: str, path: str, lengths: list[float], source: str = "probe_math") -> pl.DataFrame:
    """Probe rows of 100 tokens each with these accept lengths (100 / verify steps), rate = correct / proposed."""
    n = len(lengths)
    steps = [round(100 / x) for x in lengths]
    return pl.DataFrame(
        {
            "sample_id": [f"{drafter}-{i}" for i in range(n)],
            "prompt_id": [f"p{i}" for i in range(n)],
            "source": [source] * n,
            "drafter_id": [drafter] * n,
            "spec_draft_model_path": [path] * n,
            "spec_draft_model_revision": [None] * n,
            "spec_accept_length": [100 / v for v in steps],
            "spec_accept_rate": [(100 - 1 - v) / (3 * v) for v in steps],
            "completion_tokens": [100] * n,
            "spec_verify_ct": steps,
            "spec_num_correct_drafts": [100 - 1 - v for v in steps],
            "spec_num_proposed_drafts": [3 * v for v in steps],
            "spec_left_out": [None] * n,
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
    # Σ tokens / Σ verify steps: 200 / (50 + 33), not the mean of 2.0 and 3.0
    assert (a["n_probe_prompts"], a["accept_length"], a["rows"]) == (2, 200 / 83, 2)
    assert a["accept_rate"] == (49 + 66) / (3 * 83)
    assert (b["n_probe_prompts"], b["accept_length"]) == (2, 300 / (33 + 29 + 25))  # p0, p1 over two shards

    view = collect_probes(data)
    assert view is not None
    page = "\n".join(probes_section(view))
    assert "<h2>Drafter versions on the probe sets</h2>" in page and "<svg" in page
    assert "<td><code>eagle3-b</code></td><td>m/b@default</td>" in page
    b_rate = (66 + 70 + 74) / (3 * 87)
    delta = (300 / 87) / (200 / 83) - 1
    assert f'<td class="num">{300 / 87:.3f}</td><td class="num">{b_rate:.3f}</td><td class="num">0</td>' in page
    assert f"<td>{delta:+.1%} accept length</td>" in page
    assert "<td><code>probe_code</code></td>" in page  # per source


def _night_rows(lengths: list[float], flagged: int = 0) -> pl.DataFrame:
    """Tonight's training rows as new_training_rows hands them over (after trusted_figures): 100 tokens each;
    `flagged` more rows whose figures failed their checks (null, named)."""
    steps = [round(100 / x) for x in lengths]
    n = len(steps)
    good = pl.DataFrame(
        {
            "completion_tokens": [100] * n,
            "spec_accept_length": [100 / v for v in steps],
            "spec_accept_rate": [(99 - v) / (3 * v) for v in steps],
            "spec_verify_ct": steps,
            "spec_num_correct_drafts": [99 - v for v in steps],
            "spec_num_proposed_drafts": [3 * v for v in steps],
            "integrity_violations": [[]] * n,
        }
    )
    lying = pl.DataFrame(
        {
            "completion_tokens": [100] * flagged,
            "spec_accept_length": [9.0] * flagged,
            "spec_accept_rate": [2.0] * flagged,
            "spec_verify_ct": [10] * flagged,
            "spec_num_correct_drafts": [60] * flagged,
            "spec_num_proposed_drafts": [30] * flagged,
            "integrity_violations": [["spec_metrics_inconsistent:accept_length"]] * flagged,
        }
    )
    return trusted_figures(pl.concat([good, lying], how="diagonal_relaxed"))


def test_acceptance_log_keeps_sums_compares_the_same_drafter_and_names_a_change(tmp_path) -> None:
    data = tmp_path / "data"
    e1 = night_entry(_night_rows([2.0, 4.0]), run_at=T0, run_key="r1", drafter_key="eagle3-a")
    # Σ tokens / Σ verify steps over the night's rows: 200 / 75, not the mean of 2.0 and 4.0
    assert (e1["new_rows"], e1["left_out_rows"], e1["accept_length"]) == (2, 0, 200 / 75)
    assert e1["accept_rate"] == (49 + 74) / (3 * 75)
    log = append_entry(data, 3, read_log(data, 3), e1)
    assert drafter_change(log, "eagle3-a", 3) is None
    change = drafter_change(log, "eagle3-b", 3)
    assert change is not None and change.warn
    assert "eagle3-a (last seen 2026-11-01 02:00 UTC) -> eagle3-b" in change.line
    assert previous_night(log, "eagle3-a", 2) == e1 and previous_night(log, "eagle3-a", 3) is None
    assert previous_night(log, "eagle3-b", 1) is None

    e2 = {**e1, "run_at": T0 + timedelta(days=1), "accept_length": 0.8 * e1["accept_length"]}
    e2["accept_rate"] = e1["accept_rate"] - 0.1
    frame = drift_frame(e2, e1)
    assert abs(frame.row(0, named=True)["accept_length_ratio"] - 0.8) < 1e-12
    assert abs(frame.row(0, named=True)["accept_rate_change"] + 0.1) < 1e-12

    e3 = {**e1, "run_at": T0 + timedelta(days=2), "run_key": "r3", "drafter_key": "eagle3-b"}
    append_entry(data, 3, read_log(data, 3), e3)
    append_entry(data, 4, read_log(data, 4), {**e1, "accept_length": 99.0})  # another shard, the same run r1
    view = collect_probes(data)
    assert view is not None and [n["drafter_key"] for n in view["nights"]] == ["eagle3-a", "eagle3-b"]
    assert view["nights"][0]["accept_length"] == 400 / 150  # the shards' sums added, never their ratios
    page = "\n".join(probes_section(view))
    assert "<h3>Tonight's new prompts, night by night</h3>" in page
    assert "<td>drafter changed from eagle3-a</td>" in page


def _judge(data, entry):
    return judge_night(
        data,
        0,
        entry,
        expectations_dir=PROJECT_ROOT / "expectations",
        context_dir=data / "gx",
    )


def test_a_night_with_flagged_figures_feeds_no_figure_and_is_never_a_baseline(tmp_path) -> None:
    """Night 1 honest; night 2 the server lies on some rows (flagged: left out, and the night is no baseline);
    night 3 honest again is judged against night 1 and finds no drift (it used to read 'traffic has moved away'
    against the lying night's inflated figures)."""
    data = tmp_path / "data"
    honest = [2.0, 2.5, 3.0, 2.0, 2.5, 3.0, 2.0, 2.5, 3.0]
    n1 = _judge(data, night_entry(_night_rows(honest), run_at=T0, run_key="r1", drafter_key="eagle3-a"))
    assert n1.status == "none" and not n1.judged
    lying = night_entry(
        _night_rows(honest, flagged=4), run_at=T0 + timedelta(days=1), run_key="r2", drafter_key="eagle3-a"
    )
    assert (lying["new_rows"], lying["left_out_rows"]) == (9, 4)
    assert (
        lying["accept_length"]
        == night_entry(_night_rows(honest), run_at=T0, run_key="x", drafter_key="x")["accept_length"]
    )
    n2 = _judge(data, lying)
    assert n2.status == "ok" and "4 left out: figures flagged" in n2.line
    n3 = _judge(
        data, night_entry(_night_rows(honest), run_at=T0 + timedelta(days=2), run_key="r3", drafter_key="eagle3-a")
    )
    assert n3.status == "ok" and "traffic has moved away" not in n3.line
    log = read_log(data, 0)
    assert log["left_out_rows"].to_list() == [0, 4, 0]
    assert previous_night(log, "eagle3-a", 8)["run_key"] == "r3"  # type: ignore[index]
    assert previous_night(log.filter(pl.col("run_key") != "r3"), "eagle3-a", 8)["run_key"] == "r1"  # type: ignore[index]


def test_no_blank_drafter_is_recorded_and_a_first_drafter_is_information(tmp_path) -> None:
    data = tmp_path / "data"
    rows = _night_rows([2.0] * 9)
    none = pl.DataFrame(schema=rows.schema)
    _judge(data, night_entry(none, run_at=T0, run_key="r1", drafter_key="none"))  # no speculation yet
    first = _judge(data, night_entry(rows, run_at=T0 + timedelta(days=1), run_key="r2", drafter_key="eagle3-a"))
    assert first.change_line is not None and "none (last seen" in first.change_line and not first.change_warns
    # a night that asked no endpoint (nothing to send) knows no drafter: nothing recorded, no change named
    blind = _judge(data, night_entry(none, run_at=T0 + timedelta(days=2), run_key="r3", drafter_key=""))
    assert blind.change_line is None and not blind.judged and "no endpoint was asked" in blind.line
    assert read_log(data, 0)["drafter_key"].to_list() == ["none", "eagle3-a"]
    after = _judge(data, night_entry(rows, run_at=T0 + timedelta(days=3), run_key="r4", drafter_key="eagle3-a"))
    assert after.change_line is None and after.status == "ok"  # compared with night r2, no reset
    # a log an older version left with a blank drafter: never named as a change
    append_entry(data, 1, read_log(data, 1), {**night_entry(rows, run_at=T0, run_key="r1", drafter_key="eagle3-a")})
    append_entry(
        data, 1, read_log(data, 1), {**night_entry(none, run_at=T0 + timedelta(days=1), run_key="r2", drafter_key="")}
    )
    assert drafter_change(read_log(data, 1), "eagle3-a", 1) is None


def test_one_definition_the_same_probe_rows_read_the_same_everywhere(tmp_path) -> None:
    """Five probe rows of different lengths: the probe table, the acceptance section's by-drafter row, the
    UI metadata and a night's entry all show Σ tokens / Σ verify steps (a mean of the rows' ratios differs)."""
    tokens, steps = [40, 400, 90, 1200, 15], [20, 140, 30, 450, 7]
    rows = pl.DataFrame(
        {
            "sample_id": [f"s{i}" for i in range(5)],
            "prompt_id": [f"p{i}" for i in range(5)],
            "source": ["probe_math"] * 5,
            "drafter_id": ["eagle3-a"] * 5,
            "spec_draft_model_path": ["m/a"] * 5,
            "spec_draft_model_revision": [None] * 5,
            "completion_tokens": tokens,
            "spec_verify_ct": steps,
            "spec_num_correct_drafts": [t - 1 - v for t, v in zip(tokens, steps)],
            "spec_num_proposed_drafts": [3 * v for v in steps],
            "spec_accept_length": [t / v for t, v in zip(tokens, steps)],
            "spec_accept_rate": [(t - 1 - v) / (3 * v) for t, v in zip(tokens, steps)],
            "spec_correct_drafts_histogram": [None] * 5,
            "integrity_violations": [[]] * 5,
            "generated_at": [T0] * 5,
        }
    )
    path = tmp_path / "gens.parquet"
    rows.write_parquet(path)
    stored = trusted_figures(pl.read_parquet(path))
    want = sum(tokens) / sum(steps)
    assert abs(want - float(stored["spec_accept_length"].mean())) > 1e-3  # type: ignore[arg-type]
    update_shard_results(tmp_path / "data", 0, stored.select(GENERATION_COLUMNS), "eagle3-a", T0)
    (version,) = drafter_versions(read_all_results(tmp_path / "data")).to_dicts()
    feats = pl.DataFrame({"row_id": rows["sample_id"], "output_len": tokens, "has_tool_call": [False] * 5})
    summary = acceptance_summary(acceptance_rows([pl.read_parquet(path)], feats, None))
    assert summary is not None
    by_drafter = GroupAcceptance.from_sums(summary["by_drafter"]["eagle3-a"])
    entry = night_entry(stored, run_at=T0, run_key="r", drafter_key="eagle3-a")
    md = acceptance_metadata(summary)
    assert (
        version["accept_length"]
        == by_drafter.accept_length
        == entry["accept_length"]
        == md["spec_accept_length"]
        == want
    )
    assert version["accept_rate"] == by_drafter.accept_rate == entry["accept_rate"] == md["spec_accept_rate"]

    # a sixth probe row whose figures failed their checks (rate 2.0): no table moves, each counts it
    lying = rows.head(1).with_columns(
        pl.lit("s5").alias("sample_id"),
        pl.lit("p5").alias("prompt_id"),
        pl.lit(2.0).alias("spec_accept_rate"),
        pl.lit(100).cast(pl.Int64).alias("spec_num_correct_drafts"),
        pl.lit(["spec_metrics_inconsistent:correct_gt_proposed"]).alias("integrity_violations"),
    )
    update_shard_results(tmp_path / "data", 0, pl.concat([rows, lying], how="diagonal_relaxed"), "eagle3-a", T0)
    stored_lie = read_all_results(tmp_path / "data").filter(pl.col("sample_id") == "s5").row(0, named=True)
    assert stored_lie["spec_accept_rate"] is None and stored_lie["spec_left_out"] == "correct_gt_proposed"
    (again,) = drafter_versions(read_all_results(tmp_path / "data")).to_dicts()
    assert (again["accept_length"], again["accept_rate"]) == (version["accept_length"], version["accept_rate"])
    assert (again["rows"], again["left_out"], again["n_probe_prompts"]) == (5, 1, 6)
    page = "\n".join(probes_section(collect_probes(tmp_path / "data")))
    assert "1 row(s) left out of these figures" in page and "2.000" not in page


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
