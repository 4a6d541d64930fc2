"""Helpers for the generation tests (imported by name: tests/generate is on sys.path)."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import httpx
import polars as pl

from eagle3_dagster import schemas
from eagle3_dagster.config import PROJECT_ROOT
from eagle3_dagster.generate import GenerationConfig
from eagle3_dagster.sim.process import SimProcess, free_port, start_simulator

KIMI_TOKENIZER_DIR = (PROJECT_ROOT.parent / "shared" / "tokenizers" / "kimi-k2.5").resolve()
KIMI_EOS = 163586


class Sim:
    """The real simulator process (eagle3_dagster.sim.process) plus fault / stats helpers."""

    def __init__(self, port: int | None = None, extra_args: tuple[str, ...] = (), env: dict[str, str] | None = None,
                 log_path: Path | None = None, wait: bool = True) -> None:
        args = ("--model", "kimi-k2.5", "--tokenizer", str(KIMI_TOKENIZER_DIR), "--log-level", "WARNING", *extra_args)
        self.env = env
        self.sp: SimProcess = start_simulator(port=port, extra_args=args, env=env, wait_for="none",
                                              log_dir=log_path.parent if log_path else None)
        if wait:
            self.wait_ready()

    @property
    def url(self) -> str:
        return self.sp.url

    @property
    def proc(self):  # noqa: ANN201
        return self.sp.proc

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.sp.alive():
                raise RuntimeError(f"simulator exited:\n{self.sp.log_tail()}")
            try:
                if httpx.get(self.url + "/model_info", headers=self._auth(), timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise TimeoutError("simulator did not come up")

    def start(self) -> None:
        """Start again on the same port (after a crash or a kill)."""
        self.sp.fixed_port = self.sp.port
        self.sp.start()

    def faults(self, **faults: Any) -> dict[str, Any]:
        return httpx.post(self.url + "/_sim/faults", json=faults, headers=self._auth(), timeout=5).json()

    def stats(self, rids: bool = False) -> dict[str, Any]:
        return httpx.get(self.url + "/_sim/stats" + ("?rids=1" if rids else ""), headers=self._auth(), timeout=5).json()

    def _auth(self) -> dict[str, str]:
        key = (self.env or {}).get("SIM_TEST_KEY")
        return {"Authorization": f"Bearer {key}"} if key else {}

    def kill(self) -> None:
        self.sp.kill()


def make_prompts(n: int, *, shard: int = 0, seed: int = 7, template_hash: str = "tmpl-a") -> pl.DataFrame:
    """A TOKENIZED_PROMPTS frame with short, distinct prompts (ids well inside the Kimi vocab)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        ids = [rng.randrange(1000, 150000) for _ in range(rng.randrange(4, 24))]
        rows.append({
            "prompt_id": f"p{seed}-{i:06d}", "source": "unit", "shard": shard, "input_ids": ids,
            "prompt_len": len(ids), "profile": "kimi-k2.5", "tokenizer_fingerprint": "tf", "template_hash": template_hash,
        })
    return pl.from_arrow(pl.DataFrame(rows).to_arrow().cast(schemas.TOKENIZED_PROMPTS))  # type: ignore[return-value]


def make_config(*urls: str, **overrides: Any) -> GenerationConfig:
    base: dict[str, Any] = dict(
        endpoints=tuple(urls), max_new_tokens=24, temperature=1.0, top_p=0.95, stop_token_ids=(KIMI_EOS,),
        max_in_flight=8, backoff_base_s=0.02, backoff_max_s=0.2, probe_interval_s=0.1, health_interval_s=1.0,
        flush_every_n=8, flush_every_s=0.5, vocab_size=163840,
    )
    base.update(overrides)
    return GenerationConfig(**base)


def as_map(df: pl.DataFrame) -> dict[str, list[int]]:
    return {r["sample_id"]: r["output_ids"] for r in df.select("sample_id", "output_ids").iter_rows(named=True)}
