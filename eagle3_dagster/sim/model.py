"""The simulator's "model": a deterministic, Kimi-K2.5/Qwen3-shaped token source.

The output for a prompt is a pure function of the prompt ids (plus the sample index for n>1 and an
optional sampling_seed), never of the rid, so a retried request reproduces the same sample. Text is
built first and encoded with the real tokenizer, so the ids are ids the real model could emit.

Shapes (ids in the profile decide which tokens are markers):
- Kimi (`generation_prompt_ends_with_think_start`): `reasoning</think>answer<|im_end|>`; an instant
  prompt (ending `<think></think>`) gives `answer<|im_end|>`.
- Qwen3: `<think>\\nreasoning\\n</think>\\n\\nanswer<|im_end|>`.
- The answer echoes the last user message; a prompt that declares tools often gets tool calls of
  declared functions (sim/agentic.py).
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..profiles import ModelProfile
from . import agentic

_WORDS = [
    "the",
    "user",
    "wants",
    "a",
    "clear",
    "answer",
    "so",
    "I",
    "should",
    "check",
    "each",
    "step",
    "first",
    "then",
    "verify",
    "the",
    "result",
    "consider",
    "edge",
    "cases",
    "carefully",
    "and",
    "compare",
    "the",
    "options",
    "before",
    "deciding",
    "what",
    "matters",
    "most",
    "here",
    "a",
    "short",
    "list",
    "may",
    "help",
    "because",
    "the",
    "question",
    "mentions",
    "several",
    "parts",
    "that",
    "depend",
    "on",
    "each",
    "other",
]
_SENTENCES = (
    "Let me restate the problem in my own words.",
    "First, I need to identify what is being asked.",
    "The key constraint seems to be the format of the answer.",
    "I should double-check the arithmetic before answering.",
    "Another approach would be to work backwards from the goal.",
    "Hmm, that does not look right; let me reconsider.",
    "So the intermediate result is consistent with the assumptions.",
    "The user probably expects a concise explanation with an example.",
    "Wait, there is a subtle case when the input is empty.",
    "Putting it together, the plan is straightforward.",
    "I will mention the trade-offs briefly.",
    "This matches what I expected from the definition.",
)
_ANSWER = (
    "Here is the answer.",
    "The result is {n}.",
    "In short: check the inputs, apply the rule, and verify the output.",
    "Step 1: read the data. Step 2: transform it. Step 3: write it back.",
    "You can use a dictionary for fast lookups.",
    "Let me know if you want more detail.",
    "Note: the value {n} is an estimate ≈ {n}.5 (±1).",
    "答案是 {n}。",
    "```python\nprint({n})\n```",
)

# Kimi tool declarations: TypeScript-like (`type NAME = (_: {`) or the compact-JSON fallback.
_TS_TYPE = re.compile(r"^type ([A-Za-z_][\w.\-]*) = \(_: (\{\}|\{\n(.*?)\n\})\) => any;", re.M | re.S)
_TS_FIELD = re.compile(r"^  ([A-Za-z_]\w*)(\?)?: (.+?),?$", re.M)
_JSON_NAME = re.compile(r'"name"\s*:\s*"([^"\\]{1,64})"')


def prompt_seed(input_ids: Sequence[int], sample_index: int = 0, sampling_seed: int | None = None) -> int:
    """Stable 64-bit seed from the prompt ids (not the rid: retries must reproduce the sample)."""
    h = hashlib.blake2b(digest_size=8)
    h.update(",".join(map(str, input_ids)).encode())
    if sample_index:
        h.update(f"|s{sample_index}".encode())
    if sampling_seed is not None:
        h.update(f"|seed{sampling_seed}".encode())
    return int.from_bytes(h.digest(), "little")


@dataclass(frozen=True)
class ToolDecl:
    name: str
    args: dict[str, Any]


@dataclass(frozen=True)
class Script:
    """The model's intended output for one prompt, before any sampling_params are applied."""

    ids: tuple[int, ...]  # ends with end_of_turn_id
    filler: tuple[int, ...]  # what the model says when EOS is masked/ignored (then EOS again)
    text: str  # the text that was encoded (without the stop token)
    tool_call: str | None  # name of the tool called, if any


