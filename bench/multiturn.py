"""Benchmark: a shard of all_turns conversations vs the same number of single-turn requests.

Against one simulator with per-token latency (`--token-latency-ms`) and a bounded server batch
(`--max-running-requests`), in one run:

- multiturn: generate_shard over C conversations of T user turns each (regenerate: all_turns,
  generate/multiturn.py): turn k+1 of a conversation is sent only when its turn k is back, while
  other conversations' turns keep the server's slots busy;
- single:    generate_shard over as many single-turn prompts as the multiturn run sent requests.

If the rounds left the server idle (waiting for a whole round), multiturn would take up to T times
longer; the target is multiturn / single <= 1.15. Prints human-readable lines, then one JSON object
on the LAST line with `ratio` and the timings.

    .venv/bin/python bench/multiturn.py [--conversations 48] [--turns 3] [--token-latency-ms 2]
                                        [--max-running-requests 8]
"""

from __future__ import annotations

import sys
from pathlib import Path

# `python bench/multiturn.py` puts bench/ first on sys.path, where bench/tokenize.py would shadow the
# standard library module: drop it before anything is imported.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse
import json
import random
import tempfile
import time

import polars as pl

from eagle3_dagster.config import PROJECT_ROOT
from eagle3_dagster.generate import GenerationConfig, generate_shard
from eagle3_dagster.generate.multiturn import Conversation, MultiTurn
from eagle3_dagster.profiles import load_profile
from eagle3_dagster.sim.process import start_simulator
from eagle3_dagster.tokenize.render import PromptRenderer

SHARED_TOKENIZER = PROJECT_ROOT.parent / "shared" / "tokenizers" / "kimi-k2.5"
WORDS = [
    "the",
    "river",
    "model",
    "token",
    "draft",
    "accept",
    "verify",
    "cache",
    "prompt",
    "answer",
    "reason",
    "tool",
    "weather",
    "city",
]


def _question(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 30))) + "?"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--conversations", type=int, default=96)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--token-latency-ms", type=float, default=1.0)
    ap.add_argument("--max-running-requests", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=2048)
    args = ap.parse_args(argv)

    profile = load_profile("kimi-k2.5", PROJECT_ROOT / "assets" / "models").with_tokenizer(str(SHARED_TOKENIZER))
    renderer = PromptRenderer(profile)
    rng = random.Random(0)
    convs: list[Conversation] = []
    rows = []
    for c in range(args.conversations):
        messages: list[dict] = []
        for _ in range(args.turns):
            messages.append({"role": "user", "content": _question(rng)})
            messages.append({"role": "assistant", "content": "dataset answer " + _question(rng)})
        turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        first = renderer.render(messages[: turns[0]])
        assert first.ok and first.input_ids is not None
        cid = f"{c:032x}"
        convs.append(Conversation(cid, messages, None, None, turns, first.input_ids, template_hash="bench"))
        rows.append({"prompt_id": cid, "input_ids": first.input_ids, "template_hash": "bench", "source": "bench"})
    conv_tok = pl.DataFrame(rows, schema_overrides={"input_ids": pl.List(pl.Int32)})
    sim_args = [
        "--model",
        "kimi-k2.5",
        "--tokenizer",
        str(SHARED_TOKENIZER),
        "--token-latency-ms",
        str(args.token_latency_ms),
        "--max-running-requests",
        str(args.max_running_requests),
        "--tool-call-rate",
        "0",  # no tool calls: every conversation runs all its turns (a mismatch would end it early)
        "--log-level",
        "WARNING",
    ]
    with start_simulator(extra_args=sim_args) as sim, tempfile.TemporaryDirectory() as tmp:
        config = GenerationConfig.from_profile(profile, [sim.url], max_new_tokens=args.max_new_tokens)
        mt = MultiTurn(convs, renderer=renderer, profile=profile, max_new_tokens=args.max_new_tokens)
        # warm-up (connections, the simulator's first requests), not timed
        warm = pl.DataFrame(
            [{"prompt_id": "w" * 32, "input_ids": convs[0].first_ids, "template_hash": "warm"}],
            schema_overrides={"input_ids": pl.List(pl.Int32)},
        )
        generate_shard(warm, Path(tmp) / "warm", config, progress_every_s=0)
        t0 = time.perf_counter()
        rep = generate_shard(conv_tok, Path(tmp) / "multi", config, progress_every_s=0, multiturn=mt)
        multi_s = time.perf_counter() - t0
        assert rep.turns is not None and rep.turns["reconciles"], rep.turns
        n = rep.turns["turns_sent"]
        print(f"multiturn: {args.conversations} conversations x {args.turns} turns: {n} requests in {multi_s:.2f} s")
        print(f"  turns: {json.dumps({k: v for k, v in rep.turns.items() if k != 'rows_by_turn'})}")

        single = []
        for i in range(n):
            r = renderer.render([{"role": "user", "content": _question(rng)}])
            assert r.ok
            single.append({"prompt_id": f"s{i:031x}", "input_ids": r.input_ids, "template_hash": "bench"})
        single_tok = pl.DataFrame(single, schema_overrides={"input_ids": pl.List(pl.Int32)})
        t0 = time.perf_counter()
        rep1 = generate_shard(single_tok, Path(tmp) / "single", config, progress_every_s=0)
        single_s = time.perf_counter() - t0
        print(f"single:    {rep1.succeeded} requests in {single_s:.2f} s")
        out_multi = rep.output_tokens
        out_single = rep1.output_tokens
    ratio = multi_s / single_s
    print(f"ratio multiturn / single: {ratio:.3f} (target <= 1.15)")
    print(
        json.dumps(
            {
                "ratio": round(ratio, 3),
                "multiturn_s": round(multi_s, 3),
                "single_s": round(single_s, 3),
                "requests": n,
                "conversations": args.conversations,
                "turns": args.turns,
                "output_tokens_multiturn": out_multi,
                "output_tokens_single": out_single,
                "token_latency_ms": args.token_latency_ms,
                "max_running_requests": args.max_running_requests,
                "target": 1.15,
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
