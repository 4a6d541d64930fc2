"""What one running simulated server knows: its settings, limits, faults, counters, prefix cache and in-flight requests.

`Sim` is read and changed by the engine (a request in time), the routes and the admin routes; it holds no
behaviour beyond its own bookkeeping (GPU slots held, lifecycle state, busy time).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from ..profiles import ModelProfile
from . import fleet_faults as FF
from . import speculative as SP
from .cache import PrefixTrie
from .deployment import Deployment
from .faults import Faults
from .model import OutputModel
from .record import RequestRecorder
from .stats import Stats


@dataclass
class ReqState:
    rid: str
    abort: asyncio.Event = field(default_factory=asyncio.Event)
    slot_since: float | None = None  # monotonic time the request took a GPU slot; None while it holds none


class Sim:
    def __init__(
        self, args: argparse.Namespace, profile: ModelProfile, tokenizer: Any, api_key: str | None = None
    ) -> None:
        self.args = args
        self.version: str = args.version
        self.profile = profile
        self.tok = tokenizer
        self.model = OutputModel(tokenizer, profile, tool_call_rate=args.tool_call_rate)
        self.model.output_tokens_mean = getattr(args, "output_tokens_mean", None)
        self.spec = SP.spec_config(args)  # --speculative-*: a drafter (sim/speculative.py)
        # the release reported in /server_info `version`: the one whose figure names it speaks (--spec-names)
        self.release: str = getattr(args, "spec_names", None) or self.version
        # --record-requests FILE: one JSON line per item run (sim/record.py), for tests
        self.recorder = RequestRecorder(args.record_requests) if getattr(args, "record_requests", None) else None
        # --weight-version / --reasoning-scale: a changed deployment (sim/deployment.py)
        self.deployment = Deployment(getattr(args, "weight_version", "default"), getattr(args, "reasoning_scale", 1.0))
        self.model.shape_reasoning = self.deployment.shape_reasoning
        self.context_length: int = args.context_length or profile.context_length
        self.max_total_num_tokens: int = args.max_total_num_tokens
        # --allow-auto-truncate: an overlong request is cut to fit instead of answered 400 (protocol.context_checks)
        self.allow_auto_truncate: bool = bool(getattr(args, "allow_auto_truncate", False))
        self.max_req_len = min(self.context_length - 1, self.max_total_num_tokens - 1)  # SGLang tp_worker
        self.max_req_input_len = self.max_req_len - 5
        self.eos_ids = tuple(profile.stop_token_ids)
        self.api_key = api_key  # from sim/settings.py (the variable --api-key-env names); never logged
        self.faults = Faults(
            queue_full_burst=args.queue_full_burst,
            reset_mid_body=args.reset_mid_body,
            crash_after=args.crash_after,
            slow_tokens_ms=args.token_latency_ms,
            prefill_ms_per_1k=args.prefill_ms_per_1k,
            mode=args.mode,
        )
        self.stats = Stats()
        # fleet-level faults (fleet_faults.py); --weight-version is the starting version
        self.fleet = FF.FleetFaults(weight_version=self.deployment.weight_version)
        self.trie = PrefixTrie(args.prefix_cache_nodes)
        self.in_flight: dict[str, ReqState] = {}
        self.slots = asyncio.Semaphore(args.max_running_requests)
        self.running = 0
        self.waiting = 0
        self._busy_since: float | None = None
        self.started_at = time.time()
        self.ready_at = self.started_at + args.starting_seconds
        self.reasoning_parser = reasoning_parser_name(args.reasoning_parser, profile)

    def health_state(self) -> str:
        if self.faults.health != "ok":
            return self.faults.health
        return "starting" if time.time() < self.ready_at else "ok"

    def slot_acquired(self) -> None:
        if self.running == 0:
            self._busy_since = time.monotonic()
        self.running += 1
        self.stats.peak_running = max(self.stats.peak_running, self.running)

    def slot_released(self) -> None:
        self.running -= 1
        if self.running == 0 and self._busy_since is not None:
            self.stats.busy_seconds += time.monotonic() - self._busy_since
            self._busy_since = None

    def busy_seconds(self) -> float:
        extra = time.monotonic() - self._busy_since if self._busy_since is not None else 0.0
        return self.stats.busy_seconds + extra


def reasoning_parser_name(flag: str, profile: ModelProfile) -> str | None:
    """--reasoning-parser as the server reports it: `auto` picks the profile's parser, `none` is no parser."""
    if flag == "auto":
        return "kimi_k2" if profile.template_family == "kimi_ts" else "qwen3"
    return None if flag == "none" else flag
