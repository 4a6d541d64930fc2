"""A drafter path with credentials (`s3://user:password@bucket/drafter`, a presigned URL) in a server's
/server_info `speculative_draft_model_path`: nothing the project writes or shows holds the credentials, not
the generations rows, the probe results, a candidate's results, a stored comparison, the report's drafter
tables nor a log line; the rows name the drafter by its redacted path (generate/drafter.redact_draft_path).
Real simulator processes over HTTP, real Parquet."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import polars as pl
import pytest
from gen_helpers import make_config, make_prompts

from eagle3_dagster.drafters.rule import PromotionRule
from eagle3_dagster.drafters.run import CompareInputs, CompareRequest, compare_candidate
from eagle3_dagster.drafters.text import comparison_table, sources_markdown
from eagle3_dagster.generate import generate_shard, read_generations
from eagle3_dagster.generate.active import active_sample_ids
from eagle3_dagster.generate.probe_results import record_probe_results
from eagle3_dagster.generate.probes import ProbeKeys
from eagle3_dagster.report.probes import collect_probes, probes_section
from eagle3_dagster.storage import as_data_path

pytestmark = pytest.mark.integration

SECRETS = ("pw-Zq81-secret", "tok-Hh42-secret", "sig-Kk7-secret")
PROD = f"s3://reader:{SECRETS[0]}@bucket/eagle3-a"
CAND = f"https://bob:{SECRETS[1]}@hub.example/eagle3-b?X-Amz-Signature={SECRETS[2]}"
SPEC = ("--speculative-num-draft-tokens", "4")
PROBE = "probe_unit"


def _text(f: Path) -> str:
    """A written file as text: a Parquet file's values (its pages are compressed), any other file's bytes."""
    if f.suffix == ".parquet":
        return json.dumps(pl.read_parquet(f).to_dicts(), default=str)
    return f.read_bytes().decode("utf-8", "replace")


def test_no_stored_or_shown_drafter_path_holds_its_credentials(start_sim, tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    data = tmp_path / "data"
    prompts = make_prompts(6, seed=4242).with_columns(pl.lit(PROBE).alias("source"))
    (data / "tokenized_prompts" / "shard=0000").mkdir(parents=True)
    prompts.write_parquet(data / "tokenized_prompts" / "shard=0000" / "part-0000.parquet")

    prod = start_sim("--speculative-draft-model-path", PROD, *SPEC)
    gen = data / "generations" / "shard=0000"
    report = generate_shard(prompts, gen, make_config(prod.url, probe_sources=(PROBE,)))
    assert report.succeeded == 6 and report.failed == 0
    probes = ProbeKeys(frozenset({PROBE}), report.drafter_key, None)
    active = active_sample_ids(prompts, report.model_revision, report.sampling_hash, None, probes=probes)
    assert record_probe_results(data, 0, gen, active, prompts, probes) == 6
    assert set(read_generations(gen)["spec_draft_model_path"]) == {"s3://[redacted]@bucket/eagle3-a"}

    cand = start_sim("--speculative-draft-model-path", CAND, *SPEC)
    said: list[str] = []
    inputs = CompareInputs(
        as_data_path(data),
        tmp_path / "locks",
        PromotionRule(min_prompts=2),
        frozenset({PROBE}),
        make_config(cand.url, probe_sources=(PROBE,)),
        log=said.append,
    )
    outcome = compare_candidate(inputs, CompareRequest((cand.url,)))
    assert outcome.refused is None and outcome.requests["sent"] == 6, outcome.doc
    assert outcome.doc["candidate"]["spec_draft_model_path"] == (
        "https://[redacted]@hub.example/eagle3-b?X-Amz-Signature=[redacted]"
    )

    written = {str(f): _text(f) for f in data.rglob("*") if f.is_file()}
    assert any("probes/candidates/results" in f for f in written) and any("comparisons" in f for f in written)
    shown = {
        "log": caplog.text,
        "compare's lines": "\n".join(said),
        "table": comparison_table(outcome.doc),
        "metadata table": sources_markdown(outcome.doc),
        "report": "\n".join(probes_section(collect_probes(as_data_path(data)))),
        "generation report": repr(report),
    }
    leaks = [where for where, text in {**written, **shown}.items() if any(s in text for s in SECRETS)]
    assert leaks == []
