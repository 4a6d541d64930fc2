"""The simulator's speculative decoding: a named drafter whose acceptance depends on what is generated.

Started with SGLang's own server args (`--speculative-algorithm EAGLE3 --speculative-draft-model-path NAME
--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4`), the simulator
reports them in /server_info (flat keys, null when not speculating, as SGLang's `resolved_dict()`) and adds
to every finished answer the figures SGLang's `_calculate_spec_decoding_metrics` adds (tokenizer_manager.py):
only on the finished output, only when there was at least one verify step.

Under the names of one release (`--spec-names RELEASE`, default the `--version` profile's; SPEC_NAMES, checked
against each release's own source by tests/generate/test_sglang_spec_shapes.py): 0.5.9 and 0.5.10 send
`spec_accept_token_num`, `spec_draft_token_num`, `spec_accept_histogram`; 0.5.11 `spec_accepted_drafts`,
`spec_proposed_drafts`, `spec_accept_histogram`; 0.5.12 to 0.5.22 today's names plus the 0.5.11 ones as
aliases; 0.5.23 today's alone. With `--ragged-verify-mode cap-accept|compact` (SGLang's
SGLANG_RAGGED_VERIFY_MODE, where DSpark caps each verify step; 0.5.18 and later) the answers also carry
`spec_cap_length` and `spec_cap_lens_histogram` (cap-accept: `spec_block_accept_length` too).

How a request's figures come about: the first output token comes from the prefill; then each verify step
proposes `num_draft_tokens - 1` drafts and accepts a run of them (each draft with the probability its
position's content gives, until the first miss), plus one bonus token. The probabilities make the figures
worth reading: structured output (tool calls, code blocks) is easy to draft, prose less so, long reasoning
gets harder as it goes on, later turns of a conversation are harder than first ones, and each drafter has
its own quality (from its name). Deterministic per request: seeded from the prompt ids, the sampling seed
and the drafter, never the rid (a retry reproduces the figures).

A drafter's quality can be set instead of drawn from its name, per content class of the prompt
(`--draft-quality code=0.97,prose=0.82`, `content_class`: code, math or prose, read from the prompt's
text), so tests plant a drafter that is better on code and worse on prose, or the same drafter under
another name (same quality, another draft model path: its figures differ prompt by prompt, not on average).
"""

from __future__ import annotations

import argparse
import hashlib
import math
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..profiles import ModelProfile

METRIC_KEYS = (
    "spec_accept_rate",
    "spec_accept_length",
    "spec_num_correct_drafts",
    "spec_num_proposed_drafts",
    "spec_verify_ct",
    "spec_correct_drafts_histogram",
)
CAP_KEYS = ("spec_cap_length", "spec_block_accept_length", "spec_cap_lens_histogram")
# The names each release sends the three renamed figures under (correct drafts, proposed drafts, histogram),
# each a tuple: the name, then any alias the release sends beside it; and whether it has the cap figures.
SPEC_NAMES: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], bool]] = {
    "0.5.9": (("spec_accept_token_num",), ("spec_draft_token_num",), ("spec_accept_histogram",), False),
    "0.5.10": (("spec_accept_token_num",), ("spec_draft_token_num",), ("spec_accept_histogram",), False),
    "0.5.11": (("spec_accepted_drafts",), ("spec_proposed_drafts",), ("spec_accept_histogram",), False),
    "0.5.12": (
        ("spec_num_correct_drafts", "spec_accepted_drafts"),
        ("spec_num_proposed_drafts", "spec_proposed_drafts"),
        ("spec_correct_drafts_histogram", "spec_accept_histogram"),
        False,
    ),
    "0.5.18": (
        ("spec_num_correct_drafts", "spec_accepted_drafts"),
        ("spec_num_proposed_drafts", "spec_proposed_drafts"),
        ("spec_correct_drafts_histogram", "spec_accept_histogram"),
        True,
    ),
    "0.5.23": (("spec_num_correct_drafts",), ("spec_num_proposed_drafts",), ("spec_correct_drafts_histogram",), True),
}
RAGGED_VERIFY_MODES = ("static", "cap-accept", "compact")
# fleet fault spec_names_unknown: a release the client has never seen, every figure under another name
UNKNOWN_NAMES = {
    "spec_accept_rate": "spec_acceptance_rate",
    "spec_accept_length": "spec_acceptance_length",
    "spec_num_correct_drafts": "spec_correct_tokens",
    "spec_num_proposed_drafts": "spec_proposed_tokens",
    "spec_verify_ct": "spec_verify_steps",
    "spec_correct_drafts_histogram": "spec_acceptance_histogram",
}
# How easy each kind of content is to draft (before the drafter's quality and the turn factor).
P_TOOL_CALL = 0.93
P_CODE = 0.88
P_ANSWER = 0.62
P_REASONING_START = 0.80
P_REASONING_FLOOR = 0.50
REASONING_DECAY_TOKENS = 1500.0

