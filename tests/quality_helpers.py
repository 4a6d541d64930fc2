"""Small, realistic frames for the gate, report and publish tests: real Kimi ids from the real tokenizer
(the `kimi` and `gx_dirs` fixtures in tests/conftest.py)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import polars as pl
import pyarrow as pa

from eagle3_dagster import schemas
from eagle3_dagster.config import PROJECT_ROOT

EXPECTATIONS_DIR = PROJECT_ROOT / "expectations"


def frame(schema: pa.Schema, rows: list[dict[str, Any]]) -> pl.DataFrame:
    """A polars frame with exactly the table contract's columns and types (missing fields null)."""
    cols = {f.name: [r.get(f.name) for r in rows] for f in schema}
    return pl.from_arrow(pa.table(cols, schema=schema))  # type: ignore[return-value]


class Kimi:
    """Builds Kimi-K2.5 prompts and outputs as the real tokenizer and server would produce them."""

    def __init__(self, tok: Any, profile: Any) -> None:
        self.tok, self.p = tok, profile

    def enc(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False)

    def prompt(self, text: str) -> list[int]:
        return list(
            self.tok.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=False
            )
        )

    def output(
        self,
        reasoning: str,
        answer: str,
        *,
        tool: tuple[str, str] | None = None,
        think_end: bool = True,
        eot: bool = True,
    ) -> list[int]:
        t = self.p.tool_call_ids
        ids = self.enc(reasoning) + ([self.p.think_end_id] if think_end else []) + (self.enc(answer) if answer else [])
        if tool:
            name, args = tool
            ids += [
                t.section_begin,
                t.call_begin,
                *self.enc(name),
                t.argument_begin,
                *self.enc(args),
                t.call_end,
                t.section_end,
            ]
        return ids + ([self.p.end_of_turn_id] if eot else [])


def tokenized_rows(kimi: Kimi, prompts: dict[str, str], source: str = "gsm8k") -> pl.DataFrame:
    rows = []
    for pid, text in prompts.items():
        ids = kimi.prompt(text)
        rows.append(
            dict(
                prompt_id=pid,
                source=source,
                shard=0,
                input_ids=ids,
                prompt_len=len(ids),
                profile="kimi-k2.5",
                tokenizer_fingerprint="t",
                template_hash="h",
            )
        )
    return frame(schemas.TOKENIZED_PROMPTS, rows)


def generation_rows(samples: list[dict[str, Any]]) -> pl.DataFrame:
    """samples: dicts with sample_id, prompt_id, output_ids and optional overrides."""
    rows = []
    for s in samples:
        ids = s["output_ids"]
        rows.append(
            dict(
                sample_id=s["sample_id"],
                prompt_id=s["prompt_id"],
                source=s.get("source", "gsm8k"),
                shard=0,
                rid="r-" + s["sample_id"],
                output_ids=ids,
                text=None,
                finish_reason=s.get("finish_reason", "stop"),
                finish_matched=s.get("finish_matched"),
                prompt_tokens=10,
                completion_tokens=s.get("completion_tokens", len(ids)),
                cached_tokens=0,
                e2e_latency=0.1,
                meta_info="{}",
                endpoint="http://sim",
                model_revision="m",
                template_hash="h",
                sampling_hash="s",
                integrity_violations=[],
                generated_at=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
            )
        )
    return frame(schemas.GENERATIONS, rows)


def training_rows(samples: list[dict[str, Any]]) -> pl.DataFrame:
    """samples: dicts with sample_id, prompt_ids, output_ids; optional loss_mask/source/length overrides."""
    rows = []
    for s in samples:
        p, o = s["prompt_ids"], s["output_ids"]
        ids = p + o
        rows.append(
            dict(
                sample_id=s["sample_id"],
                prompt_id=s.get("prompt_id", "p"),
                source=s.get("source", "gsm8k"),
                input_ids=s.get("input_ids", ids),
                loss_mask=s.get("loss_mask", [0] * len(p) + [1] * len(o)),
                prompt_len=s.get("prompt_len", len(p)),
                output_len=s.get("output_len", len(o)),
                total_len=s.get("total_len", len(ids)),
                model_revision="m",
                template_hash="h",
                tokenizer_fingerprint="t",
                sampling_hash="s",
                endpoint="http://sim",
                finish_reason="stop",
                generated_at=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
            )
        )
    return frame(schemas.TRAINING_SAMPLES, rows)
