"""Decontamination speed: synthetic training prompts checked against 10k synthetic eval prompts
(ingest/decontaminate.py, the check combine_sources runs on every training prompt).

    .venv/bin/python bench/decontamination.py [--n 1000000] [--eval 10000] [--words 90]

Eval prompts are GSM8K-like (~50 words); training prompts are canonical messages JSON (a system
prompt and a user turn of about --words words, one in ten with an earlier user/assistant exchange),
built from a Zipf-weighted vocabulary of 20k words. 0.1% of the training prompts are planted eval
prompts (half verbatim, half embedded in a longer request): the run asserts every one is found.
Timed: building the index, and for each training prompt the same work as combine_sources
(user_texts on the messages JSON + EvalIndex.match); building the synthetic text is not timed.
Prints one JSON line: prompts/s, the projected time for 1M training prompts, peak RSS.
Use a small --n (e.g. 20000) for a quick check; the machine may be shared.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import sys
import time
from pathlib import Path

# bench/tokenize.py would shadow the standard library's tokenize (imported by inspect/linecache):
# run with the project root, not this folder, on the path
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

from eagle3_dagster.ingest.decontaminate import EvalIndex, user_texts

VOCAB = 20_000


def _sentence_pool(rng: random.Random, n: int, vocab: list[str], weights: list[float]) -> list[str]:
    out = []
    for _ in range(n):
        ws = rng.choices(vocab, weights, k=rng.randint(8, 20))
        out.append(" ".join(ws).capitalize() + rng.choice(".?!"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1_000_000, help="training prompts (default 1,000,000)")
    ap.add_argument("--eval", type=int, default=10_000, help="eval prompts (default 10,000)")
    ap.add_argument("--words", type=int, default=90, help="mean words of a training user turn (default 90)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    vocab = [f"w{i}" if i % 7 else str(i) for i in range(VOCAB)]  # words and numbers
    weights = [1 / (i + 1) for i in range(VOCAB)]
    pool = _sentence_pool(rng, 50_000, vocab, weights)
    evals = [" ".join(rng.sample(pool, 4)) for _ in range(args.eval)]

    t0 = time.perf_counter()
    index = EvalIndex()
    index.add_source("eval")
    for i, q in enumerate(evals):
        index.add("eval", f"{i:032x}", i + 1, [q])
    build_s = time.perf_counter() - t0

    per_prompt = max(1, args.words // 14)
    planted = found = 0
    timed = 0.0
    batch = 10_000
    for start in range(0, args.n, batch):
        msgs = []
        for j in range(start, min(start + batch, args.n)):
            if j % 1000 == 999:
                planted += 1
                q = evals[rng.randrange(len(evals))]
                text = q if j % 2000 == 999 else f"Please help with this. {q} Show all steps."
            else:
                text = f"Request {j}: " + " ".join(rng.sample(pool, rng.randint(per_prompt // 2, per_prompt * 3 // 2)))
            turns = [{"role": "system", "content": "You are a helpful assistant."}]
            if j % 10 == 0:
                turns += [{"role": "user", "content": "Hello."}, {"role": "assistant", "content": "Hi."}]
            turns.append({"role": "user", "content": text})
            msgs.append(json.dumps(turns, ensure_ascii=False, separators=(",", ":")))
        t = time.perf_counter()
        for m in msgs:
            if index.match(user_texts(m)) is not None:
                found += 1
        timed += time.perf_counter() - t
    assert found >= planted, (found, planted)
    rate = args.n / timed
    print(
        json.dumps(
            {
                "training_prompts": args.n,
                "eval_prompts": args.eval,
                "index_build_s": round(build_s, 2),
                "check_s": round(timed, 2),
                "prompts_per_s": round(rate),
                "projected_1m_s": round(1_000_000 / rate, 1),
                "planted": planted,
                "found": found,
                "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
