"""Every generations expectation, on outputs built with the real Kimi tokenizer: which rows fail, why."""

from __future__ import annotations

import dagster as dg
import polars as pl
import pytest
from quality_helpers import generation_rows, tokenized_rows

from eagle3_dagster.quality import generation_features, run_gate

PROMPTS = {"p0": "What is 2+2?", "p1": "What's the weather in Paris?"}
REASONING = "The user asks for 2+2. Adding two and two gives four, so the answer is 4."


def _cases(kimi) -> dict[str, tuple[dict, set[str]]]:
    """sample_id -> (generation row overrides, expected critical failure keys)."""
    k, p = kimi, kimi.p
    t = p.tool_call_ids
    good = k.output(REASONING, "2 + 2 = 4.")
    tool = ("functions.get_weather:0", '{"city": "Paris", "unit": "celsius"}')
    prompt_tail = k.prompt(PROMPTS["p0"])[-8:]
    sentence = "I will check the value again to be completely sure about it. "
    return {
        "good": (dict(output_ids=good), set()),
        "good_tool": (
            dict(prompt_id="p1", output_ids=k.output("I should call the weather tool.", "", tool=tool)),
            set(),
        ),
        "no_think_end": (dict(output_ids=k.output(REASONING, "4", think_end=False)), {"think_end_present"}),
        # a second think-end mid-answer is named apart: it is present, but not once (it was quarantined as
        # think_end_present, whose failure says a reasoning parser stripped the tag)
        "two_think_ends": (
            dict(output_ids=k.output(REASONING, "4")[:-1] + [p.think_end_id, p.end_of_turn_id]),
            {"think_end_once"},
        ),
        "think_start_in_output": (dict(output_ids=[p.think_start_id] + good), {"no_think_start_in_output"}),
        "truncated": (
            dict(output_ids=k.output(REASONING, "2 + 2", eot=False), finish_reason="length"),
            {"finish_reason_stop", "last_id_end_of_turn"},
        ),
        "count_mismatch": (dict(output_ids=good, completion_tokens=len(good) + 1), {"len_matches_completion_tokens"}),
        "nan_finish": (dict(output_ids=good, finish_matched='"NaN happened"'), {"no_nan_finish"}),
        "echo": (dict(output_ids=prompt_tail + good), {"no_prompt_echo", "no_think_start_in_output"}),
        "bad_args": (
            dict(prompt_id="p1", output_ids=k.output("Call it.", "", tool=(tool[0], '{"city": "Par'))),
            {"tool_args_json"},
        ),
        "unbalanced": (
            dict(prompt_id="p1", output_ids=[x for x in k.output("Call it.", "", tool=tool) if x != t.call_end]),
            {"tool_markers_balanced", "tool_args_json"},
        ),
        "tool_in_reasoning": (
            dict(
                prompt_id="p1",
                output_ids=[
                    t.section_begin,
                    t.call_begin,
                    *k.enc(tool[0]),
                    t.argument_begin,
                    *k.enc(tool[1]),
                    t.call_end,
                    t.section_end,
                ]
                + k.output("Then answer.", "Sunny."),
            ),
            {"tool_markers_balanced"},
        ),
        "empty_reasoning": (dict(output_ids=k.output("", "4")), {"reasoning_not_empty"}),
        "empty_answer": (dict(output_ids=k.output(REASONING, "")), {"answer_or_tool_call"}),
        "degenerate": (dict(output_ids=k.output("ha " * 80, "4")), {"no_degenerate_repetition"}),
        # a long-period loop: each 4-gram rare, but most 4-grams repeat -> warning only
        "long_loop": (dict(output_ids=k.output(sentence * 12, "4")), set()),
    }


@pytest.fixture(scope="module")
def frames(kimi):
    cases = _cases(kimi)
    rows = [
        dict(sample_id=sid, prompt_id=o.get("prompt_id", "p0"), **{k: v for k, v in o.items() if k != "prompt_id"})
        for sid, (o, _) in cases.items()
    ]
    return generation_rows(rows), tokenized_rows(kimi, PROMPTS), cases


def test_feature_values(frames, kimi, kimi_profile, kimi_tokenizer):
    gens, tokenized, _ = frames
    f = generation_features(gens, tokenized, kimi_profile, kimi_tokenizer)
    assert f.height == gens.height and f["row_id"].to_list() == gens["sample_id"].to_list()
    assert not any(dt.is_nested() for dt in f.dtypes)  # GX gets scalars only
    row = {r["row_id"]: r for r in f.iter_rows(named=True)}
    reasoning_ids = kimi.enc(REASONING)
    assert row["good"]["think_end_count"] == 1
    assert row["good"]["think_end_pos"] == len(reasoning_ids) == row["good"]["reasoning_len"]
    assert row["good"]["answer_len"] == len(kimi.enc("2 + 2 = 4."))
    assert row["good"]["last_id"] == 163586 and row["good"]["finish_reason"] == "stop"
    assert row["two_think_ends"]["think_end_count"] == 2
    assert row["no_think_end"]["think_end_pos"] is None and row["no_think_end"]["reasoning_len"] is None
    assert row["good_tool"]["has_tool_call"] and row["good_tool"]["tool_call_count"] == 1
    assert row["good_tool"]["tool_args_parse"] is True and row["good_tool"]["answer_len"] == 0
    assert row["good"]["tool_args_parse"] is None  # no tool call: not applicable
    assert row["echo"]["echoes_prompt_tail"] is True and row["good"]["echoes_prompt_tail"] is False
    assert row["degenerate"]["max_ngram_coverage"] == 1.0
    assert row["long_loop"]["max_ngram_coverage"] < 0.5 < row["long_loop"]["repeated_ngram_fraction"]
    assert (
        row["empty_reasoning"]["output_len"] < 32 and row["empty_reasoning"]["max_ngram_coverage"] is None
    )  # too short


