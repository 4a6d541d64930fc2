"""Shared by tests that run the real graph: resources for a data dir + simulator, and the shard to test.

Lives at tests/ (on sys.path through tests/conftest.py) like s3_moto.py, so any test folder imports it.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from eagle3_dagster.config import PROJECT_ROOT, settings
from eagle3_dagster.orchestration.resources import SGLangFleet, pipeline_resource


def graph_resources(
    data_dir: str | Path,
    tokenizer: str,
    url: str,
    *,
    max_new_tokens: int = 2048,
    max_failed_rate: float | None = None,
    **fleet,
) -> dict:
    """The `pipeline` and `sglang` resources of one test run (data dir may be a path or a URI)."""
    budget = {} if max_failed_rate is None else {"max_failed_rate": max_failed_rate}
    return {
        "pipeline": pipeline_resource(
            settings(), data_dir=str(data_dir), tokenizer=tokenizer, max_new_tokens=max_new_tokens, **budget
        ),
        "sglang": SGLangFleet(urls=url, **fleet),
    }


def shard_with_most_prompts(data_dir: Path) -> str:
    """The partition key of the shard holding the most prompts (lowest key on ties), after ingest."""
    p = pl.read_parquet(Path(data_dir) / "prompts" / "prompts.parquet")
    top = p.group_by("shard").len().sort(["len", "shard"], descending=[True, False]).row(0, named=True)
    return f"{top['shard']:04d}"


# the simulator's speculative flags as SGLang takes them (a drafter serving 3 steps of 1 token, 4 draft tokens)
SPEC_ARGS = ("--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4")


def probe_assets(tmp_path: Path, datasets_dir: Path, *, n_probe: int, train_limit: int) -> Path:
    """An assets folder with a `role: probe` source (the first `n_probe` gsm8k questions) and a training source
    (`train_limit` alpaca prompts) from the shared datasets, and the repo's model profiles."""
    assets = tmp_path / "assets"
    (assets / "sources").mkdir(parents=True)
    (assets / "models").symlink_to(PROJECT_ROOT / "assets" / "models")
    gsm8k = datasets_dir / "gsm8k_test" / "test.jsonl"
    (assets / "sources" / "probe_math.yaml").write_text(
        f"path: {gsm8k}\nformat: gsm8k\nlimit: {n_probe}\nrole: probe\n"
    )
    alpaca = datasets_dir / "alpaca_gpt4_en_demo" / "alpaca_en_demo.json"
    (assets / "sources" / "alpaca.yaml").write_text(f"path: {alpaca}\nformat: alpaca\nlimit: {train_limit}\n")
    return assets
