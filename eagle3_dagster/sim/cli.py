"""`eagle3-sim` command line: flags, profile and tokenizer loading, serving until SIGTERM (drained).

The flags are listed by `eagle3-sim --help`; server.py's docstring describes the routes and faults.
Environment reads (the API key named by --api-key-env) go through sim/settings.py.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aiohttp import web

from ..profiles import ModelProfile, active_profile, load_profile
from . import protocol as P
from . import settings as sim_settings
from .deployment import Deployment
from .engine import Sim
from .faults import MODES
from .noncanonical import NonCanonicalSplitter, check_noncanonical_args

log = logging.getLogger("eagle3_dagster.sim")


class SimConfigError(Exception):
    """A command-line setting the simulator cannot run with."""


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


def load_tokenizer_for(profile: ModelProfile) -> Any:
    """The project's tokenizer loader when available (same rules as the tokenize stage), else plain
    transformers from the local folder; never remote code."""
    try:
        from ..tokenize import load_tokenizer
    except Exception:  # the tokenize package is optional for the simulator
        pass
    else:
        return load_tokenizer(profile.tokenizer, trust_remote_code=False)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(profile.tokenizer, trust_remote_code=False)


def resolve_profile(args: argparse.Namespace) -> ModelProfile:
    """--model (name or YAML) else the active profile; --tokenizer overrides the tokenizer folder."""
    from ..config import settings

    s = settings()  # EAGLE3_MODEL / EAGLE3_TOKENIZER / EAGLE3_ASSETS_DIR, read by the pipeline's settings module
    base = load_profile(args.model or s.model, s.models_dir)
    prof = base if args.model else active_profile(s.model, s.models_dir, s.tokenizer_override)
    if args.tokenizer:
        prof = prof.with_tokenizer(str(Path(args.tokenizer).expanduser().resolve()))
    if args.model_path is None:
        # Report the model's id, as SGLang reports --model-path, not the local tokenizer folder.
        args.model_path = base.tokenizer
    return prof


async def serve(args: argparse.Namespace) -> None:
    t0 = time.time()
    api_key = sim_settings.api_key_from_env(args.api_key_env)
    if args.api_key_env and not api_key:
        raise SimConfigError(f"--api-key-env {args.api_key_env}: that environment variable is empty or unset")
    check_noncanonical_args(args.noncanonical_rate, args.noncanonical_max_splits)  # before the slow tokenizer load
    Deployment(args.weight_version, args.reasoning_scale)  # bad flags fail before the tokenizer loads
    profile = resolve_profile(args)
    tok = load_tokenizer_for(profile)
    args.served_model_name = args.served_model_name or args.model_path
    args.model_type = "kimi_k25" if profile.template_family == "kimi_ts" else profile.name.replace("-", "_")
    args.architecture = (
        "KimiK25ForConditionalGeneration" if profile.template_family == "kimi_ts" else "Qwen3ForCausalLM"
    )
    sim = Sim(args, profile, tok, api_key=api_key)
    if args.seed is not None:
        sim.model.global_seed = args.seed
    if args.noncanonical_rate > 0:
        sim.model.splitter = NonCanonicalSplitter(tok, args.noncanonical_rate, max_splits=args.noncanonical_max_splits)
    log.info(
        "loaded profile %s (tokenizer %s) in %.1fs; version %s, mode %s",
        profile.name,
        profile.tokenizer,
        time.time() - t0,
        args.version,
        args.mode,
    )
    if args.loading_seconds > 0:
        # SGLang loads weights before uvicorn binds: clients see connection refused meanwhile.
        await asyncio.sleep(max(0.0, args.loading_seconds - (time.time() - t0)))
    sim.started_at = time.time()
    sim.ready_at = sim.started_at + args.starting_seconds
    from .server import build_app  # here: server.py re-exports this module's names

    app = build_app(sim)
    # handler_cancellation: a client disconnect cancels the work, as in SGLang. keepalive 5 s like
    # uvicorn's timeout_keep_alive, so clients meet server-closed pooled connections as in production.
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, keepalive_timeout=args.timeout_keep_alive)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port, reuse_address=True)
    await site.start()
    log.info(
        "The server is fired up and ready to roll! http://%s:%d (simulator, pid %d)", args.host, args.port, os.getpid()
    )

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_term() -> None:
        # Graceful shutdown: /health 503 at once, drain in-flight requests, then exit.
        sim.faults.health = "draining"
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_term)
    await stop.wait()
    deadline = time.monotonic() + args.drain_timeout
    while sim.in_flight and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    log.info("drained; shutting down")
    await runner.cleanup()


def main(argv: Sequence[str] | None = None) -> None:
    from ..config import apply_project_env_defaults

    apply_project_env_defaults()  # from a plain shell, as `eagle3`: the offline tokenizer under ../shared
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), stream=sys.stderr, format="[%(asctime)s] %(levelname)s sim: %(message)s"
    )
    sim_settings.quiet_transformers()
    try:
        asyncio.run(serve(args))
    except (OSError, ValueError, RuntimeError, SimConfigError) as e:  # profile/tokenizer/port: one line
        log.debug("startup failed", exc_info=True)
        log.error("%s: %s", type(e).__name__, e)
        sys.exit(2)


if __name__ == "__main__":
    main()