CONTENT_CLASSES = ("code", "math", "prose")
ANY_CLASS = "*"
MAX_QUALITY = 1.5
# What a prompt asks for, from its text: code first (a coding question with numbers in it is code), then math.
_CODE_CUES = re.compile(
    r"```|\bdef |\bfunction\b|\bcode\b|\bpython\b|\bjavascript\b|\btypescript\b|\bsql\b|\bregex\b|"
    r"\bprogram\b|\bimplement\b|\bcompile|\bbash\b|\bscript\b|\brust\b|\bjson\b",
    re.IGNORECASE,
)
_MATH_CUES = re.compile(
    r"\d+\s*[-+*/x^=]\s*\d+|\bsolve\b|\bequation\b|\bhow many\b|\bcalculate\b|\bsum of\b|\bpercent",
    re.IGNORECASE,
)


def content_class(prompt_text: str) -> str:
    """The content class a prompt belongs to: `code`, `math` or `prose`."""
    if _CODE_CUES.search(prompt_text):
        return "code"
    return "math" if _MATH_CUES.search(prompt_text) else "prose"


def parse_draft_quality(text: str) -> tuple[tuple[str, float], ...]:
    """`--draft-quality`: one number for every class, or CLASS=Q pairs (`*` for the classes not named), each Q
    in (0, 1.5]; an argparse error names what is wrong."""
    pairs: list[tuple[str, float]] = []
    for part in (p.strip() for p in text.split(",")):
        name, sep, value = part.partition("=")
        cls, raw = (name.strip(), value) if sep else (ANY_CLASS, name)
        if cls not in (*CONTENT_CLASSES, ANY_CLASS):
            raise argparse.ArgumentTypeError(f"{cls!r} is not a content class ({', '.join(CONTENT_CLASSES)} or *)")
        try:
            q = float(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part!r}: the quality must be a number") from None
        if not 0 < q <= MAX_QUALITY:
            raise argparse.ArgumentTypeError(f"{part!r}: the quality must be in (0, {MAX_QUALITY}]")
        if cls in dict(pairs):
            raise argparse.ArgumentTypeError(f"{cls!r} is given twice")
        pairs.append((cls, q))
    return tuple(pairs)


@dataclass(frozen=True)
class SpecConfig:
    """The speculative server args, as SGLang names them (None: not set)."""

    algorithm: str | None = None
    draft_model_path: str | None = None
    draft_model_revision: str | None = None
    num_steps: int | None = None
    eagle_topk: int | None = None
    num_draft_tokens: int | None = None
    names: str = "0.5.23"  # the release whose names the figures go under (SPEC_NAMES)
    ragged_verify_mode: str = "static"  # RAGGED_VERIFY_MODES: not static, steps are capped (cap figures)
    # --draft-quality: the drafter's quality per content class (empty: drawn from its name and revision)
    class_quality: tuple[tuple[str, float], ...] = ()

    @property
    def on(self) -> bool:
        return self.algorithm is not None

    def server_info(self) -> dict[str, Any]:
        return {
            "speculative_algorithm": self.algorithm,
            "speculative_draft_model_path": self.draft_model_path,
            "speculative_draft_model_revision": self.draft_model_revision,
            "speculative_num_steps": self.num_steps,
            "speculative_eagle_topk": self.eagle_topk,
            "speculative_num_draft_tokens": self.num_draft_tokens,
        }

    def quality(self) -> float:
        """A drafter's own quality in [0.80, 1.0], stable for its name and revision."""
        h = hashlib.blake2b(f"{self.draft_model_path}@{self.draft_model_revision}".encode(), digest_size=4)
        return 0.80 + 0.20 * (int.from_bytes(h.digest(), "little") % 1000) / 999

    @property
    def by_class(self) -> bool:
        """Whether the quality depends on the prompt's content class (then the prompt's text is read)."""
        return any(c != ANY_CLASS for c, _ in self.class_quality)

    def quality_for(self, content: str | None) -> float:
        """The quality on a prompt of this content class: as --draft-quality sets it, else `quality()`."""
        given = dict(self.class_quality)
        q = given.get(content or "", given.get(ANY_CLASS))
        return q if q is not None else self.quality()


