"""Acceptance figures from every SGLang release since 0.5.9, over HTTP: real simulator processes speaking each
release's names (`--spec-names`, sim/speculative.py; the names are checked against each release's own source
in test_sglang_spec_shapes.py), generated into real Parquet by the client (generate/drafter.py NAMES).

A 0.5.10 or 0.5.11 server's counts and histogram go under other names than today's; each row must hold them
in the same columns as a 0.5.23 server's, with the release that served it, never flagged `partial`. A
speculating server whose answers carry none of the names is named once per endpoint, never silent nulls.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from gen_helpers import Sim, as_map, make_config, make_prompts

from eagle3_dagster.generate import generate_shard, read_generations
from eagle3_dagster.generate.report import result_line
from eagle3_dagster.sim.speculative import SPEC_NAMES

pytestmark = pytest.mark.integration

# the row's columns (today's names) and the 0.5.18+ cap figures
METRIC_KEYS = (
    "spec_accept_length",
    "spec_accept_rate",
    "spec_verify_ct",
    "spec_num_correct_drafts",
    "spec_num_proposed_drafts",
    "spec_correct_drafts_histogram",
)
EXTRA_KEYS = ("spec_cap_length", "spec_block_accept_length", "spec_cap_lens_histogram")

N = 6
SPEC = ("--speculative-draft-model-path", "test/kimi-eagle3-a", "--speculative-num-draft-tokens", "4")
# release -> the simulator's extra flags (0.5.18: its aliases and, in cap-accept mode, the cap figures)
PROFILES = {
    "0.5.9": ("--version", "0.5.9"),
    "0.5.10": ("--spec-names", "0.5.10"),
    "0.5.11": ("--spec-names", "0.5.11"),
    "0.5.12": ("--spec-names", "0.5.12"),
    "0.5.18": ("--spec-names", "0.5.18", "--ragged-verify-mode", "cap-accept"),
    "0.5.23": (),
}


@pytest.fixture(scope="module")
def sims(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Sim]]:
    logs = tmp_path_factory.mktemp("spec-releases")
    started = {r: Sim(extra_args=(*SPEC, *a), log_path=logs / f"{r}.log") for r, a in PROFILES.items()}
    yield started
    for s in started.values():
        s.kill()


@pytest.fixture(scope="module")
def prompts():
    return make_prompts(N, seed=461)


@pytest.fixture(scope="module")
def reference(sims: dict[str, Sim], prompts, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """A 0.5.23 server's rows: figures by sample, and the ids."""
    out = tmp_path_factory.mktemp("ref")
    rep = generate_shard(prompts, out, make_config(sims["0.5.23"].url, max_new_tokens=40))
    assert rep.succeeded == N
    df = read_generations(out)
    return {"ids": as_map(df), "figures": {r["sample_id"]: r for r in df.select("sample_id", *METRIC_KEYS).to_dicts()}}


def _sent_under(meta: dict, column: str, release: str) -> object:
    """The value the answer sent for `column`, under the name `release` gives it (the simulator's table,
    checked against each release's source in test_sglang_spec_shapes.py)."""
    correct, proposed, histogram, _ = SPEC_NAMES[release]
    renamed = {"spec_num_correct_drafts": correct, "spec_num_proposed_drafts": proposed}
    renamed["spec_correct_drafts_histogram"] = histogram
    return meta[renamed.get(column, (column,))[0]]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("release", list(PROFILES))
def test_every_releases_figures_land_in_the_same_columns_with_the_release(
    sims: dict[str, Sim], prompts, reference, tmp_path: Path, release: str, stream: bool
):
    sims[release].faults(clear=True)
    rep = generate_shard(prompts, tmp_path / "g", make_config(sims[release].url, max_new_tokens=40, stream=stream))
    assert rep.succeeded == N and rep.integrity_violations == 0, rep
    assert rep.server_versions == {sims[release].url: release}
    df = read_generations(tmp_path / "g")
    assert as_map(df) == reference["ids"]
    for r in df.to_dicts():
        meta = json.loads(r["meta_info"])
        assert r["integrity_violations"] == []  # never `spec_metrics_inconsistent:partial`
        assert r["sglang_version"] == release and r["worker"] == sims[release].url
        for c in METRIC_KEYS:
            assert r[c] is not None and r[c] == _sent_under(meta, c, release), (c, r[c])
        # the same drafter on the same prompt: the same figures as a 0.5.23 server's, whatever their names
        ref = reference["figures"][r["sample_id"]]
        assert {c: r[c] for c in METRIC_KEYS} == {c: ref[c] for c in METRIC_KEYS}
        cap = release == "0.5.18"
        assert all((r[c] is not None) == cap for c in EXTRA_KEYS), {c: r[c] for c in EXTRA_KEYS}
        if cap:
            assert r["spec_cap_length"] == meta["spec_cap_length"]
            assert sum(r["spec_cap_lens_histogram"]) == r["spec_verify_ct"]


def test_a_speculating_server_whose_names_no_release_uses_is_named_once_per_endpoint(
    start_sim, prompts, tmp_path: Path, caplog
):
    renamed = [start_sim(*SPEC), start_sim(*SPEC, "--spec-names", "0.5.11")]
    for s in renamed:
        s.faults(spec_names_unknown=True)
    caplog.set_level(logging.WARNING, logger="eagle3_dagster.generate")
    rep = generate_shard(
        make_prompts(16, seed=462), tmp_path / "g", make_config(*(s.url for s in renamed), max_new_tokens=40)
    )
    assert rep.succeeded == 16
    lines = [r.getMessage() for r in caplog.records if "none of the names SGLang releases send" in r.getMessage()]
    assert len(lines) == 2, lines  # one per endpoint, not one per row
    for s, release in zip(renamed, ("0.5.23", "0.5.11"), strict=True):
        [line] = [m for m in lines if m.startswith(s.url)]
        assert f"SGLang {release}" in line and "spec_correct_tokens" in line and "test/kimi-eagle3-a" in line
    df = read_generations(tmp_path / "g")
    assert rep.spec_figures_unread == dict(df.group_by("endpoint").len().iter_rows())  # every row counted
    assert "rows of a speculating server without acceptance figures" in result_line("shard=0000", rep)
    assert df["drafter_id"].null_count() == 0 and df["spec_verify_ct"].null_count() == df.height
    assert all(v == [] for v in df["integrity_violations"].to_list())  # the ids are fine: the rows stay clean
