"""Training-sample and prompt gates: row-level layout checks and table-level bounds."""

from __future__ import annotations

import polars as pl
import pytest
from quality_helpers import tokenized_rows, training_rows

from eagle3_dagster.quality import prompt_features, run_gate, training_features


def _keys(res, row_id):
    names = {o.name: o.key for o in res.outcomes}
    row = res.row_failures.filter(pl.col("row_id") == row_id)
    return set() if row.height == 0 else {names[n] for n in row["reasons"][0]}


@pytest.fixture(scope="module")
def pair(kimi):
    return kimi.prompt("What is 2+2?"), kimi.output("Two and two make four.", "4")


def test_training_row_checks(pair, kimi_profile, gx_dirs):
    p, o = pair
    rows = [dict(sample_id=f"ok{i}", prompt_ids=p, output_ids=o + [i]) for i in range(200)]
    rows += [
        dict(sample_id="short_mask", prompt_ids=p, output_ids=o + [1000], loss_mask=[0] * len(p) + [1] * (len(o) - 1)),
        dict(sample_id="mask_on_prompt", prompt_ids=p, output_ids=o + [1001], loss_mask=[1] * (len(p) + len(o) + 1)),
        dict(sample_id="no_supervision", prompt_ids=p, output_ids=[], loss_mask=[0] * len(p)),
        dict(sample_id="bad_lengths", prompt_ids=p, output_ids=o + [1002], output_len=1),
        dict(sample_id="too_long", prompt_ids=p, output_ids=o + list(range(2000, 2100))),
    ]
    f = training_features(training_rows(rows), kimi_profile, max_total_len=100)
    res = run_gate("training_samples", f, profile=kimi_profile, **gx_dirs)
    assert _keys(res, "ok0") == set()
    assert _keys(res, "short_mask") == {"ids_mask_same_length", "mask_layout"}
    assert _keys(res, "mask_on_prompt") == {"mask_layout"}
    assert _keys(res, "no_supervision") == {"has_supervised_tokens"}
    assert _keys(res, "bad_lengths") == {"length_columns_consistent"}
    assert _keys(res, "too_long") == {"length_within_training_max"}
    assert res.row_failures.height == 5
    # mostly=1.0 layout checks: one broken mask is a builder bug, so the gate fails
    assert not res.success
    assert {o.key for o in res.failed_critical} == {"ids_mask_same_length", "mask_layout", "length_columns_consistent"}


def test_duplicate_rate_is_table_level(pair, kimi_profile, gx_dirs):
    p, o = pair
    rows = [dict(sample_id=f"s{i}", prompt_ids=p, output_ids=o + [i % 90]) for i in range(100)]  # 10% duplicates
    res = run_gate(
        "training_samples", training_features(training_rows(rows), kimi_profile, max_total_len=10_000), **gx_dirs
    )
    dup = next(x for x in res.outcomes if x.key == "duplicate_rate")
    assert not dup.success and dup.level == "table" and dup.observed_value == pytest.approx(0.9)
    assert not res.success and res.row_failures.height == 0  # the shard fails; no single row is to blame
    ok = run_gate(
        "training_samples",
        training_features(training_rows(rows), kimi_profile, max_total_len=10_000),
        config_overrides={"duplicate_rate": {"kwargs": {"min_value": 0.85}}},
        **gx_dirs,
    )
    assert ok.success