def test_every_critical_reason_is_reported(frames, kimi_profile, kimi_tokenizer, gx_dirs):
    gens, tokenized, cases = frames
    f = generation_features(gens, tokenized, kimi_profile, kimi_tokenizer)
    res = run_gate("generations", f, profile=kimi_profile, **gx_dirs)
    name_to_key = {o.name: o.key for o in res.outcomes}
    got = {r["row_id"]: {name_to_key[n] for n in r["reasons"]} for r in res.row_failures.iter_rows(named=True)}
    expected = {sid: keys for sid, (_, keys) in cases.items() if keys}
    assert got == expected
    # many different problems in a 15-row shard: far below every `mostly`, so the gate fails
    assert not res.success
    warn = next(o for o in res.outcomes if o.key == "low_repeated_ngram_fraction")
    assert warn.severity == "warning" and warn.unexpected_count >= 1


def test_without_tokenizer_or_prompts_those_checks_are_skipped(frames, kimi_profile, gx_dirs):
    gens, _, _ = frames
    f = generation_features(gens, None, kimi_profile)
    assert f["echoes_prompt_tail"].null_count() == f.height
    assert f["tool_args_parse"].null_count() == f.height
    res = run_gate("generations", f, **gx_dirs)
    skipped = {o.key for o in res.outcomes if o.evaluated == 0}
    assert skipped == {"no_prompt_echo", "tool_args_json", "spec_metrics_consistent"}  # no speculative figures


def test_qwen_output_may_open_with_one_think(qwen_profile):
    # Qwen3's prompt leaves <think> to the model: "<think>\n...\n</think>\n\nanswer<|im_end|>".
    ts, te, eot = qwen_profile.think_start_id, qwen_profile.think_end_id, qwen_profile.end_of_turn_id
    call_b, call_e = qwen_profile.tool_call_ids.call_begin, qwen_profile.tool_call_ids.call_end
    outs = {
        "ok": [ts, 198, 1000, 2000, 198, te, 271, 3000, eot],
        "twice": [ts, 198, 1000, ts, 2000, te, 271, 3000, eot],
        "ok_tool": [ts, 1000, te, 271, call_b, 4000, call_e, eot],
        "tool_open": [ts, 1000, te, 271, call_b, 4000, eot],
    }
    gens = generation_rows([dict(sample_id=k, prompt_id="q", output_ids=v) for k, v in outs.items()])
    f = {r["row_id"]: r for r in generation_features(gens, None, qwen_profile).iter_rows(named=True)}
    assert f["ok"]["think_start_count"] == 1 and f["ok"]["unexpected_think_start_count"] == 0
    assert f["twice"]["unexpected_think_start_count"] == 1
    assert f["ok"]["reasoning_len"] == 4  # the leading <think> is not reasoning
    assert f["ok_tool"]["tool_markers_ok"] and f["ok_tool"]["has_tool_call"]
    assert not f["tool_open"]["tool_markers_ok"]


def test_kimi_output_may_not_open_with_think(kimi_profile, kimi):
    # For Kimi the prompt already ends with <think>: a leading <think> in the output is an echo.
    gens = generation_rows([dict(sample_id="a", prompt_id="p", output_ids=[163606] + kimi.output("r", "a"))])
    f = generation_features(gens, None, kimi_profile)
    assert f["unexpected_think_start_count"].to_list() == [1]


def test_empty_shard_passes_with_nothing_evaluated(kimi_profile, gx_dirs):
    gens = generation_rows([])
    f = generation_features(gens, None, kimi_profile)
    assert f.height == 0
    res = run_gate("generations", f, profile=kimi_profile, **gx_dirs)
    assert res.success and res.n_rows == 0 and res.row_failures.height == 0