def spec_config(args: Any) -> SpecConfig:
    """From the simulator's command line. A draft model without an algorithm means EAGLE3 here (SGLang needs
    `--speculative-algorithm`; the simulator takes the draft model as the sign). Unset counts get the values
    SGLang picks for EAGLE-3 when it chooses them itself (3 steps, top-k 1, 4 draft tokens)."""
    algo = getattr(args, "speculative_algorithm", None)
    path = getattr(args, "speculative_draft_model_path", None)
    names = spec_release(args)
    mode = getattr(args, "ragged_verify_mode", None) or "static"
    if mode != "static" and not SPEC_NAMES[names][3]:
        raise ValueError(f"--ragged-verify-mode {mode}: SGLang {names} sends no cap figures (0.5.18 and later do)")
    if algo is None and path is None:
        if getattr(args, "draft_quality", None):
            raise ValueError("--draft-quality needs a drafter (--speculative-draft-model-path)")
        return SpecConfig(names=names)
    steps = getattr(args, "speculative_num_steps", None) or 3
    return SpecConfig(
        algorithm=algo or "EAGLE3",
        draft_model_path=path,
        draft_model_revision=getattr(args, "speculative_draft_model_revision", None),
        num_steps=steps,
        eagle_topk=getattr(args, "speculative_eagle_topk", None) or 1,
        num_draft_tokens=getattr(args, "speculative_num_draft_tokens", None) or steps + 1,
        names=names,
        ragged_verify_mode=mode,
        class_quality=tuple(getattr(args, "draft_quality", None) or ()),
    )


def spec_release(args: Any) -> str:
    """The release whose figure names the simulator speaks: `--spec-names`, else its `--version` profile's."""
    names = getattr(args, "spec_names", None) or getattr(args, "version", None) or "0.5.23"
    if names not in SPEC_NAMES:
        raise ValueError(f"--spec-names {names}: one of {', '.join(SPEC_NAMES)}")
    return str(names)


def _turn_factor(prompt_ids: Sequence[int], end_of_turn_id: int) -> float:
    """Later turns are harder to draft: each finished message in the prompt beyond the first two costs 4%."""
    finished = sum(1 for t in prompt_ids if t == end_of_turn_id)
    return max(0.6, 0.96 ** max(0, finished - 2))


def acceptance_probs(ids: Sequence[int], profile: ModelProfile, token_strings: Sequence[str]) -> list[float]:
    """Per output position: the chance a draft of that token is accepted (before the drafter's quality)."""
    # Kimi prompts end with <think>: the output starts in reasoning unless the think block was closed
    reasoning = profile.think_end_id in ids
    tc = profile.tool_call_ids
    tool_ids = {v for v in (tc.section_begin, tc.call_begin) if v is not None}
    in_code = tool = False
    out: list[float] = []
    for i, (t, s) in enumerate(zip(ids, token_strings, strict=True)):
        if t == profile.think_end_id:
            reasoning = False
        tool = tool or t in tool_ids
        if "``" in s:
            in_code = not in_code
        if tool:
            p = P_TOOL_CALL
        elif reasoning:
            decay = math.exp(-i / REASONING_DECAY_TOKENS)
            p = P_REASONING_FLOOR + (P_REASONING_START - P_REASONING_FLOOR) * decay
        else:
            p = P_CODE if in_code else P_ANSWER
        out.append(p)
    return out


