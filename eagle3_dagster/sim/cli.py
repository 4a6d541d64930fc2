"""`eagle3-sim` command line: its flags, as `eagle3-sim --help` lists them (server.py runs the process)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from . import protocol as P
from . import speculative as SP
from .faults import MODES


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="eagle3-sim", description="SGLang /generate simulator (no GPU).")
    for add in (_server_flags, _capacity_flags, _model_flags, _fault_flags, _speculative_flags):
        add(ap)
    return ap.parse_args(argv)


def _server_flags(ap: argparse.ArgumentParser) -> None:
    """What the server reports, how it streams, logs and goes through its lifecycle."""
    g = ap.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1")
    g.add_argument("--port", type=int, default=30000)
    g.add_argument("--version", choices=P.VERSIONS, default=P.V0_5_23)
    g.add_argument("--api-key-env", default=None, help="name of the env var holding the API key")
    g.add_argument("--model-path", default=None, help="reported model_path (default: the profile's tokenizer id)")
    g.add_argument(
        "--model-type", default=None, help="reported /model_info model_type (default: the profile's first model_types)"
    )
    g.add_argument("--served-model-name", default=None)
    g.add_argument("--reasoning-parser", default="auto", help="auto, none or a parser name (reasoning_tokens)")
    g.add_argument("--tool-call-parser", default=None)
    g.add_argument("--stream-interval", type=int, default=1)
    g.add_argument(
        "--incremental-streaming-output", "--stream-output", dest="incremental_streaming_output", action="store_true"
    )
    g.add_argument("--log-level", default="INFO")
    g.add_argument("--drain-timeout", type=float, default=30.0)
    g.add_argument("--timeout-keep-alive", type=float, default=5.0, help="idle keep-alive close (s), as uvicorn")
    g.add_argument("--loading-seconds", type=float, default=0.0, help="do not bind for S seconds")
    g.add_argument("--starting-seconds", type=float, default=0.0, help="/health 503 for S seconds after binding")


def _capacity_flags(ap: argparse.ArgumentParser) -> None:
    """The emulated GPU: slots, queue, KV capacity, context, prefix cache, latency."""
    g = ap.add_argument_group("capacity and timing")
    g.add_argument("--max-running-requests", type=int, default=64, help="GPU slots")
    g.add_argument("--max-queued-requests", type=int, default=None)
    g.add_argument("--max-total-num-tokens", type=int, default=1_000_000, help="KV capacity reported and checked")
    g.add_argument("--context-length", type=int, default=None, help="override the profile's context length")
    g.add_argument(
        "--allow-auto-truncate",
        action="store_true",
        help="as SGLang's: cut an overlong prompt / lower max_new_tokens to fit instead of answering 400",
    )
    g.add_argument("--prefix-cache-nodes", type=int, default=2_000_000)
    g.add_argument("--token-latency-ms", "--slow-tokens-ms", dest="token_latency_ms", type=float, default=0.0)
    g.add_argument("--prefill-ms-per-1k", type=float, default=0.0, help="prefill latency per 1000 uncached tokens")


def _model_flags(ap: argparse.ArgumentParser) -> None:
    """What the simulated model says: profile, tokenizer, seed, output shapes, a changed deployment."""
    g = ap.add_argument_group("model")
    g.add_argument("--model", default=None, help="profile name or YAML path (default: EAGLE3_MODEL / active profile)")
    g.add_argument("--tokenizer", default=None, help="local tokenizer folder (default: profile, EAGLE3_TOKENIZER)")
    g.add_argument("--seed", type=int, default=None, help="mixed into every prompt seed (default: none)")
    g.add_argument("--tool-call-rate", type=float, default=0.6)
    g.add_argument(
        "--output-tokens-mean",
        type=int,
        default=None,
        help="reasoning grown so outputs average about this many tokens (±25%%; long outputs, sim/model.py)",
    )
    g.add_argument(
        "--noncanonical-rate",
        type=float,
        default=0.0,
        help="share of samples emitted with up to --noncanonical-max-splits non-canonical token splits "
        "(text unchanged; sim/noncanonical.py)",
    )
    g.add_argument("--noncanonical-max-splits", type=int, default=3)
    g.add_argument("--weight-version", default="default", help="reported weight_version (a new deployment)")
    g.add_argument(
        "--reasoning-scale",
        type=float,
        default=1.0,
        help="keep this fraction of each reasoning passage (0.2: ~5x shorter; sim/deployment.py)",
    )
    g.add_argument("--record-requests", default=None, help="append {rid, input_ids} per /generate item (tests)")


def _fault_flags(ap: argparse.ArgumentParser) -> None:
    """Output bug modes and the server-level faults armed at start (POST /_sim/faults arms them live)."""
    g = ap.add_argument_group("faults")
    g.add_argument("--mode", choices=MODES, default="normal")
    g.add_argument("--echo-tail-tokens", type=int, default=3)
    g.add_argument("--queue-full-burst", type=int, default=0)
    g.add_argument("--reset-mid-body", type=int, default=0)
    g.add_argument("--crash-after", type=int, default=0)


def _speculative_flags(ap: argparse.ArgumentParser) -> None:
    """Speculative decoding, named as SGLang's server args (sim/speculative.py)."""
    g = ap.add_argument_group("speculative decoding")
    g.add_argument(
        "--speculative-algorithm", default=None, help="EAGLE3, EAGLE, ... (default with a draft model: EAGLE3)"
    )
    g.add_argument("--speculative-draft-model-path", "--speculative-draft-model", default=None)
    g.add_argument("--speculative-draft-model-revision", default=None)
    g.add_argument("--speculative-num-steps", type=int, default=None)
    g.add_argument("--speculative-eagle-topk", type=int, default=None)
    g.add_argument("--speculative-num-draft-tokens", type=int, default=None)
    g.add_argument(
        "--spec-names",
        choices=tuple(SP.SPEC_NAMES),
        default=None,
        help="the SGLang release whose names the acceptance figures go under, also reported as /server_info "
        "version (default: the --version profile's; the protocol stays that profile's)",
    )
    g.add_argument(
        "--ragged-verify-mode",
        choices=SP.RAGGED_VERIFY_MODES,
        default="static",
        help="SGLANG_RAGGED_VERIFY_MODE: cap-accept / compact cap each verify step and add the cap figures "
        "(spec_cap_length, spec_cap_lens_histogram; cap-accept: spec_block_accept_length); 0.5.18 and later",
    )
    g.add_argument(
        "--draft-quality",
        type=SP.parse_draft_quality,
        default=None,
        metavar="Q | CLASS=Q,...",
        help="the simulated drafter's quality in (0, 1.5], one number or per content class of the prompt (code, "
        "math, prose, * for the rest), e.g. code=0.97,prose=0.82 (default: drawn from the draft model's name)",
    )
