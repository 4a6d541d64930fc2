"""Gate semantics: what blocks a shard, what only quarantines rows, and that suites are data."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl
import pytest
from quality_helpers import EXPECTATIONS_DIR, generation_rows, tokenized_rows

from eagle3_dagster.quality import (
    GateFailedError,
    GateResult,
    generation_features,
    gx_docs,
    load_suite,
    prompt_features,
    read_gate_result,
    require_gate_passed,
    run_gate,
    write_gate_result,
)

THINK_END_NAME = "163607 present"


def _gens(kimi, n: int, missing_think_end: int):
    """n good Kimi outputs, the first `missing_think_end` of which lack </think> (163607)."""
    samples = []
    for i in range(n):
        samples.append(
            dict(
                sample_id=f"s{i:03d}",
                prompt_id="p0",
                output_ids=kimi.output(
                    f"Step {i}: add the numbers.", f"The answer is {i}.", think_end=i >= missing_think_end
                ),
            )
        )
    return generation_rows(samples)


@pytest.fixture()
def tokenized(kimi):
    return tokenized_rows(kimi, {"p0": "What is 2+2?"})


def _outcome(res: GateResult, key: str):
    return next(o for o in res.outcomes if o.key == key)


def test_rare_missing_think_end_quarantines_rows_but_passes_gate(kimi, kimi_profile, tokenized, gx_dirs):
    feats = generation_features(_gens(kimi, 40, 1), tokenized, kimi_profile)
    res = run_gate("generations", feats, profile=kimi_profile, **gx_dirs)
    assert res.success
    o = _outcome(res, "think_end_present")
    assert o.name == THINK_END_NAME and o.severity == "critical"
    assert o.unexpected_count == 1 and o.pass_rate == pytest.approx(39 / 40) and o.success
    assert res.row_failures.to_dicts() == [{"row_id": "s000", "reasons": [THINK_END_NAME]}]
    assert res.n_rows == 40


def test_systematic_missing_think_end_fails_gate(kimi, kimi_profile, tokenized, gx_dirs):
    # What a reasoning parser stripping </think> looks like: no output has 163607.
    feats = generation_features(_gens(kimi, 20, 20), tokenized, kimi_profile)
    res = run_gate("generations", feats, profile=kimi_profile, **gx_dirs)
    assert not res.success
    assert [o.key for o in res.failed_critical] == ["think_end_present"]
    assert _outcome(res, "think_end_present").pass_rate == 0.0
    assert res.row_failures.height == 20
    # reasoning/answer cannot be located without </think>: skipped (null), not double-reported
    assert _outcome(res, "reasoning_not_empty").evaluated == 0


def test_prompt_must_end_with_think_start_for_kimi(kimi, kimi_profile, gx_dirs):
    tp = tokenized_rows(kimi, {"a": "What is 2+2?", "b": "Name a colour."})
    ok = run_gate("prompts", prompt_features(tp, kimi_profile), profile=kimi_profile, **gx_dirs)
    assert ok.success and ok.row_failures.height == 0
    assert _outcome(ok, "thinking_token_ends_prompt").name == "thinking token 163606 ends prompt"
    # drop the prefilled <think> of prompt b: a template rendered with thinking off
    broken = tp.with_columns(
        pl.when(pl.col("prompt_id") == "b")
        .then(pl.col("input_ids").list.head(pl.col("prompt_len") - 1))
        .otherwise(pl.col("input_ids"))
        .alias("input_ids")
    ).with_columns(pl.col("input_ids").list.len().cast(pl.Int32).alias("prompt_len"))
    res = run_gate("prompts", prompt_features(broken, kimi_profile), profile=kimi_profile, **gx_dirs)
    assert not res.success
    assert res.row_failures.to_dicts() == [{"row_id": "b", "reasons": ["thinking token 163606 ends prompt"]}]


def test_think_start_expectation_is_skipped_for_qwen(qwen_profile, gx_dirs):
    # Qwen3's generation prompt ends at "<|im_start|>assistant\n": the check does not apply.
    tp = pl.DataFrame(
        {"prompt_id": ["q"], "source": ["x"], "input_ids": [[151644, 77091, 198]], "prompt_len": [3]},
        schema_overrides={"input_ids": pl.List(pl.Int32), "prompt_len": pl.Int32},
    )
    feats = prompt_features(tp, qwen_profile)
    assert feats["ends_with_think_start"].to_list() == [None]
    res = run_gate("prompts", feats, profile=qwen_profile, **gx_dirs)
    o = _outcome(res, "thinking_token_ends_prompt")
    assert res.success and o.success and o.evaluated == 0 and o.pass_rate == 1.0


def _edited_suite(tmp_path: Path, gate: str, key: str, **changes) -> Path:
    d = tmp_path / "expectations"
    d.mkdir(exist_ok=True)
    for f in EXPECTATIONS_DIR.glob("*.json"):
        shutil.copy(f, d / f.name)
    suite = json.loads((d / f"{gate}.json").read_text())
    exp = next(e for e in suite["expectations"] if e["meta"]["key"] == key)
    if "mostly" in changes:
        exp["kwargs"]["mostly"] = changes["mostly"]
    if "severity" in changes:
        exp["meta"]["severity"] = changes["severity"]
    (d / f"{gate}.json").write_text(json.dumps(suite))
    return d


def test_editing_the_json_changes_the_gate(kimi, kimi_profile, tokenized, gx_dirs, tmp_path):
    feats = generation_features(_gens(kimi, 10, 3), tokenized, kimi_profile)  # 70% have </think>
    assert not run_gate("generations", feats, **gx_dirs).success
    lenient = _edited_suite(tmp_path, "generations", "think_end_present", mostly=0.6)
    res = run_gate("generations", feats, expectations_dir=lenient, context_dir=gx_dirs["context_dir"])
    assert res.success
    assert _outcome(res, "think_end_present").mostly == 0.6
    assert res.row_failures.height == 3  # still quarantined: the rows are bad, the shard is fine
    warn = _edited_suite(tmp_path, "generations", "think_end_present", severity="warning")
    res = run_gate("generations", feats, expectations_dir=warn, context_dir=gx_dirs["context_dir"])
    assert res.success and res.row_failures.height == 0  # warnings never quarantine
    assert not _outcome(res, "think_end_present").success


def test_config_overrides_change_the_gate(kimi, kimi_profile, tokenized, gx_dirs):
    feats = generation_features(_gens(kimi, 10, 3), tokenized, kimi_profile)
    res = run_gate("generations", feats, config_overrides={"think_end_present": {"mostly": 0.5}}, **gx_dirs)
    assert res.success and _outcome(res, "think_end_present").mostly == 0.5
    res = run_gate("generations", feats, config_overrides={"think_end_present": {"enabled": False}}, **gx_dirs)
    assert "think_end_present" not in [o.key for o in res.outcomes]
    with pytest.raises(ValueError, match="no_such_expectation"):
        run_gate("generations", feats, config_overrides={"no_such_expectation": {"mostly": 0.5}}, **gx_dirs)


def test_gate_result_persists_and_blocks_a_later_run(kimi, kimi_profile, tokenized, gx_dirs, tmp_path):
    data = tmp_path / "data"
    bad = run_gate(
        "generations", generation_features(_gens(kimi, 6, 6), tokenized, kimi_profile), profile=kimi_profile, **gx_dirs
    )
    good = run_gate("generations", generation_features(_gens(kimi, 6, 0), tokenized, kimi_profile), **gx_dirs)
    p = write_gate_result(data, "generations", 3, bad)
    assert p == data / "gates" / "generations" / "shard=0003.json"
    write_gate_result(data, "generations", 4, good)
    assert not list(p.parent.glob(".*tmp"))  # atomic write leaves no temporary behind
    write_gate_result(data, "generations", 3, bad)  # rewritten: one rejects file per shard remains
    assert len(list(p.parent.glob("shard=0003.*.rejects.parquet"))) == 1
    back = read_gate_result(data, "generations", 3)
    assert back is not None and back.to_json() == bad.to_json()
    assert back.row_failures.height == 6 and back.row_failures.schema["reasons"] == pl.List(pl.String)
    with pytest.raises(GateFailedError, match="163607 present"):
        require_gate_passed(data, "generations", 3)
    assert require_gate_passed(data, "generations", 4).success
    assert read_gate_result(data, "generations", 5) is None
    with pytest.raises(GateFailedError, match="no stored"):
        require_gate_passed(data, "generations", 5)


def test_data_docs_are_built_under_the_context_dir(kimi, kimi_profile, tokenized, gx_dirs):
    res = run_gate(
        "generations", generation_features(_gens(kimi, 4, 0), tokenized, kimi_profile), profile=kimi_profile, **gx_dirs
    )
    index = gx_docs.build_data_docs(gx_dirs["context_dir"], 20)  # the quality report builds them, not the gate
    assert index is not None and index.exists() and gx_dirs["context_dir"] in index.parents
    html = index.read_text()
    assert "generations_gate" in html
    assert [str(p) for p in index.parent.glob("validations/**/*.html")] == [res.data_docs_page]  # this run's page
    suite_page = (index.parent / "expectations" / "generations_gate.html").read_text()
    assert "163607 present [critical, mostly 0.95]" in suite_page  # readable
    # GX stored the suite it validated with, names and severities in meta
    stored = json.loads((gx_dirs["context_dir"] / "gx" / "expectations" / "generations_gate.json").read_text())
    metas = {e["meta"]["key"]: e["meta"] for e in stored["expectations"]}
    assert metas["think_end_present"]["severity"] == "critical"


@pytest.mark.parametrize("gate", ["prompts", "generations", "training_samples"])
def test_suites_are_valid_gx_suites_with_readable_names(gate):
    import great_expectations as gx
    from great_expectations.core.expectation_suite import ExpectationSuite

    raw = json.loads((EXPECTATIONS_DIR / f"{gate}.json").read_text())
    suite = ExpectationSuite(**{k: raw[k] for k in ("name", "expectations", "meta")})
    assert len(suite.expectations) == len(raw["expectations"])  # GX drops invalid ones silently
    spec = load_suite(gate, EXPECTATIONS_DIR)
    for e in spec.expectations:
        assert e.severity in ("critical", "warning") and 0 < e.mostly <= 1
        assert " " in e.name and e.description, e.key  # a sentence, not an identifier
    assert gx.__version__.startswith("1.")


def _write_suite(d: Path, gate: str, expectations: list[dict]) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{gate}.json").write_text(json.dumps({"name": gate, "expectations": expectations}))
    return d


def test_bad_suites_are_refused_with_the_expectation_named(tmp_path, kimi, kimi_profile, tokenized, gx_dirs):
    from eagle3_dagster.quality import SuiteError

    feats = generation_features(_gens(kimi, 3, 0), tokenized, kimi_profile)
    base = {"type": "expect_column_values_to_be_in_set", "kwargs": {"column": "think_end_count", "value_set": [1]}}
    cases = {
        "sev": ({**base, "meta": {"key": "x", "name": "x y", "severity": "fatal"}}, "severity"),
        "mostly": ({**base, "kwargs": {**base["kwargs"], "mostly": 1.5}, "meta": {"key": "x"}}, "mostly"),
        "gx": (
            {
                "type": "expect_column_values_to_be_in_set",
                "kwargs": {"column": "think_end_count"},
                "meta": {"key": "no_value_set"},
            },
            "no_value_set",
        ),
        "col": (
            {**base, "kwargs": {"column": "no_such_feature", "value_set": [1]}, "meta": {"key": "x"}},
            "no_such_feature",
        ),
    }
    for name, (exp, match) in cases.items():
        d = _write_suite(tmp_path / name, "generations", [exp])
        with pytest.raises((SuiteError, ValueError), match=match):
            run_gate("generations", feats, expectations_dir=d, context_dir=gx_dirs["context_dir"])
    with pytest.raises(SuiteError, match="does not exist"):
        run_gate("nope", feats, **gx_dirs)


def test_concurrent_shards_share_one_gx_context(kimi, kimi_profile, tokenized, gx_dirs):
    # Dagster runs shard steps in parallel against one data dir: runs on the same GX context take
    # turns (file lock), so none sees a half-written great_expectations.yml or store.
    from concurrent.futures import ThreadPoolExecutor

    frames = [generation_features(_gens(kimi, 20, missing), tokenized, kimi_profile) for missing in (0, 20, 1, 20)]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda f: run_gate("generations", f, **gx_dirs), frames))
    assert [r.success for r in results] == [True, False, True, False]
    assert [r.row_failures.height for r in results] == [0, 20, 1, 20]
    docs = gx_docs.build_data_docs(gx_dirs["context_dir"], 20)
    assert docs is not None and len(list(docs.parent.glob("validations/**/*.html"))) == 4
