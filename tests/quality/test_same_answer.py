"""One answer for every prompt: different prompts whose output ids are identical, each with the right rid and
prompt length (a response cache keyed on the wrong field sends them so; no per-answer check can see it).

What a user relies on: the generations gate quarantines every row of a group of 4+ different prompts sharing
one answer and fails when more than 1% of a shard's rows are in one (expectations/generations.json,
`same_answer_to_different_prompts`), while a few prompts legitimately sharing a short answer pass; the
publish gate refuses a snapshot where one answer is spread over shards (expectations/publish.json,
`same_answer_share`). Real Kimi ids, real GX suites, real feature frames.
"""

from __future__ import annotations

import polars as pl
import pytest
from quality_helpers import EXPECTATIONS_DIR, generation_rows, training_rows

from eagle3_dagster.publish.snapshot_gates import SnapshotFacts, judge_snapshot, same_answer_min_prompts
from eagle3_dagster.quality import generation_features, run_gate
from eagle3_dagster.quality.features import with_same_answer_counts
from eagle3_dagster.storage.frames import streamed_features
from eagle3_dagster.train.summary import sample_stats, summarize

CACHED = "A farmer has 17 sheep and all but 9 run away, so 9 are left."


def _own(kimi, i: int) -> list[int]:
    """Prompt i's own answer: reasoning and answer that name it."""
    return kimi.output(
        f"Question {i} asks for the sum of {i} and {i + 1}; adding them gives {2 * i + 1}.", f"{2 * i + 1}"
    )


def _gens(kimi, own: int, shared: int, *, shared_ids: list[int] | None = None, start: int = 0) -> pl.DataFrame:
    """`own` rows with their own answer, then `shared` rows of other prompts all answered `shared_ids`."""
    ids = shared_ids if shared_ids is not None else kimi.output("The sheep question: 17 minus the runaways.", CACHED)
    rows = [dict(sample_id=f"s{i}", prompt_id=f"p{i}", output_ids=_own(kimi, i)) for i in range(start, start + own)]
    rows += [dict(sample_id=f"c{i}", prompt_id=f"q{i}", output_ids=ids) for i in range(shared)]
    return generation_rows(rows)


def _failed_rows(res) -> dict[str, list[str]]:
    return {r["row_id"]: r["reasons"] for r in res.row_failures.iter_rows(named=True)}


def test_the_feature_counts_the_different_prompts_sharing_an_answer(kimi, kimi_profile):
    gens = _gens(kimi, 3, 8)
    yes = kimi.output("A yes/no question whose answer is plainly yes.", "Yes.")
    extra = generation_rows(
        [
            dict(sample_id="y1", prompt_id="py1", output_ids=yes),
            dict(sample_id="y2", prompt_id="py2", output_ids=yes),
            dict(sample_id="dup", prompt_id="p0", output_ids=_own(kimi, 0)),  # the same prompt again: one prompt
            dict(sample_id="none", prompt_id="pn", output_ids=[]),
        ]
    )
    f = generation_features(pl.concat([gens, extra]), None, kimi_profile)
    got = dict(zip(f["row_id"], f["same_answer_prompts"], strict=True))
    assert {k: got[k] for k in ("s0", "s1", "s2", "dup", "y1", "y2", "none")} == {
        "s0": 1,
        "s1": 1,
        "s2": 1,
        "dup": 1,
        "y1": 2,
        "y2": 2,
        "none": None,
    }
    assert {got[f"c{i}"] for i in range(8)} == {8}
    # the gate's features are streamed batch by batch: counted again over the whole shard, the same figures
    batches = iter([pl.concat([gens, extra]).slice(i, 3) for i in range(0, gens.height + extra.height, 3)])
    streamed, _, _ = streamed_features(batches, lambda b: generation_features(b, None, kimi_profile))
    whole = with_same_answer_counts(streamed)
    assert dict(zip(whole["row_id"], whole["same_answer_prompts"], strict=True)) == got


def test_every_prompt_with_one_answer_fails_the_gate_and_every_row_is_quarantined(kimi, kimi_profile, gx_dirs):
    res = run_gate("generations", generation_features(_gens(kimi, 0, 8), None, kimi_profile), **gx_dirs)
    assert not res.success
    (failed,) = list(res.failed_critical)
    assert failed.key == "same_answer_to_different_prompts" and failed.unexpected_count == 8
    assert _failed_rows(res) == {f"c{i}": [failed.name] for i in range(8)}


def test_a_small_group_in_a_big_shard_is_quarantined_and_the_gate_passes(kimi, kimi_profile, gx_dirs):
    res = run_gate("generations", generation_features(_gens(kimi, 400, 4), None, kimi_profile), **gx_dirs)
    assert res.success  # 4 of 404 rows: under the 1% the gate allows
    assert set(_failed_rows(res)) == {f"c{i}" for i in range(4)}  # never published all the same


def test_a_few_prompts_sharing_a_short_answer_pass(kimi, kimi_profile, gx_dirs):
    yes = kimi.output("The answer to this yes/no question is yes.", "Yes.")
    res = run_gate(
        "generations", generation_features(_gens(kimi, 20, 3, shared_ids=yes), None, kimi_profile), **gx_dirs
    )
    assert res.success and res.row_failures.height == 0


def _summary(kimi, kimi_profile, own: int, shared: int) -> dict:
    rows = [
        dict(sample_id=f"s{i}", prompt_id=f"p{i}", prompt_ids=[1, 2, i], output_ids=_own(kimi, i)) for i in range(own)
    ]
    same = kimi.output("Cached.", CACHED)
    rows += [dict(sample_id=f"c{i}", prompt_id=f"q{i}", prompt_ids=[3, 4, i], output_ids=same) for i in range(shared)]
    return summarize(sample_stats(training_rows(rows), kimi_profile))


def test_the_publish_gate_refuses_one_answer_spread_over_shards(kimi, kimi_profile, gx_dirs):
    assert same_answer_min_prompts(EXPECTATIONS_DIR) == 4
    spread = _summary(kimi, kimi_profile, 2, 6)  # each shard held one or two of them: no shard gate saw a group
    assert spread["same_answer_rows"] == {"6": 6}
    v = judge_snapshot(SnapshotFacts(rows=8, shards_included=8, summary=spread), **gx_dirs)
    assert not v.publish and v.publish_gate.values["same_answer_share"] == 0.75
    assert (
        len(v.reasons) == 1
        and "75.0% of the 8 rows have an answer shared by 4 or more different prompts" in (v.reasons[0])
    )
    assert "the largest group: 6 prompts with one answer" in v.reasons[0]


@pytest.mark.parametrize(("own", "shared"), [(10, 3), (400, 4), (5, 0)])
def test_the_publish_gate_lets_small_or_rare_groups_through(kimi, kimi_profile, gx_dirs, own: int, shared: int):
    summary = _summary(kimi, kimi_profile, own, shared)
    v = judge_snapshot(SnapshotFacts(rows=own + shared, shards_included=1, summary=summary), **gx_dirs)
    assert v.publish, v.reasons
    # a summary of an older snapshot (no such figures): not judged
    old = {k: x for k, x in summary.items() if k != "same_answer_rows"}
    assert judge_snapshot(SnapshotFacts(rows=own + shared, shards_included=1, summary=old), **gx_dirs).publish