def _fake_value(type_expr: str, rng: random.Random) -> Any:
    t = type_expr.strip()
    if t.startswith('"'):
        return t.split('"')[1]
    if t.startswith(("number", "integer")):
        return rng.randint(1, 99)
    if t.startswith("boolean"):
        return rng.random() < 0.5
    if t.endswith("[]"):
        return []
    return rng.choice(("Paris", "alpha", "report.txt", "today"))


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _tools_from_json(decls: list[Any], rng: random.Random) -> list[ToolDecl]:
    """OpenAI-style tool dicts -> names plus fake values for the required parameters."""
    out: list[ToolDecl] = []
    for d in decls:
        fn = d.get("function", d) if isinstance(d, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            continue
        params: dict[str, Any] = fn["parameters"] if isinstance(fn.get("parameters"), dict) else {}
        props: dict[str, Any] = params["properties"] if isinstance(params.get("properties"), dict) else {}
        args = {
            k: _fake_value(str((props.get(k) or {}).get("type", "string")), rng)
            for k in params.get("required") or []
            if isinstance(k, str)
        }
        out.append(ToolDecl(fn["name"], args))
    return out


def find_tools(prompt_text: str, rng: random.Random) -> list[ToolDecl]:
    """Tools declared in a rendered prompt: Kimi `tool_declare` (TS or JSON) or Qwen3 `<tools>`."""
    tools: list[ToolDecl] = []
    if "namespace functions {" in prompt_text:
        for m in _TS_TYPE.finditer(prompt_text):
            body = m.group(3) or ""
            args = {f.group(1): _fake_value(f.group(3), rng) for f in _TS_FIELD.finditer(body) if not f.group(2)}
            tools.append(ToolDecl(m.group(1), args))
    if not tools:
        # Qwen3/Hermes: one JSON object per line inside <tools>...</tools>.
        blocks = re.findall(r"<tools>\n(.*?)\n</tools>", prompt_text, re.S)
        tools = _tools_from_json([_loads(line) for line in "\n".join(blocks).splitlines()], rng)
    if not tools and "tool_declare" in prompt_text:
        # Kimi without tools_ts_str: compact JSON list in the tool_declare turn.
        region = prompt_text.split("tool_declare", 1)[1].split("<|im_end|>", 1)[0]
        region = region.split(">", 1)[-1] if region.startswith("<") else region
        decl = _loads(region)
        tools = _tools_from_json(decl if isinstance(decl, list) else [], rng)
        if not tools:
            tools = [ToolDecl(n, {}) for n in dict.fromkeys(_JSON_NAME.findall(region))]
    return tools


class OutputModel:
    """Builds and caches Scripts; thread-safe enough for one event loop plus worker threads."""

    def __init__(
        self, tokenizer: Any, profile: ModelProfile, *, tool_call_rate: float = 0.6, cache_size: int = 4096
    ) -> None:
        self.tok = tokenizer
        self.profile = profile
        self.tool_call_rate = tool_call_rate
        self._cache: dict[int, Script] = {}
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self.kimi_shape = profile.generation_prompt_ends_with_think_start
        self.global_seed: int | None = None  # --seed: a different but still deterministic "model"
        self.splitter: Any = None  # --noncanonical-rate: a sim.noncanonical.NonCanonicalSplitter
        self.shape_reasoning: Callable[[str], str] = lambda text: text  # a changed deployment (sim/deployment.py)

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))

    def script(self, input_ids: Sequence[int], sample_index: int = 0, sampling_seed: int | None = None) -> Script:
        key = prompt_seed(input_ids, sample_index, sampling_seed)
        if self.global_seed is not None:
            key = prompt_seed([key, self.global_seed])
        with self._lock:
            hit = self._cache.get(key)
        if hit is not None:
            return hit
        s = self._build(input_ids, random.Random(key))
        if self.splitter is not None:
            # Same seed -> same split: a retried request reproduces the sample exactly.
            s = Script(tuple(self.splitter.apply(s.ids, random.Random(key ^ 0x5EED))), s.filler, s.text, s.tool_call)
        with self._lock:
            if len(self._cache) >= self._cache_size:
                self._cache.clear()  # crude eviction; rebuilding is cheap and deterministic
            self._cache[key] = s
        return s

    def _build(self, input_ids: Sequence[int], rng: random.Random) -> Script:
        p = self.profile
        # Thinking off: the template already closed the think block (Kimi `<think></think>`,
        # Qwen3 `<think>\n\n</think>\n\n`), so the model answers directly.
        tail = list(input_ids[-6:])
        instant = (
            p.think_end_id in tail and not self.tok.decode(tail[len(tail) - tail[::-1].index(p.think_end_id) :]).strip()
        )
        # Mostly longer than SGLang's default max_new_tokens=128, so forgetting to send it shows up.
        reasoning = " ".join(rng.choice(_SENTENCES) for _ in range(rng.randint(6, 30)))
        reasoning += " " + " ".join(rng.choice(_WORDS) for _ in range(rng.randint(5, 40))) + "."
        reasoning = self.shape_reasoning(reasoning)
        n = rng.randint(2, 9999)
        answer = " ".join(rng.choice(_ANSWER).format(n=n) for _ in range(rng.randint(1, 5)))
        # The answer echoes the last user message and may call declared tools (sim/agentic.py).
        # Decoding the prompt runs once per prompt (scripts are cached).
        prompt_text = self.tok.decode(list(input_ids), skip_special_tokens=False)
        plan = agentic.plan_turn(
            prompt_text,
            find_tools(prompt_text, rng),
            rng,
            kimi=self.kimi_shape,
            tool_call_rate=self.tool_call_rate,
        )
        if plan.echo:
            answer = f'Re "{plan.echo}": {answer}'
        tool_call = plan.calls[0].name if plan.calls else None
        tail_markers = ""
        if plan.calls:
            if self.kimi_shape:
                tail_markers = agentic.kimi_calls_text(plan, self.tok.convert_ids_to_tokens, p.tool_call_ids)
                answer = rng.choice(("", "I'll call a tool for this.", f'Re "{plan.echo}": checking.'))
            else:
                tail_markers = agentic.qwen_calls_text(plan)
                answer = ""
        think_start = self.tok.convert_ids_to_tokens(p.think_start_id)
        think_end = self.tok.convert_ids_to_tokens(p.think_end_id)
        if self.kimi_shape:
            text = (answer + tail_markers) if instant else f"{reasoning}{think_end}{answer}{tail_markers}"
        else:
            text = (
                (answer + tail_markers)
                if instant
                else f"{think_start}\n{reasoning}\n{think_end}\n\n{answer}{tail_markers}"
            )
        ids = self.encode(text) + [p.end_of_turn_id]
        filler_text = " " + " ".join(rng.choice(_SENTENCES) for _ in range(8))
        return Script(tuple(ids), tuple(self.encode(filler_text)), text, tool_call)
