"""Chat-template rendering to exact token ids, per model profile.

Rendering is two steps: the chat template produces text (through transformers'
`apply_chat_template(tokenize=False)`, so template semantics are exactly the library's), then
all texts of a batch are encoded in one call with `add_special_tokens=False`. Special tokens
appear in the template text as literal strings, which the tokenizer matches as whole tokens, so
this equals `apply_chat_template(tokenize=True)` (checked against the golden renders in tests).

For Kimi (`template_family == "kimi_ts"`) the tools are deep-sorted and declared through our own
`tools_ts_str` (kimi_tools.py), exactly as the official remote-code tokenizer does.

Speed: for a chat template we know byte for byte (Kimi-K2.5, Qwen3; by hash) a native renderer
(native.py) builds the same text without Jinja; it declines anything it does not model exactly,
and those rows go through apply_chat_template. `native_templates=False` turns it off.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import secrets
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ..profiles import ModelProfile
from .control_text import (
    CONTROL_TEXT_POLICIES,
    CONTROL_TOKEN_IN_CONTENT,
    control_tokens,
    describe,
    find_control_text,
)
from .kimi_tools import TOOLS_TS_VERSION, compute_tools_ts_str
from .loading import load_tokenizer
from .native import NativeRender, native_renderer_for

logger = logging.getLogger(__name__)

# Reason codes a render can fail with (also used as quarantine reasons downstream).
RENDER_ERROR = "render_error"
ID_OUT_OF_VOCAB = "id_out_of_vocab"
GENERATION_PROMPT_MISMATCH = "generation_prompt_mismatch"

_DETAIL_LIMIT = 500
_TOOLS_CACHE_SIZE = 4096


@dataclass(frozen=True)
class RenderRequest:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    add_generation_prompt: bool = True
    template_kwargs: dict[str, Any] | None = None
    # Optional identity of `tools` (e.g. its canonical JSON text): rows with equal keys share the
    # tools conversion and one batched template call. Leave None when unsure.
    tools_key: str | None = None
    # Literal control-token text in the data (control_text.py): reject | as_text | as_served.
    control_text: str = "reject"


@dataclass(frozen=True)
class RenderResult:
    """Either text + input_ids (success) or reason + detail (failure); never both."""

    text: str | None
    input_ids: list[int] | None
    reason: str | None = None
    detail: str | None = None
    # as_served only: the ids hold special ids that came from the data's literal text, not the template
    control_text_in_content: bool = False

    @property
    def ok(self) -> bool:
        return self.reason is None


def _failure(reason: str, detail: str) -> RenderResult:
    return RenderResult(text=None, input_ids=None, reason=reason, detail=detail[:_DETAIL_LIMIT])


def tokenizer_fingerprint(tokenizer) -> str:
    """Stable hash of what decides ids: the serialized fast tokenizer (vocab, merges, pre-tokenizer,
    added tokens) plus the special-token map. Same files -> same fingerprint, wherever loaded from."""
    digest = hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode("utf-8"))
    digest.update(json.dumps(tokenizer.special_tokens_map, sort_keys=True, default=str).encode("utf-8"))
    digest.update(str(len(tokenizer)).encode())
    return digest.hexdigest()[:32]


def _validate_messages(messages: Any) -> str | None:
    """Shape problems the template would turn into confusing errors; the message names the field."""
    if not isinstance(messages, list) or not messages:
        return "messages: expected a non-empty list of message objects"
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            return f"messages[{i}]: expected an object, got {type(message).__name__}"
        role = message.get("role")
        if not isinstance(role, str) or not role:
            return f"messages[{i}].role: missing or not a string"
        if message.get("generate") is True:  # ingest.normalize.GENERATE_KEY: a turn still to generate
            return f"messages[{i}]: an assistant slot still to generate (generate: true) cannot be rendered"
    return None


def _validate_tools(tools: Any) -> str | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        return f"tools: expected a list, got {type(tools).__name__}"
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            return f"tools[{i}]: expected an object, got {type(tool).__name__}"
    return None


class PendingRender:
    """A chunk whose texts are rendered and whose encode is running; `.results()` waits for it."""

    def __init__(
        self,
        renderer: PromptRenderer,
        requests: list[RenderRequest],
        failures: dict[int, RenderResult],
        positions: list[int],
        texts: list[str],
        future: Future[Any] | None,
        control: dict[int, tuple[str, Any]] | None = None,
    ) -> None:
        self._renderer = renderer
        self._requests = requests
        self._failures = failures
        self._positions = positions
        self._texts = texts
        self._future = future
        # position -> ("as_served", None) or ("as_text", literal spans of the text)
        self._control = control or {}

    def results(self) -> list[RenderResult]:
        results: list[RenderResult | None] = [self._failures.get(i) for i in range(len(self._requests))]
        renderer = self._renderer
        try:
            ids_per_text = [e.ids for e in self._future.result()] if self._future is not None else []
            # One pass over the chunk: rows are scanned for out-of-vocabulary ids only if some id is.
            scan = max(map(max, filter(None, ids_per_text)), default=-1) >= renderer._vocab_limit
        except Exception:  # never expected; isolate the text that breaks the batch instead of failing all
            ids_per_text = [renderer._encode_one(text) for text in self._texts]
            scan = True
        control = self._control
        for position, text, ids in zip(self._positions, self._texts, ids_per_text):
            flagged = False
            if control and position in control:
                mode, spans = control[position]
                if mode == "as_text":
                    ids, scan_row = renderer._encode_as_text(text, spans), True
                else:
                    flagged, scan_row = True, scan
            else:
                scan_row = scan
            result = renderer._checked(self._requests[position], text, ids, scan_row) if isinstance(ids, list) else ids
            if flagged and result.ok:
                result = RenderResult(text=result.text, input_ids=result.input_ids, control_text_in_content=True)
            results[position] = result
        return results  # type: ignore[return-value]


class PromptRenderer:
    """Renders conversations for one model profile into exact prompt token ids."""

    # Rows per encode call: big enough for the batched encode to pay off, small enough that
    # rendering the next chunk overlaps encoding this one.
    chunk_rows: int = 1024

    def __init__(self, profile: ModelProfile, tokenizer=None, *, cache_dir=None, native_templates: bool = True) -> None:
        self.profile = profile
        if tokenizer is None:
            tokenizer = load_tokenizer(
                profile.tokenizer, trust_remote_code=profile.trust_remote_code, cache_dir=cache_dir
            )
        self.tokenizer = tokenizer
        if not tokenizer.chat_template:
            raise ValueError(f"tokenizer {profile.tokenizer!r} (profile {profile.name!r}) has no chat template")
        self._backend = tokenizer.backend_tokenizer
        self._encode_pool: ThreadPoolExecutor | None = None
        self._tools_cache: dict[str, tuple[list[Any] | None, str | None]] = {}
        self._vocab_limit = min(int(profile.vocab_size), len(tokenizer))
        self.tokenizer_fingerprint: str = tokenizer_fingerprint(tokenizer)
        self.template_hash: str = self._template_hash()
        # Same text as the template, without Jinja; None when the template is not one we know (or
        # the probe comparison in native_renderer_for finds a difference).
        self._native: NativeRender | None = (
            native_renderer_for(tokenizer, self._apply_template) if native_templates else None
        )
        # Rows whose text came from the native renderer vs. from apply_chat_template (the Jinja
        # fallback: no native renderer, or it declined the row). Plain counters for tests/benches.
        self.native_rows = 0
        self.jinja_rows = 0
        # The added tokens' texts (what a literal in the data would be encoded as); control_text.py.
        self._control_tokens = control_tokens(tokenizer)
        self._placeholder_tag = f"CTRLTXT{secrets.token_hex(6)}"
        self._placeholder = re.compile(self._placeholder_tag + r"_(\d+)_")

    @property
    def native_template(self) -> bool:
        """Whether rows may be rendered natively (without Jinja) for this tokenizer's template."""
        return self._native is not None

    def _template_hash(self) -> str:
        identity = {
            "chat_template": self.tokenizer.chat_template,  # str, or a dict of named templates
            "template_kwargs": self.profile.template_kwargs,
            "template_family": self.profile.template_family,
            "tools_renderer": TOOLS_TS_VERSION if self.profile.template_family == "kimi_ts" else None,
        }
        blob = json.dumps(identity, sort_keys=True, ensure_ascii=False, default=str)
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:32]

    # -- text ----------------------------------------------------------------------------------

    def _prepare(self, request: RenderRequest) -> tuple[list[Any] | None, dict[str, Any], tuple[Any, ...]]:
        """Validate and compute what the template gets besides messages: (tools, kwargs, group key).

        Requests with equal group keys render identically apart from their messages, so they can
        share one batched apply_chat_template call.
        """
        problem = _validate_messages(request.messages) or _validate_tools(request.tools)
        if problem:
            raise ValueError(problem)
        kwargs = {**self.profile.template_kwargs, **(request.template_kwargs or {})}
        tools = request.tools or None
        # Rows with tools group only when the caller names their content (tools_key); else alone.
        tools_key: Any = None if tools is None else (request.tools_key or id(request))
        if self.profile.template_family == "kimi_ts" and tools:
            tools, tools_ts_str = self._kimi_tools(tools, request.tools_key)
            if tools_ts_str:
                kwargs["tools_ts_str"] = tools_ts_str
            else:
                # The official tokenizer then shows compact JSON of the sorted tools (spec §2.2).
                kwargs.pop("tools_ts_str", None)
        kwargs_key = json.dumps(request.template_kwargs, sort_keys=True, default=str) if request.template_kwargs else ""
        return tools, kwargs, (tools_key, kwargs_key, request.add_generation_prompt)

    def _kimi_tools(self, tools: list[Any], tools_key: str | None) -> tuple[list[Any] | None, str | None]:
        """Deep-sorted tools + tools_ts_str (None: JSON fallback), cached by the tools' JSON text."""
        cached = self._tools_cache.get(tools_key) if tools_key is not None else None
        if cached is None:
            sorted_tools, tools_ts_str, fallback = compute_tools_ts_str(tools)
            if fallback:
                logger.debug("tools declared as JSON: %s", fallback)
            cached = (sorted_tools, tools_ts_str)
            if tools_key is not None:
                if len(self._tools_cache) >= _TOOLS_CACHE_SIZE:
                    self._tools_cache.clear()
                self._tools_cache[tools_key] = cached
        return cached

    def _apply_template(
        self,
        conversations: list[list[dict[str, Any]]],
        tools: list[Any] | None,
        kwargs: dict[str, Any],
        add_generation_prompt: bool,
    ) -> list[str]:
        texts = self.tokenizer.apply_chat_template(
            conversations,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
            return_dict=False,
            **kwargs,
        )
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise TypeError(f"chat template returned {type(texts).__name__}, expected text")
        return texts

    def render_text(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = True,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """The prompt text exactly as the served model's template produces it. Raises on bad input."""
        request = RenderRequest(messages, tools, add_generation_prompt, template_kwargs)
        template_tools, kwargs, _ = self._prepare(request)
        if self._native is not None:
            text = self._native(messages, template_tools, kwargs, add_generation_prompt)
            if text is not None:
                self.native_rows += 1
                return text
        self.jinja_rows += 1
        return self._apply_template([messages], template_tools, kwargs, add_generation_prompt)[0]

    def _render_texts(
        self, requests: list[RenderRequest], control: dict[int, tuple[str, Any]]
    ) -> list[str | RenderResult]:
        """Text per request, or a failed RenderResult. Equal-key requests share one template call.

        Rows with control-token text in their data are rejected, or noted in `control` (as_served),
        or rendered with placeholders for the literals (as_text: `requests[i]` is replaced, and the
        text returned has the literals back, their spans in `control`).
        """
        out: list[str | RenderResult] = [_failure(RENDER_ERROR, "not rendered")] * len(requests)
        groups: dict[tuple[Any, ...], list[int]] = {}
        prepared: dict[int, tuple[list[Any] | None, dict[str, Any]]] = {}
        native = self._native
        for i, request in enumerate(requests):
            try:
                tools, kwargs, key = self._prepare(request)
                found = find_control_text(self._control_tokens, request.messages, request.tools)
                if found:
                    policy = request.control_text
                    if policy == "reject":
                        out[i] = _failure(CONTROL_TOKEN_IN_CONTENT, describe(found))
                        continue
                    if policy == "as_served":
                        control[i] = ("as_served", None)
                    elif policy == "as_text":
                        request, literals = self._with_placeholders(request)
                        requests[i] = request
                        control[i] = ("as_text", literals)
                        tools, kwargs, key = self._prepare(request)
                    else:
                        raise ValueError(f"control_text {policy!r} is not one of {', '.join(CONTROL_TEXT_POLICIES)}")
            except Exception as e:
                out[i] = _failure(RENDER_ERROR, f"{type(e).__name__}: {e}")
                continue
            if native is not None:
                try:
                    text = native(request.messages, tools, kwargs, request.add_generation_prompt)
                except Exception:  # never expected (it declines instead); Jinja decides
                    text = None
                if text is not None:
                    out[i] = text
                    self.native_rows += 1
                    continue
            self.jinja_rows += 1
            prepared[i] = (tools, kwargs)
            groups.setdefault(key, []).append(i)
        for members in groups.values():
            tools, kwargs = prepared[members[0]]
            add_generation_prompt = requests[members[0]].add_generation_prompt
            try:
                texts = self._apply_template(
                    [requests[i].messages for i in members], tools, kwargs, add_generation_prompt
                )
            except Exception:
                texts = None  # some row is bad: render one by one to find which
            if texts is not None and len(texts) == len(members):
                for i, text in zip(members, texts):
                    out[i] = text
                continue
            for i in members:
                try:
                    out[i] = self._apply_template([requests[i].messages], tools, kwargs, add_generation_prompt)[0]
                except Exception as e:  # a template error on one row must not stop the batch
                    out[i] = _failure(RENDER_ERROR, f"{type(e).__name__}: {e}")
        for i, (mode, literals) in list(control.items()):
            rendered = out[i]
            if mode == "as_text" and isinstance(rendered, str):
                out[i], spans = self._restore_literals(rendered, literals)
                control[i] = ("as_text", spans)
        return out

    # -- literal control-token text (control_text.py) --------------------------------------------

    def _with_placeholders(self, request: RenderRequest) -> tuple[RenderRequest, list[str]]:
        """The request with every control-token literal in its data replaced by a placeholder."""
        assert self._control_tokens is not None
        pattern = self._control_tokens.pattern
        literals: list[str] = []

        def sub(match: re.Match[str]) -> str:
            literals.append(match.group(0))
            return f"{self._placeholder_tag}_{len(literals) - 1}_"

        def walk(value: Any) -> Any:
            if isinstance(value, str):
                return pattern.sub(sub, value)
            if isinstance(value, dict):
                return {walk(k) if isinstance(k, str) else k: walk(v) for k, v in value.items()}
            if isinstance(value, list):
                return [walk(v) for v in value]
            return value

        messages = walk(request.messages)
        tools = walk(request.tools) if request.tools else request.tools
        changed = RenderRequest(
            messages, tools, request.add_generation_prompt, request.template_kwargs, None, request.control_text
        )
        return changed, literals

    def _restore_literals(self, text: str, literals: list[str]) -> tuple[str, list[tuple[int, int]]]:
        """The text with the placeholders back to their literals, and the literals' (start, end) in it."""
        parts: list[str] = []
        spans: list[tuple[int, int]] = []
        pos = length = 0
        for match in self._placeholder.finditer(text):
            before = text[pos : match.start()]
            parts.append(before)
            length += len(before)
            literal = literals[int(match.group(1))]
            parts.append(literal)
            spans.append((length, length + len(literal)))
            length += len(literal)
            pos = match.end()
        parts.append(text[pos:])
        return "".join(parts), spans

    def _encode_plain(self, text: str) -> list[int]:
        """Text encoded as ordinary text: normalizer, pre-tokenizer and model, no added-token matching."""
        backend = self._backend
        if backend.normalizer is not None:
            text = backend.normalizer.normalize_str(text)
        pieces = backend.pre_tokenizer.pre_tokenize_str(text) if backend.pre_tokenizer is not None else [(text, None)]
        model = backend.model
        return [token.id for piece, _ in pieces for token in model.tokenize(piece)]

    def _encode_as_text(self, text: str, spans: list[tuple[int, int]]) -> list[int]:
        """Ids of `text` where the template's control tokens are special ids and the literals in
        `spans` (from the data) are ordinary text, as split_special_tokens=True would encode them.

        The encode splits at added tokens and encodes the pieces between them on their own; so
        does this, skipping the token matches that lie in a literal's span.
        """
        assert self._control_tokens is not None
        token_ids = self._control_tokens.ids
        ids: list[int] = []
        pos = 0
        span_iter = iter(spans)
        span = next(span_iter, None)
        for match in self._control_tokens.pattern.finditer(text):
            while span is not None and span[1] <= match.start():
                span = next(span_iter, None)
            if span is not None and span[0] < match.end() and match.start() < span[1]:
                continue  # the data's literal: ordinary text
            piece = text[pos : match.start()]
            if piece:
                ids.extend(self._encode_plain(piece))
            ids.append(token_ids[match.group(0)])
            pos = match.end()
        if pos < len(text):
            ids.extend(self._encode_plain(text[pos:]))
        return ids

    # -- ids -----------------------------------------------------------------------------------

    def encode_texts(self, texts: Sequence[str]) -> list[list[int]]:
        """One batched encode, no special tokens added (the template already has them all)."""
        if not texts:
            return []
        return [encoding.ids for encoding in self._backend.encode_batch_fast(list(texts), add_special_tokens=False)]

    def _encode_one(self, text: str) -> list[int] | RenderResult:
        try:
            return self._backend.encode(text, add_special_tokens=False).ids
        except Exception as e:
            return _failure(RENDER_ERROR, f"encode failed: {type(e).__name__}: {e}")

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = True,
        template_kwargs: dict[str, Any] | None = None,
    ) -> RenderResult:
        request = RenderRequest(messages, tools, add_generation_prompt, template_kwargs)
        return self.render_batch([request])[0]

    def render_batch(self, requests: Sequence[RenderRequest]) -> list[RenderResult]:
        """Render and encode every request; failures come back as results with a reason, never raised."""
        pending = [
            self.submit_batch(requests[start : start + self.chunk_rows])
            for start in range(0, len(requests), self.chunk_rows)
        ]
        return [result for batch in pending for result in batch.results()]

    def submit_batch(self, requests: Sequence[RenderRequest]) -> PendingRender:
        """Render the texts now and start their one batched encode on a worker thread.

        Speed: the Rust tokenizer releases the GIL while it encodes, so a caller can render (or
        parse) the next chunk while this one encodes. Collect with `.results()`, in order.
        """
        failures: dict[int, RenderResult] = {}
        positions: list[int] = []
        texts: list[str] = []
        requests = list(requests)
        control: dict[int, tuple[str, Any]] = {}
        for position, rendered in enumerate(self._render_texts(requests, control)):
            if isinstance(rendered, RenderResult):
                failures[position] = rendered
            else:
                positions.append(position)
                texts.append(rendered)
        future = self._encoder().submit(self._backend.encode_batch_fast, texts, False) if texts else None
        return PendingRender(self, requests, failures, positions, texts, future, control)

    def _encoder(self) -> ThreadPoolExecutor:
        # One worker: a chunk encodes while the caller renders the next; Rust parallelises each chunk.
        if self._encode_pool is None:
            self._encode_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="eagle3-encode")
        return self._encode_pool

    def _checked(self, request: RenderRequest, text: str, ids: list[int], scan: bool = True) -> RenderResult:
        # scan=False: the caller knows every id is below the limit (ids are unsigned, never negative)
        if scan and ids and (max(ids) >= self._vocab_limit or min(ids) < 0):
            out_of_vocab = [i for i in ids if i >= self._vocab_limit or i < 0]
            return _failure(
                ID_OUT_OF_VOCAB,
                f"{len(out_of_vocab)} id(s) outside the vocabulary (limit {self._vocab_limit}), "
                f"first {out_of_vocab[0]}",
            )
        # Guard against a tokenizer/template that does not match the profile (e.g. a K2-Thinking
        # template under the K2.5 profile): in the profile's own mode the prompt must end with <think>.
        if (
            self.profile.generation_prompt_ends_with_think_start
            and request.add_generation_prompt
            and not request.template_kwargs
            and (not ids or ids[-1] != self.profile.think_start_id)
        ):
            return _failure(
                GENERATION_PROMPT_MISMATCH,
                f"profile {self.profile.name!r} expects the generation prompt to end with "
                f"think_start_id {self.profile.think_start_id}, got {ids[-1] if ids else 'an empty prompt'}",
            )
        return RenderResult(text=text, input_ids=ids)
