"""`eagle3 render --model PROFILE IN.jsonl OUT.jsonl`: see exactly what the pipeline would send.

Each input line: {"messages": [...], "tools": [...]?, "add_generation_prompt": bool?, "template_kwargs": {...}?}.
Each output line: the input plus `text`, `input_ids` and `prompt_len`, or plus `error`
({"reason", "detail"}). One output line per non-blank input line, in order. It renders through the
same PromptRenderer.render_batch and length check as the pipeline's tokenize stage.

Exit status: 0 when every line rendered, 1 when some lines carry an error, 2 on a usage, profile,
tokenizer or file problem.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any, TextIO

from ..config import settings
from ..profiles import ModelProfile, ProfileError, resolve_profile
from .loading import TokenizerLoadError
from .pipeline import INVALID_JSON, PROMPT_TOO_LONG, prompt_length_problem
from .render import PromptRenderer, RenderRequest

INVALID_REQUEST = "invalid_request"
_BATCH_LINES = 1024


def request_from_record(record: Any) -> tuple[RenderRequest | None, str | None]:
    """Validate one input object; the problem text names the field."""
    if not isinstance(record, dict):
        return None, f"expected a JSON object, got {type(record).__name__}"
    messages = record.get("messages")
    if not isinstance(messages, list) or not messages:
        return None, "messages: required, a non-empty list"
    tools = record.get("tools")
    if tools is not None and not isinstance(tools, list):
        return None, f"tools: expected a list or null, got {type(tools).__name__}"
    add_generation_prompt = record.get("add_generation_prompt", True)
    if not isinstance(add_generation_prompt, bool):
        return None, f"add_generation_prompt: expected true/false, got {add_generation_prompt!r}"
    template_kwargs = record.get("template_kwargs")
    if template_kwargs is not None and not isinstance(template_kwargs, dict):
        return None, f"template_kwargs: expected an object, got {type(template_kwargs).__name__}"
    return RenderRequest(messages, tools or None, add_generation_prompt, template_kwargs or None), None


def _error(reason: str, detail: str) -> dict[str, str]:
    return {"reason": reason, "detail": detail}


def render_lines(lines: list[tuple[int, str]], renderer: PromptRenderer, max_new_tokens: int) -> list[dict[str, Any]]:
    """(line number, raw line) pairs -> output objects, same order."""
    outputs: list[dict[str, Any]] = []
    pending: list[tuple[int, RenderRequest]] = []
    for line_no, raw in lines:
        excerpt = {"line": line_no, "raw": raw.rstrip("\r\n")[:200]}
        try:
            record = json.loads(raw)
        except ValueError as e:
            outputs.append({**excerpt, "error": _error(INVALID_JSON, f"line {line_no}: {e}")})
            continue
        request, problem = request_from_record(record)
        if request is None:
            out = dict(record) if isinstance(record, dict) else excerpt
            out["error"] = _error(INVALID_REQUEST, f"line {line_no}: {problem}")
            outputs.append(out)
            continue
        outputs.append(dict(record))
        pending.append((len(outputs) - 1, request))
    results = renderer.render_batch([request for _, request in pending])
    for (position, _), result in zip(pending, results):
        out = outputs[position]
        if not result.ok:
            out["error"] = _error(result.reason or "render_error", result.detail or "")
            continue
        ids = result.input_ids or []
        out["text"] = result.text
        out["input_ids"] = ids
        out["prompt_len"] = len(ids)
        too_long = prompt_length_problem(len(ids), renderer.profile, max_new_tokens)
        if too_long:
            # Shown, but flagged: the pipeline quarantines this prompt instead of generating for it.
            out["error"] = _error(PROMPT_TOO_LONG, too_long)
    return outputs


def _iter_batches(stream: TextIO):
    batch: list[tuple[int, str]] = []
    for line_no, line in enumerate(stream, start=1):
        if not line.strip():
            continue
        batch.append((line_no, line))
        if len(batch) >= _BATCH_LINES:
            yield batch
            batch = []
    if batch:
        yield batch


def run(args: argparse.Namespace, *, make_renderer: Callable[[ModelProfile], PromptRenderer] = PromptRenderer) -> int:
    """`eagle3 render` with its parsed arguments (app/cli.py declares them); the exit code. make_renderer lets a
    caller reuse a loaded tokenizer."""
    if not args.input.is_file():
        print(f"eagle3 render: input file not found: {args.input}", file=sys.stderr)
        return 2
    try:
        s = settings()
        profile = resolve_profile(args.model, s.storage.models_dir, args.tokenizer or s.model.tokenizer_override)
    except ProfileError as e:
        print(f"eagle3 render: {e}", file=sys.stderr)
        return 2
    try:
        renderer = make_renderer(profile)
    except (TokenizerLoadError, ValueError) as e:
        print(f"eagle3 render: {e}", file=sys.stderr)
        return 2
    max_new_tokens = profile.max_new_tokens_for(args.max_new_tokens)  # as the tokenized_prompts asset

    counts: Counter[str] = Counter()
    args.output.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.output.with_name(f".{args.output.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(args.input, encoding="utf-8") as src, open(tmp, "w", encoding="utf-8") as dst:
            for batch in _iter_batches(src):
                for out in render_lines(batch, renderer, max_new_tokens):
                    counts[out["error"]["reason"] if "error" in out else "ok"] += 1
                    dst.write(json.dumps(out, ensure_ascii=False) + "\n")
        os.replace(tmp, args.output)
    except (OSError, UnicodeDecodeError) as e:
        print(f"eagle3 render: {e}", file=sys.stderr)
        return 2
    finally:
        if tmp.exists():
            tmp.unlink()

    total = sum(counts.values())
    errors = total - counts["ok"]
    by_reason = ", ".join(f"{reason}={n}" for reason, n in sorted(counts.items()) if reason != "ok")
    print(
        f"rendered {counts['ok']}/{total} line(s) with profile {profile.name} "
        f"(template {renderer.template_hash[:12]}, tokenizer {renderer.tokenizer_fingerprint[:12]}); "
        f"errors {errors}{' (' + by_reason + ')' if by_reason else ''} -> {args.output}"
    )
    return 1 if errors else 0
