"""The `eagle3-sim` process: profile and tokenizer loading, binding, serving until SIGTERM (drained).

`python -m eagle3_dagster.sim.server` (process.py starts it so) and the `eagle3-sim` command run `main`;
the flags are in cli.py (`eagle3-sim --help`), the routes and faults in app.py. Environment reads (the API
key named by --api-key-env) go through sim/settings.py.
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

from aiohttp import web

from ..config import apply_project_env_defaults, settings
from ..profiles import ModelProfile, active_profile, load_profile
from ..tokenize.loading import load_tokenizer
from . import settings as sim_settings
from .app import build_app
from .cli import parse_args
from .deployment import Deployment
from .noncanonical import NonCanonicalSplitter, check_noncanonical_args
from .state import Sim

log = logging.getLogger("eagle3_dagster.sim")


class SimConfigError(Exception):
    """A command-line setting the simulator cannot run with."""


def resolve_profile(args: argparse.Namespace) -> ModelProfile:
    """--model (name or YAML) else the active profile; --tokenizer overrides the tokenizer folder."""
    s = settings()  # EAGLE3_MODEL / EAGLE3_TOKENIZER / EAGLE3_ASSETS_DIR, read by the pipeline's settings module
    base = load_profile(args.model or s.model.name, s.storage.models_dir)
    prof = base if args.model else active_profile(s.model.name, s.storage.models_dir, s.model.tokenizer_override)
    if args.tokenizer:
        prof = prof.with_tokenizer(str(Path(args.tokenizer).expanduser().resolve()))
    if args.model_path is None:
        # Report the model's id, as SGLang reports --model-path, not the local tokenizer folder.
        args.model_path = base.tokenizer
    return prof


def load_sim(args: argparse.Namespace) -> Sim:
    """The server's state from its flags: the profile, its tokenizer (the project's loader, never remote
    code), the names it reports. Bad flags fail before the slow tokenizer load."""
    t0 = time.time()
    api_key = sim_settings.api_key_from_env(args.api_key_env)
    if args.api_key_env and not api_key:
        raise SimConfigError(f"--api-key-env {args.api_key_env}: that environment variable is empty or unset")
    check_noncanonical_args(args.noncanonical_rate, args.noncanonical_max_splits)
    Deployment(args.weight_version, args.reasoning_scale)
    profile = resolve_profile(args)
    tok = load_tokenizer(profile.tokenizer, trust_remote_code=False)
    kimi = profile.template_family == "kimi_ts"
    args.served_model_name = args.served_model_name or args.model_path
    args.model_type = args.model_type or profile.model_types[0]  # the profile's model, unless told to claim another
    args.architecture = "KimiK25ForConditionalGeneration" if kimi else "Qwen3ForCausalLM"
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
    return sim


async def serve(args: argparse.Namespace) -> None:
    t0 = time.time()
    sim = load_sim(args)
    if args.loading_seconds > 0:
        # SGLang loads weights before uvicorn binds: clients see connection refused meanwhile.
        await asyncio.sleep(max(0.0, args.loading_seconds - (time.time() - t0)))
    sim.started_at = time.time()
    sim.ready_at = sim.started_at + args.starting_seconds
    # handler_cancellation: a client disconnect cancels the work, as in SGLang. keepalive 5 s like
    # uvicorn's timeout_keep_alive, so clients meet server-closed pooled connections as in production.
    runner = web.AppRunner(
        build_app(sim), handler_cancellation=True, access_log=None, keepalive_timeout=args.timeout_keep_alive
    )
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port, reuse_address=True)
    await site.start()
    log.info(
        "The server is fired up and ready to roll! http://%s:%d (simulator, pid %d)", args.host, args.port, os.getpid()
    )
    await until_terminated(sim)
    deadline = time.monotonic() + args.drain_timeout
    while sim.in_flight and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    log.info("drained; shutting down")
    await runner.cleanup()


async def until_terminated(sim: Sim) -> None:
    """Wait for SIGTERM or SIGINT; from then on /health answers 503 (draining) while in-flight requests finish."""
    stop = asyncio.Event()

    def on_term() -> None:
        sim.faults.health = "draining"
        stop.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_term)
    await stop.wait()


def main(argv: Sequence[str] | None = None) -> None:
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