def test_source_mix_is_judged_against_what_the_sources_could_give(pair, kimi_profile, gx_dirs):
    p, o = pair
    rows = [
        dict(sample_id=f"s{i}", prompt_ids=p, output_ids=o + [i], source="gsm8k" if i < 95 else "alpaca")
        for i in range(100)
    ]
    samples = training_rows(rows)
    # 95% gsm8k is what these sources gave (95/5 of the prompts): no warning
    fair = training_features(
        samples, kimi_profile, max_total_len=10_000, available_shares={"gsm8k": 0.95, "alpaca": 0.05}
    )
    assert f_share(fair, "gsm8k") == pytest.approx(0.95)
    res = run_gate("training_samples", fair, **gx_dirs)
    assert next(x for x in res.outcomes if x.key == "source_mix").success
    # a single-source shard is 100% that source and never warns
    single = training_rows([dict(r, source="gsm8k") for r in rows])
    one = run_gate(
        "training_samples",
        training_features(single, kimi_profile, max_total_len=10_000, available_shares={"gsm8k": 1.0}),
        **gx_dirs,
    )
    assert next(x for x in one.outcomes if x.key == "source_mix").success and not one.failed_warnings
    # the prompts were half alpaca, but alpaca's rows got lost: gsm8k is over-represented by 45 points
    lost = training_features(
        samples, kimi_profile, max_total_len=10_000, available_shares={"gsm8k": 0.5, "alpaca": 0.5}
    )
    res = run_gate("training_samples", lost, **gx_dirs)
    mix = next(x for x in res.outcomes if x.key == "source_mix")
    assert not mix.success and mix.severity == "warning"
    assert res.success and res.row_failures.height == 0  # a warning, and table-level: nothing quarantined
    strict = run_gate("training_samples", lost, config_overrides={"source_mix": {"severity": "critical"}}, **gx_dirs)
    assert not strict.success and strict.row_failures.height == 0
    loose = run_gate(
        "training_samples", lost, config_overrides={"source_mix": {"kwargs": {"max_value": 0.5}}}, **gx_dirs
    )
    assert next(x for x in loose.outcomes if x.key == "source_mix").success
    assert res.by_source == {"alpaca": [5, 0], "gsm8k": [95, 0]}


def f_share(f, source):
    return f.filter(pl.col("source") == source)["source_share"][0]


def test_prompt_row_checks(kimi, kimi_profile, gx_dirs):
    tp = tokenized_rows(kimi, {f"p{i}": f"Question number {i}?" for i in range(150)})
    long_ids = list(range(kimi_profile.max_prompt_tokens)) + [163606]  # one id over the limit
    extra = pl.DataFrame(
        {
            "prompt_id": ["oov", "long", "p0", "len_lie"],
            "source": ["s"] * 4,
            "shard": [0] * 4,
            "input_ids": [[5, 170000, 163606], long_ids, tp["input_ids"][0].to_list(), [1, 2, 163606]],
            "prompt_len": [3, len(long_ids), tp["prompt_len"][0], 4],
            "profile": ["k"] * 4,
            "tokenizer_fingerprint": ["t"] * 4,
            "template_hash": ["h"] * 4,
            "control_text_in_content": [False] * 4,
        },
        schema=tp.schema,
    )
    f = prompt_features(pl.concat([tp, extra]), kimi_profile)
    res = run_gate("prompts", f, profile=kimi_profile, **gx_dirs)
    assert _keys(res, "oov") == {"ids_in_vocabulary"}
    assert _keys(res, "long") == {"prompt_length_within_limit"}
    assert _keys(res, "p0") == {"prompt_ids_unique"}  # both copies of the duplicated id
    assert _keys(res, "len_lie") == {"prompt_len_consistent"}
    assert _keys(res, "p1") == set()
    long_ok = next(x for x in res.outcomes if x.key == "prompt_length_within_limit")
    assert long_ok.success  # 1 of 154 over the limit: quarantined, below the 1% `mostly` budget


def test_empty_shards_pass_every_gate(kimi_profile, gx_dirs):
    from quality_helpers import frame

    from eagle3_dagster import schemas

    empty_training = training_features(training_rows([]), kimi_profile, max_total_len=100)
    res = run_gate("training_samples", empty_training, **gx_dirs)
    assert res.success and res.n_rows == 0
    assert next(o for o in res.outcomes if o.key == "duplicate_rate").success
    assert run_gate("prompts", prompt_features(frame(schemas.TOKENIZED_PROMPTS, []), kimi_profile), **gx_dirs).success