@dataclass(frozen=True)
class SpecFigures:
    verify_ct: int
    correct: int
    histogram: tuple[int, ...]
    accepted: tuple[int, ...] = ()  # per verify step: the drafts it accepted


def capped_steps(fig: SpecFigures, num_draft_tokens: int, rng: random.Random) -> list[int]:
    """Ragged verify (DSpark): per step, the verify length it was capped at; at least the anchor plus the
    drafts the step accepted, at most every draft token."""
    return [rng.randint(k + 1, max(k + 1, num_draft_tokens)) for k in fig.accepted]


def simulate(probs: Sequence[float], num_draft_tokens: int, rng: random.Random) -> SpecFigures:
    """Verify steps over an output of len(probs) tokens: the first token is the prefill's, each step
    accepts a run of drafts (stopping at the first rejected one or the output's end) plus the bonus."""
    n = len(probs)
    pos, steps, correct = 1, 0, 0
    hist = [0] * max(1, num_draft_tokens)
    accepted: list[int] = []
    while pos < n:
        k = 0
        while k < num_draft_tokens - 1 and pos + k + 1 < n and rng.random() < probs[pos + k]:
            k += 1
        hist[k] += 1
        steps += 1
        correct += k
        accepted.append(k)
        pos += k + 1
    while len(hist) > 1 and hist[-1] == 0:
        hist.pop()  # SGLang's list grows only as far as the largest k seen
    return SpecFigures(steps, correct, tuple(hist), tuple(accepted))


def request_seed(prompt_ids: Sequence[int], sampling_seed: int | None, cfg: SpecConfig) -> int:
    h = hashlib.blake2b(digest_size=8)
    h.update(",".join(map(str, prompt_ids)).encode())
    h.update(f"|{sampling_seed}|{cfg.draft_model_path}@{cfg.draft_model_revision}|{cfg.eagle_topk}".encode())
    return int.from_bytes(h.digest(), "little")


@dataclass(frozen=True)
class DraftedAnswer:
    """What the drafter is measured on: the answer's ids and their token strings, the request's prompt ids
    and sampling seed (the figures are the same on a retry), the prompt's content class (None: not read)."""

    ids: Sequence[int]
    prompt_ids: Sequence[int]
    token_strings: Sequence[str]
    sampling_seed: int | None
    content: str | None = None


def meta_fields(cfg: SpecConfig, profile: ModelProfile, answer: DraftedAnswer, scale: float = 1.0) -> dict[str, Any]:
    """The spec keys of a finished answer's meta_info, as SGLang computes them (none without a verify step).
    `scale`: the fleet fault spec_acceptance_scale (1.0: none)."""
    ids, prompt_ids, token_strings = answer.ids, answer.prompt_ids, answer.token_strings
    sampling_seed, content = answer.sampling_seed, answer.content
    q = cfg.quality_for(content) * _turn_factor(prompt_ids, profile.end_of_turn_id) * scale
    topk = max(1, cfg.eagle_topk or 1)
    probs = acceptance_probs(ids, profile, token_strings)
    scaled = [1 - (1 - min(1.0, p * q)) ** (1 + 0.25 * (topk - 1)) for p in probs]
    d = cfg.num_draft_tokens or 1
    rng = random.Random(request_seed(prompt_ids, sampling_seed, cfg))
    fig = simulate(scaled, d, rng)
    if fig.verify_ct <= 0:
        return {}
    out: dict[str, Any] = {}
    proposed = fig.verify_ct * (d - 1)
    caps = capped_steps(fig, d, rng) if cfg.ragged_verify_mode != "static" else []
    if proposed > 0:
        out["spec_accept_rate"] = fig.correct / proposed
        out["spec_accept_length"] = len(ids) / fig.verify_ct
        out["spec_num_correct_drafts"] = fig.correct
        out["spec_num_proposed_drafts"] = proposed
        out["spec_verify_ct"] = fig.verify_ct
        if caps:
            out["spec_cap_length"] = sum(caps) / fig.verify_ct
        if cfg.ragged_verify_mode == "cap-accept":
            out["spec_block_accept_length"] = sum(k + 1 for k in fig.accepted) / fig.verify_ct
    out["spec_correct_drafts_histogram"] = list(fig.histogram)
    if caps:
        out["spec_cap_lens_histogram"] = [caps.count(c) for c in range(max(caps) + 1)]
    return out


