"""Helpers for the simulator tests (imported by name: tests/sim is on sys.path)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from sim_ctl import HTTP

from eagle3_dagster.sim.process import SimProcess

KIMI_EOS = 163586
KIMI_THINK_END = 163607

SHARED = Path(__file__).resolve().parents[2].parent / "shared"
KIMI_DIR = str(SHARED / "tokenizers" / "kimi-k2.5")
QWEN_DIR = str(SHARED / "tokenizers" / "qwen3")

# Small context and KV capacity so length checks can be hit with short prompts.
CONTEXT = 8192
KV_TOKENS = 6000  # -> max_req_input_len = min(8191, 5999) - 5 = 5994
KIMI_ARGS = [
    "--model",
    "kimi-k2.5",
    "--tokenizer",
    KIMI_DIR,
    "--context-length",
    str(CONTEXT),
    "--max-total-num-tokens",
    str(KV_TOKENS),
]
QWEN_ARGS = ["--model", "qwen3", "--tokenizer", QWEN_DIR]


def chat_ids(tok: Any, text: str, **kw: Any) -> list[int]:
    return list(
        tok.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=False, **kw
        )
    )


def gen(
    s: SimProcess, body: Any, *, timeout: float = 30, method: str = "POST", headers: dict[str, str] | None = None
) -> httpx.Response:
    return HTTP.request(method, s.url + "/generate", json=body, timeout=timeout, headers=headers)


def sse_events(text: str) -> list[str]:
    """Split an SSE body into the payloads of its `data: ` lines (asserting the framing)."""
    assert text.endswith("\n\n"), text[-200:]
    events = text.split("\n\n")[:-1]
    out = []
    for e in events:
        assert e.startswith("data: ") and "\n" not in e, e[:200]
        out.append(e[len("data: ") :])
    return out


def faults(s: SimProcess, **kw: Any) -> dict[str, Any]:
    r = HTTP.post(s.url + "/_sim/faults", json=kw, timeout=5)
    r.raise_for_status()
    return r.json()


def stats(s: SimProcess, **params: Any) -> dict[str, Any]:
    r = HTTP.get(s.url + "/_sim/stats", params=params, timeout=5)
    r.raise_for_status()
    return r.json()
