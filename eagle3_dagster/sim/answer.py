"""What SGLang writes for one item: `text`, `output_ids` and `meta_info` of a JSON answer or a stream chunk.

Built from an item's `Progress` (engine.py) and the server's state; the output bug modes and the fleet
faults that lie on the wire (fleet_faults.WIRE_LIES) are applied here, as the last step before sending.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from . import fleet_faults as FF
from . import protocol as P
from . import speculative as SP
from .engine import Progress
from .state import Sim

# SGLang 0.5.23 tokenizer_manager._INCREMENTAL_STREAMING_META_INFO_KEYS that the simulator sends: with
# --incremental-streaming-output each chunk carries only the new tokens' entries.
INCREMENTAL_META_KEYS = ("output_token_logprobs", "output_top_logprobs")


def _logprob(tok_id: int, pos: int) -> float:
    # Deterministic fake logprob in (-3, 0].
    return -((tok_id * 2654435761 + pos * 40503) % 3000) / 1000.0


def output_ids(sim: Sim, pr: Progress) -> list[Any]:
    """The ids produced so far as written: echo-prompt-tail prefixes prompt ids, a wire lie re-encodes one."""
    if sim.faults.mode == "echo-prompt-tail":
        # An SGLang bug (sglang #10896): the last prompt ids leak to the front of output_ids.
        return list(pr.item.input_ids[-sim.args.echo_tail_tokens :]) + list(pr.produced)
    return FF.lie_about_ids(list(pr.produced), pr.wire_lie)


def text(sim: Sim, pr: Progress, final: bool) -> str:
    trim = pr.plan.stop_trim if (final and pr.plan and pr.finish_reason == pr.plan.finish_reason) else 0
    stop_str = pr.plan.stop_str if (final and pr.plan) else None
    return P.render_text(sim.model, pr.produced, trim, pr.item.sampling, stop_str)


def meta(sim: Sim, pr: Progress, final: bool, stream: bool, since: int = 0) -> dict[str, Any]:
    """`meta_info` as SGLang 0.5.23 builds it; `since`: the per-token lists start at that token (deltas)."""
    m: dict[str, Any] = {"id": pr.item.rid, "finish_reason": pr.finish_reason if final else None}
    if not pr.queued_abort:
        m["prompt_tokens"] = len(pr.item.input_ids)
    m["weight_version"] = sim.fleet.weight_version
    # 0.5.23: a request aborted in the waiting queue is answered by _handle_abort_req, whose meta_info is
    # id, finish_reason, weight_version, e2e_latency, completion_tokens (tests/generate/test_sglang_responses.py)
    queued_0523 = pr.queued_abort and sim.version == P.V0_5_23
    if not queued_0523:
        m["total_retractions" if sim.version == P.V0_5_9 else "num_retractions"] = 0
    m["completion_tokens"] = len(pr.produced)
    if not pr.queued_abort:
        m["cached_tokens"] = pr.cached
    if sim.version == P.V0_5_23 and not queued_0523:
        m["reasoning_tokens"] = reasoning_tokens(sim, pr.produced) if sim.reasoning_parser else 0
    if pr.item.return_logprob:
        m.update(logprob_fields(sim, pr, since))
    if final:
        m["e2e_latency"] = time.time() - pr.started
        if (pr.spec or sim.spec).on and not pr.queued_abort:
            m.update(spec_meta(sim, pr))
        if sim.version == P.V0_5_23:
            # add_weight_versions_to_meta_info: the spans, and weight_version becomes the last span's
            m["weight_versions"] = weight_version_spans(sim, pr)
            m["weight_version"] = m["weight_versions"][-1]["version"]
    if (final and not stream) or (stream and not pr.first_sent):
        m["response_sent_to_client_ts"] = time.time()
    if final:
        m = FF.lie_about_finished_meta(m, pr.latency_lie, pr.meta_secret)
    return FF.lie_about_meta(m, pr.wire_lie)


def logprob_fields(sim: Sim, pr: Progress, since: int = 0) -> dict[str, Any]:
    """The logprob keys of `meta_info` (return_logprob, top_logprobs_num); from token `since` on in a delta."""
    m: dict[str, Any] = {"input_token_logprobs": []}
    m["output_token_logprobs"] = [[_logprob(t, i), t, None] for i, t in enumerate(pr.produced)]
    if sim.version == P.V0_5_23:
        m["output_token_logprobs_length"] = len(pr.produced)
    top = pr.item.top_logprobs_num
    if top:
        if sim.version == P.V0_5_23:
            m["input_top_logprobs"] = []
        vocab = sim.profile.vocab_size
        m["output_top_logprobs"] = [
            [[_logprob(t, i), t, None]] + [[_logprob(t + j, i) - 1.0, (t + j) % vocab, None] for j in range(1, top)]
            for i, t in enumerate(pr.produced)
        ]
    for k in INCREMENTAL_META_KEYS if since else ():
        if k in m:
            m[k] = m[k][since:]
    return m


def weight_version_spans(sim: Sim, pr: Progress) -> list[dict[str, Any]]:
    """Which weights generated which output tokens, as SGLang 0.5.23's compute_weight_version_spans +
    add_weight_versions_to_meta_info report them on a finished output (a queued abort: one empty span)."""
    n = len(pr.produced)
    marks = pr.versions or [(sim.fleet.weight_version, 0)]
    ends = [min(m[1], n) for m in marks[1:]] + [n]
    return [
        {"version": v, "start": start, "end": end} for (v, start), end in zip(marks, ends) if start < n or start == 0
    ]


def spec_meta(sim: Sim, pr: Progress) -> dict[str, Any]:
    """tokenizer_manager._calculate_spec_decoding_metrics' keys for a finished request (sim/speculative.py)."""
    ids = list(pr.produced)
    strings = [str(s) for s in sim.tok.convert_ids_to_tokens(ids)] if ids else []
    # the prompt's content class, read only when --draft-quality sets a quality per class
    content = SP.content_class(sim.tok.decode(list(pr.item.input_ids))) if sim.spec.by_class else None
    answer = SP.DraftedAnswer(ids, pr.item.input_ids, strings, pr.item.sampling.sampling_seed, content)
    out = SP.meta_fields(pr.spec or sim.spec, sim.profile, answer, scale=sim.fleet.spec_acceptance_scale)
    out = SP.make_inconsistent(out, pr.spec_fault) if pr.spec_fault else out
    if sim.fleet.spec_names_unknown:
        return SP.unknown_names(out)
    return SP.named_as(out, sim.spec.names)


def reasoning_tokens(sim: Sim, ids: Sequence[int]) -> int:
    te = sim.profile.think_end_id
    return ids.index(te) if te in ids else len(ids)


def body(sim: Sim, pr: Progress, return_prompt_ids: bool = False) -> dict[str, Any]:
    """A finished item's JSON answer."""
    d: dict[str, Any] = {
        "text": text(sim, pr, True),
        "output_ids": output_ids(sim, pr),
        "meta_info": meta(sim, pr, True, False),
    }
    if return_prompt_ids and sim.version == P.V0_5_23:
        d["prompt_token_ids"] = list(pr.item.input_ids)
    return d