def named_as(fields: dict[str, Any], release: str) -> dict[str, Any]:
    """`fields` (0.5.23's names) under the names `release` sends them, in the order its source sets them:
    the scalars, the aliases of the counts, the histogram and its alias, the cap histogram."""
    correct, proposed, histogram, _ = SPEC_NAMES[release]
    renamed = (("spec_num_correct_drafts", correct), ("spec_num_proposed_drafts", proposed))
    out: dict[str, Any] = {k: fields[k] for k in ("spec_accept_rate", "spec_accept_length") if k in fields}
    out.update({names[0]: fields[k] for k, names in renamed if k in fields})
    out.update({k: fields[k] for k in ("spec_verify_ct", "spec_cap_length", "spec_block_accept_length") if k in fields})
    out.update({alias: fields[k] for k, names in renamed if k in fields for alias in names[1:]})
    if "spec_correct_drafts_histogram" in fields:
        out.update(dict.fromkeys(histogram, fields["spec_correct_drafts_histogram"]))
    if "spec_cap_lens_histogram" in fields:
        out["spec_cap_lens_histogram"] = fields["spec_cap_lens_histogram"]
    return out


def unknown_names(fields: dict[str, Any]) -> dict[str, Any]:
    """The fleet fault spec_names_unknown: the figures under names no SGLang release uses."""
    return {UNKNOWN_NAMES.get(k, k): v for k, v in fields.items()}


INCONSISTENT_KINDS = (
    "accept_length",
    "partial",
    "histogram",
    "negative",
    "steps_beyond_tokens",
    "histogram_length",
    "huge_count",
)


def _steps_beyond_tokens(out: dict[str, Any]) -> dict[str, Any]:
    """Figures that agree with each other but claim one verify step more than the answer has tokens."""
    if "spec_verify_ct" not in out:
        return out
    vct = int(out["spec_verify_ct"])
    tokens = round(float(out["spec_accept_length"]) * vct)
    per_step = int(out["spec_num_proposed_drafts"]) // vct
    steps = tokens + 1
    hist = list(out["spec_correct_drafts_histogram"])
    hist[0] += steps - vct  # the extra steps accepted nothing
    proposed = steps * per_step
    return {
        **out,
        "spec_verify_ct": steps,
        "spec_num_proposed_drafts": proposed,
        "spec_accept_rate": out["spec_num_correct_drafts"] / proposed,
        "spec_accept_length": tokens / steps,
        "spec_correct_drafts_histogram": hist,
    }


def make_inconsistent(fields: dict[str, Any], kind: str) -> dict[str, Any]:
    """The fleet fault spec_inconsistent: figures that do not add up, or that agree with each other but no
    SGLang server can produce (steps_beyond_tokens: more verify steps than tokens; histogram_length: a
    histogram ending in 0; huge_count: spec_verify_ct 2**70), the way a broken server or proxy would send
    them (the ids stay right)."""
    out = dict(fields)
    if not out:
        return out
    if kind == "steps_beyond_tokens":
        return _steps_beyond_tokens(out)
    if kind == "histogram_length":
        out["spec_correct_drafts_histogram"] = [*out["spec_correct_drafts_histogram"], 0]
    elif kind == "huge_count":
        out["spec_verify_ct"] = 2**70
    elif kind == "partial":
        out.pop("spec_accept_rate", None)
        out.pop("spec_num_proposed_drafts", None)
    elif kind == "histogram":
        out["spec_correct_drafts_histogram"] = [*out["spec_correct_drafts_histogram"], 1]
    elif kind == "negative":
        out["spec_verify_ct"] = -int(out.get("spec_verify_ct", 1))
    else:
        out["spec_accept_length"] = float(out.get("spec_accept_length", 1.0)) + 0.5
    return out