def test_empty_shard_is_shown_empty_not_pass(kimi, kimi_profile, gx_dirs, tmp_path):
    """A real 0-row shard through the real gate: status EMPTY; its checks pass (nothing blocks) but
    say empty; the stored result shows as "empty" in the quality report, not PASS."""
    from eagle3_dagster.defs.generate import GENERATION_HEADLINES
    from eagle3_dagster.orchestration.gates import gate_check_results
    from eagle3_dagster.quality import write_gate_result
    from eagle3_dagster.report.html import collect, write_report

    res = run_gate("generations", generation_features(generation_rows([]), None, kimi_profile), **gx_dirs)
    assert (res.success, res.n_rows, res.status) == (True, 0, "EMPTY")
    assert "EMPTY" in res.summary_markdown() and "PASSED" not in res.summary_markdown()
    # the gate alone, as run here, has no request-failure outcome (the generations step adds it per shard)
    headlines = [h for h in GENERATION_HEADLINES if h.check_name != "request_failure_budget"]
    checks = {c.check_name: c for c in gate_check_results("generations", res, headlines)}
    assert set(checks) == {"think_end_present", "generations_gate"}
    for c in checks.values():
        assert c.passed  # not blocking
        assert c.metadata["status"].value == "EMPTY" and "0 rows" in (c.description or "")
    assert "| empty |" in checks["generations_gate"].metadata["expectations"].value
    # Dagster's check page plots every numeric entry over all executions (i.e. across shards): a shard's
    # numbers are a one-row table instead, and none is a bare int/float
    for c in checks.values():
        numeric = [k for k, v in c.metadata.items() if isinstance(v, (dg.IntMetadataValue, dg.FloatMetadataValue))]
        assert numeric == [], (c.check_name, numeric)
    (record,) = checks["generations_gate"].metadata["result"].records
    assert record.data == {"rows": 0, "rows_failing_critical": 0}
    assert checks["think_end_present"].metadata["result"].records[0].data["severity"] == "critical"

    # a non-empty shard keeps PASS
    ok_gens = generation_rows([dict(sample_id="a", prompt_id="p", output_ids=kimi.output(REASONING, "4"))])
    ok = run_gate("generations", generation_features(ok_gens, None, kimi_profile), **gx_dirs)
    data = tmp_path / "data"
    write_gate_result(data, "generations", 0, res)
    write_gate_result(data, "generations", 1, ok)
    model = collect(data, data, n_shards=2)
    cells = [row.cells["generations"] for row in model.shards]
    assert ok.status == "PASS" and [c.status for c in cells] == ["EMPTY", "PASS"]
    assert model.counts()["EMPTY"] == 1
    page = write_report(data, data, n_shards=2).read_text()
    assert '<span class="badge EMPTY">empty</span>' in page and "1 empty (0 rows)" in page


def test_large_shard_counts_match_gx(kimi, kimi_profile, gx_dirs):
    # 2,000 rows, 3% missing </think>: the pass rate GX applies `mostly` to equals polars' count.
    base = kimi.output(REASONING, "4")
    bad = kimi.output(REASONING, "4", think_end=False)
    gens = generation_rows(
        [dict(sample_id=f"s{i}", prompt_id="p", output_ids=bad if i % 33 == 0 else base) for i in range(2000)]
    )
    res = run_gate("generations", generation_features(gens, None, kimi_profile), **gx_dirs)
    o = next(o for o in res.outcomes if o.key == "think_end_present")
    n_bad = len(range(0, 2000, 33))
    assert o.unexpected_count == n_bad and o.pass_rate == pytest.approx(1 - n_bad / 2000)
    assert res.success and res.row_failures.height == n_bad
    assert set(res.row_failures["row_id"]) == {f"s{i}" for i in range(0, 2000, 33)}
    assert isinstance(res.row_failures, pl.DataFrame)


def test_repetition_features_match_a_reference(kimi_profile):
    # Reference: count every 4-gram with a Counter. Rows of different lengths, including rows
    # shorter than n, exercise the row-boundary handling of the flat (numpy) computation.
    import random
    from collections import Counter

    rnd = random.Random(7)
    outs = [[rnd.choice([11, 12, 13]) for _ in range(rnd.randint(0, 90))] for _ in range(60)]
    outs += [[5, 6, 7, 8] * 20, [9] * 40, list(range(100, 150))]
    gens = generation_rows([dict(sample_id=str(i), prompt_id="p", output_ids=o) for i, o in enumerate(outs)])
    f = generation_features(gens, None, kimi_profile, ngram=4, min_len_for_repetition=8)
    for o, cov, frac in zip(outs, f["max_ngram_coverage"], f["repeated_ngram_fraction"]):
        if len(o) < 8:
            assert cov is None and frac is None
            continue
        c = Counter(tuple(o[i : i + 4]) for i in range(len(o) - 3))
        assert cov == pytest.approx(min(1.0, max(c.values()) * 4 / len(o)))
        assert frac == pytest.approx(1 - len(c) / (len(o) - 3))


def test_ngram_keys_do_not_depend_on_chunking():
    from eagle3_dagster.quality.features import _ngram_keys

    ids = pl.Series("output_ids", [list(range(i, i + (i * 7) % 23)) for i in range(200)], pl.List(pl.Int32))
    whole = _ngram_keys(ids, 4)
    assert _ngram_keys(ids, 4, chunk_values=16).to_list() == whole.to_list()
    assert _ngram_keys(ids.slice(50, 100), 4).to_list() == whole.slice(50, 100).to_list()  # sliced input
    assert [len(k) for k in whole.to_list()] == [max(0, (i * 7) % 23 - 3) for i in range(200)]
