"""generate_shard over a shard of all_turns conversations, in its own process (killed by the tests).

    python tests/generate/multiturn_worker.py DATA_DIR URL [--flush-every-n 2]

DATA_DIR holds prompts/prompts.parquet and tokenized/part-0000.parquet (shard 0); the shard's
generations go to DATA_DIR/generations. Prints the ShardReport's `turns` as one JSON line at the end.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

_RENDERERS: dict[str, object] = {}  # one tokenizer load per process (the test calls run() several times)


def run(data: Path, url: str, flush_every_n: int) -> dict:
    from eagle3_dagster.generate import GenerationConfig, generate_shard
    from eagle3_dagster.generate.multiturn import load_multiturn
    from eagle3_dagster.profiles import load_profile
    from eagle3_dagster.tokenize.render import PromptRenderer

    root = Path(__file__).resolve().parents[2]  # the checkout
    profile = load_profile("kimi-k2.5", root / "assets" / "models").with_tokenizer(
        str(root.parent / "shared" / "tokenizers" / "kimi-k2.5")
    )
    renderer = _RENDERERS.get(profile.tokenizer) or _RENDERERS.setdefault(profile.tokenizer, PromptRenderer(profile))
    tokenized = data / "tokenized" / "part-0000.parquet"
    config = GenerationConfig.from_profile(
        profile, [url], max_new_tokens=512, flush_every_n=flush_every_n, flush_every_s=0.5, max_in_flight=4
    )
    mt = load_multiturn(
        data / "prompts" / "prompts.parquet", 0, tokenized, renderer=renderer, profile=profile, max_new_tokens=512
    )
    report = generate_shard(tokenized, data / "generations", config, progress_every_s=0, multiturn=mt)
    return report.turns or {}


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("url")
    ap.add_argument("--flush-every-n", type=int, default=2)
    a = ap.parse_args()
    print(json.dumps(run(Path(a.data), a.url, a.flush_every_n)), flush=True)
