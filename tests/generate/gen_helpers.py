"""Helpers for the generation tests (imported by name: tests/generate is on sys.path)."""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import polars as pl
from sim_ctl import Sim as Sim  # re-exported for the tests

from eagle3_dagster import schemas
from eagle3_dagster.generate import GenerationConfig
from eagle3_dagster.sim.process import free_port as free_port  # re-exported for the tests

KIMI_EOS = 163586


def make_prompts(n: int, *, shard: int = 0, seed: int = 7, template_hash: str = "tmpl-a") -> pl.DataFrame:
    """A TOKENIZED_PROMPTS frame with short, distinct prompts (ids well inside the Kimi vocab)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        ids = [rng.randrange(1000, 150000) for _ in range(rng.randrange(4, 24))]
        rows.append(
            {
                "prompt_id": f"p{seed}-{i:06d}",
                "source": "unit",
                "shard": shard,
                "input_ids": ids,
                "prompt_len": len(ids),
                "profile": "kimi-k2.5",
                "tokenizer_fingerprint": "tf",
                "template_hash": template_hash,
                "control_text_in_content": False,
            }
        )
    return pl.from_arrow(pl.DataFrame(rows).to_arrow().cast(schemas.TOKENIZED_PROMPTS))  # type: ignore[return-value]


def make_config(*urls: str, **overrides: Any) -> GenerationConfig:
    base: dict[str, Any] = dict(
        endpoints=tuple(urls),
        max_new_tokens=24,
        temperature=1.0,
        top_p=0.95,
        stop_token_ids=(KIMI_EOS,),
        max_in_flight=8,
        backoff_base_s=0.02,
        backoff_max_s=0.2,
        probe_interval_s=0.1,
        health_interval_s=1.0,
        flush_every_n=8,
        flush_every_s=0.5,
        vocab_size=163840,
    )
    base.update(overrides)
    return GenerationConfig(**base)


def as_map(df: pl.DataFrame) -> dict[str, list[int]]:
    return {r["sample_id"]: r["output_ids"] for r in df.select("sample_id", "output_ids").iter_rows(named=True)}


def start_mini_router(worker: str, *args: str) -> tuple[subprocess.Popen, str]:
    """tests/generate/mini_router.py in front of `worker`, once it answers: (its process, its URL)."""
    port = free_port()
    p = subprocess.Popen(
        [sys.executable, str(Path(__file__).parent / "mini_router.py"), "--port", str(port), "--worker", worker, *args]
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            httpx.get(url + "/liveness", timeout=0.5)
            return p, url
        except httpx.HTTPError:
            time.sleep(0.05)
    p.kill()
    p.wait()
    raise TimeoutError("router did not start")
