"""`eagle3-sim` command line: its flags, as `eagle3-sim --help` lists them (server.py runs the process)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from . import protocol as P
from .faults import MODES


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="eagle3-sim", description="SGLang /generate simulator (no GPU).")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=30000)
    ap.add_argument("--model", default=None, help="profile name or YAML path (default: EAGLE3_MODEL / active profile)")
    ap.add_argument("--tokenizer", default=None, help="local tokenizer folder (default: profile, EAGLE3_TOKENIZER)")
    ap.add_argument("--mode", choices=MODES, default="normal")
    ap.add_argument("--version", choices=P.VERSIONS, default=P.V0_5_23)
    ap.add_argument("--api-key-env", default=None, help="name of the env var holding the API key")
    ap.add_argument("--seed", type=int, default=None, help="mixed into every prompt seed (default: none)")
    ap.add_argument("--token-latency-ms", "--slow-tokens-ms", dest="token_latency_ms", type=float, default=0.0)
    ap.add_argument("--prefill-ms-per-1k", type=float, default=0.0, help="prefill latency per 1000 uncached tokens")
    ap.add_argument("--max-running-requests", type=int, default=64, help="GPU slots")
    ap.add_argument("--max-queued-requests", type=int, default=None)
    ap.add_argument("--max-total-num-tokens", type=int, default=1_000_000, help="KV capacity reported and checked")
    ap.add_argument("--context-length", type=int, default=None, help="override the profile's context length")
    ap.add_argument(
        "--allow-auto-truncate",
        action="store_true",
        help="as SGLang's: cut an overlong prompt / lower max_new_tokens to fit instead of answering 400",
    )
    ap.add_argument("--stream-interval", type=int, default=1)
    ap.add_argument(
        "--incremental-streaming-output", "--stream-output", dest="incremental_streaming_output", action="store_true"
    )
    ap.add_argument("--reasoning-parser", default="auto", help="auto, none or a parser name (reasoning_tokens)")
    ap.add_argument("--tool-call-parser", default=None)
    ap.add_argument("--model-path", default=None, help="reported model_path (default: the profile's tokenizer id)")
    ap.add_argument("--served-model-name", default=None)
    ap.add_argument("--echo-tail-tokens", type=int, default=3)
    ap.add_argument("--tool-call-rate", type=float, default=0.6)
    ap.add_argument(
        "--noncanonical-rate",
        type=float,
        default=0.0,
        help="share of samples emitted with up to --noncanonical-max-splits non-canonical token splits "
        "(text unchanged; sim/noncanonical.py)",
    )
    ap.add_argument("--noncanonical-max-splits", type=int, default=3)
    ap.add_argument("--record-requests", default=None, help="append {rid, input_ids} per /generate item (tests)")
    ap.add_argument(
        "--output-tokens-mean",
        type=int,
        default=None,
        help="reasoning grown so outputs average about this many tokens (±25%%; long outputs, sim/model.py)",
    )
    ap.add_argument("--prefix-cache-nodes", type=int, default=2_000_000)
    ap.add_argument("--loading-seconds", type=float, default=0.0, help="do not bind for S seconds")
    ap.add_argument("--starting-seconds", type=float, default=0.0, help="/health 503 for S seconds after binding")
    ap.add_argument("--queue-full-burst", type=int, default=0)
    ap.add_argument("--reset-mid-body", type=int, default=0)
    ap.add_argument("--crash-after", type=int, default=0)
    ap.add_argument("--drain-timeout", type=float, default=30.0)
    ap.add_argument("--timeout-keep-alive", type=float, default=5.0, help="idle keep-alive close (s), as uvicorn")
    ap.add_argument("--log-level", default="INFO")
    ap.add_argument("--weight-version", default="default", help="reported weight_version (a new deployment)")
    # speculative decoding, named as SGLang's server args (sim/speculative.py)
    ap.add_argument(
        "--speculative-algorithm", default=None, help="EAGLE3, EAGLE, ... (default with a draft model: EAGLE3)"
    )
    ap.add_argument("--speculative-draft-model-path", "--speculative-draft-model", default=None)
    ap.add_argument("--speculative-draft-model-revision", default=None)
    ap.add_argument("--speculative-num-steps", type=int, default=None)
    ap.add_argument("--speculative-eagle-topk", type=int, default=None)
    ap.add_argument("--speculative-num-draft-tokens", type=int, default=None)
    ap.add_argument(
        "--reasoning-scale",
        type=float,
        default=1.0,
        help="keep this fraction of each reasoning passage (0.2: ~5x shorter; sim/deployment.py)",
    )
    return ap.parse_args(argv)
