"""The /generate response shapes, read from SGLang 0.5.23's own source (docs/sglang-schema.md).

Parsed (ast) from the installed sglang package, not written down from memory:

- `tokenizer_manager.py` `_handle_batch_output`: the `meta_info = {...}` literal every output starts with
  (id, finish_reason, prompt_tokens, weight_version, num_retractions), the `meta_info.update({...})` literal
  every generation output gets (reasoning_tokens, completion_tokens, cached_tokens), the keys set under
  `if state.finished:` (e2e_latency); whether `if incremental:` streams send `delta_text` / delta ids;
- `weight_versions` on every finished output and every abort the scheduler sends (output_streamer.py,
  scheduler._make_abort_req, utils/weight_versions.add_weight_versions_to_meta_info);
- `_stream_one_response` (behind `_wait_one_response`): `out["meta_info"][...]` keys set once per request (response_sent_to_client_ts);
- `_handle_abort_req`: the answer to a request aborted in the waiting queue (its own meta_info and
  finish_reason literals);
- every `meta_info["..."] =` key anywhere in tokenizer_manager.py (optional keys: logprobs, spec, dp_rank...);
- `add_logprob_to_meta_info`: the keys return_logprob always adds, those top_logprobs_num > 0 adds, and
  `_INCREMENTAL_STREAMING_META_INFO_KEYS` (the per-token lists an incremental chunk carries for its tokens only);
- `schedule_batch.py`: each finish reason's `to_json()` literal ({"type": "stop", "matched"}, ...);
- `entrypoints/http_server.py` `serve_generate_request`: the in-stream `{"error": {...}}` chunk.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any


def _function(tree: ast.AST, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node
    raise AssertionError(f"SGLang source has no function {name} (SGLang changed: re-read it)")


def _keys(d: ast.Dict) -> set[str]:
    return {k.value for k in d.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}


def _dict_assigned(node: ast.AST, var: str) -> list[ast.Dict]:
    return [
        n.value
        for n in ast.walk(node)
        if isinstance(n, ast.Assign)
        and isinstance(n.value, ast.Dict)
        and any(isinstance(t, ast.Name) and t.id == var for t in n.targets)
    ]


def _subscript_keys(node: ast.AST, var: str) -> set[str]:
    """Keys of `var["key"] = ...` assignments under `node`."""
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Assign):
            for t in n.targets:
                if (
                    isinstance(t, ast.Subscript)
                    and isinstance(t.value, ast.Name)
                    and t.value.id == var
                    and isinstance(t.slice, ast.Constant)
                ):
                    out.add(t.slice.value)
    return out


def _update_keys(node: ast.AST, var: str) -> set[str]:
    out: set[str] = set()
    for n in ast.walk(node):
        if (
            isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute)
            and n.func.attr == "update"
            and isinstance(n.func.value, ast.Name)
            and n.func.value.id == var
            and n.args
            and isinstance(n.args[0], ast.Dict)
        ):
            out |= _keys(n.args[0])
    return out


def _under_if(node: ast.AST, test: str) -> list[ast.If]:
    return [n for n in ast.walk(node) if isinstance(n, ast.If) and ast.unparse(n.test) == test]


@dataclass(frozen=True)
class ResponseShapes:
    base: frozenset[str]  # every output's meta_info (the first literal)
    generation: frozenset[str]  # added to every generation output (the update literal)
    finished: frozenset[str]  # only on the finished output
    first_sent: frozenset[str]  # once per request: the first output sent (stream: first chunk)
    optional: frozenset[str]  # set somewhere, conditionally (logprobs, spec decoding, dp_rank, ...)
    queue_abort_meta: frozenset[str]  # meta_info of a request aborted in the waiting queue
    queue_abort_finish: frozenset[str]  # its finish_reason
    finish_forms: dict[str, frozenset[str]]  # finish_reason "type" -> its keys (to_json)
    stream_error: frozenset[str]  # keys of the in-stream {"error": {...}}
    incremental_text_is_delta: bool
    incremental_ids_are_delta: bool
    logprob_always: frozenset[str]  # return_logprob: always added (add_logprob_to_meta_info, unconditional)
    logprob_top: frozenset[str]  # added when top_logprobs_num > 0
    incremental_keys: frozenset[str]  # per-token lists sliced to the chunk's tokens in incremental streams


def derive(read: Any) -> ResponseShapes:
    """`read(rel_path)` gives a file of the sglang package (SGLangSource.read)."""
    tm = ast.parse(read("srt/managers/tokenizer_manager.py"))
    batch = _function(tm, "_handle_batch_output")
    meta_literals = _dict_assigned(batch, "meta_info")
    assert meta_literals, "_handle_batch_output builds no meta_info literal"
    finished_blocks = _under_if(batch, "state.finished")
    finished = set().union(*(_subscript_keys(b, "meta_info") for b in finished_blocks))
    incremental_blocks = _under_if(batch, "incremental")
    inc_dicts = [d for b in incremental_blocks for d in _dict_assigned(b, "out_dict")]
    inc_values = [
        {k.value: ast.unparse(v) for k, v in zip(d.keys, d.values) if isinstance(k, ast.Constant)} for d in inc_dicts
    ]
    inc_text_delta = any(v.get("text") == "delta_text" for v in inc_values)
    inc_id_names = {v.get("output_ids") for v in inc_values}
    # the ids name an incremental chunk carries is assigned the per-step delta
    ids_delta = any(
        isinstance(n, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id in inc_id_names for t in n.targets)
        and ast.unparse(n.value) == "delta_output_ids"
        for b in incremental_blocks
        for n in ast.walk(b)
    )

    wait = _function(tm, "_stream_one_response")  # what _wait_one_response returns
    first_sent = set()
    for n in ast.walk(wait):
        if (
            isinstance(n, ast.Assign)
            and isinstance(n.targets[0], ast.Subscript)
            and ast.unparse(n.targets[0].value).replace("'", '"') == 'out["meta_info"]'
            and isinstance(n.targets[0].slice, ast.Constant)
        ):
            first_sent.add(n.targets[0].slice.value)

    abort = _function(tm, "_handle_abort_req")
    abort_meta = _keys(_dict_assigned(abort, "meta_info")[0]) | _subscript_keys(abort, "meta_info")
    abort_finish = _keys(_dict_assigned(abort, "finish_reason")[0])

    optional = _subscript_keys(tm, "meta_info")

    # weight_versions: add_weight_versions_to_meta_info (utils/weight_versions.py) sets it whenever the output
    # carries spans; the scheduler computes them for every finished request (output_streamer, under
    # `if req.finished():`) and for every abort it sends (_make_abort_req).
    # (it also overwrites weight_version, a key every output has, with the last span's version)
    wv_keys = _subscript_keys(ast.parse(read("srt/utils/weight_versions.py")), "meta_info") - _keys(meta_literals[0])
    streamer = ast.parse(read("srt/managers/scheduler_components/output_streamer.py"))
    if any("compute_weight_version_spans" in ast.unparse(b) for b in _under_if(streamer, "req.finished()")):
        finished |= wv_keys
    make_abort = _function(ast.parse(read("srt/managers/scheduler.py")), "_make_abort_req")
    if "compute_weight_version_spans" in ast.unparse(make_abort) and "add_weight_versions_to_meta_info" in ast.unparse(
        abort
    ):
        abort_meta |= wv_keys

    lp = _function(tm, "add_logprob_to_meta_info")
    lp_always = set().union(*(_subscript_keys(st, "meta_info") for st in lp.body if not isinstance(st, ast.If)))
    lp_top = set().union(*(_subscript_keys(b, "meta_info") for b in _under_if(lp, "top_logprobs_num > 0")))
    inc_keys = next(
        {e.value for e in n.value.elts if isinstance(e, ast.Constant)}
        for n in tm.body
        if isinstance(n, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "_INCREMENTAL_STREAMING_META_INFO_KEYS" for t in n.targets)
        and isinstance(n.value, ast.Tuple)
    )

    sb = ast.parse(read("srt/managers/schedule_batch.py"))
    forms: dict[str, frozenset[str]] = {}
    for cls in (n for n in sb.body if isinstance(n, ast.ClassDef)):
        for fn in (f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "to_json"):
            for ret in (r for r in ast.walk(fn) if isinstance(r, ast.Return) and isinstance(r.value, ast.Dict)):
                d = ret.value
                assert isinstance(d, ast.Dict)
                type_value = next(
                    v.value
                    for k, v in zip(d.keys, d.values)
                    if isinstance(k, ast.Constant) and k.value == "type" and isinstance(v, ast.Constant)
                )
                keys = frozenset(_keys(d))
                assert forms.get(type_value, keys) == keys, f"two {type_value} forms in schedule_batch.py"
                forms[type_value] = keys

    hs = ast.parse(read("srt/entrypoints/http_server.py"))
    serve = _function(hs, "serve_generate_request")
    err = next(
        v
        for d in ast.walk(serve)
        if isinstance(d, ast.Dict)
        for k, v in zip(d.keys, d.values)
        if isinstance(k, ast.Constant) and k.value == "error" and isinstance(v, ast.Dict)
    )
    return ResponseShapes(
        base=frozenset(_keys(meta_literals[0])),
        generation=frozenset(_update_keys(batch, "meta_info")),
        finished=frozenset(finished),
        first_sent=frozenset(first_sent),
        optional=frozenset(optional),
        queue_abort_meta=frozenset(abort_meta),
        queue_abort_finish=frozenset(abort_finish),
        finish_forms=forms,
        stream_error=frozenset(_keys(err)),
        incremental_text_is_delta=inc_text_delta,
        incremental_ids_are_delta=ids_delta,
        logprob_always=frozenset(lp_always),
        logprob_top=frozenset(lp_top),
        incremental_keys=frozenset(inc_keys),
    )


@dataclass(frozen=True)
class SpecShapes:
    """Speculative decoding as SGLang 0.5.23 reports it (tokenizer_manager._calculate_spec_decoding_metrics)."""

    all_keys: frozenset[str]  # every meta_info key the function can set
    with_drafts: frozenset[str]  # set together whenever drafts were proposed (the `num_proposed_drafts > 0` block)
    histogram_key: str  # set (non-empty) beside them
    only_when_finished: bool  # the call sits under `if state.finished:` in _handle_batch_output
    server_args: frozenset[str]  # the speculative_* fields of ServerArgs' spec namespace (/server_info keys)


def derive_spec(read: Any) -> SpecShapes:
    tm = ast.parse(read("srt/managers/tokenizer_manager.py"))
    fn = _function(tm, "_calculate_spec_decoding_metrics")
    [drafts] = _under_if(fn, "num_proposed_drafts > 0")
    direct = {
        t.slice.value
        for st in drafts.body
        if isinstance(st, ast.Assign)
        for t in st.targets
        if isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant)
    }
    hist = [k for k in _subscript_keys(fn, "meta_info") if k.endswith("histogram") and "correct_drafts" in k]
    batch = _function(tm, "_handle_batch_output")
    finished = any("_calculate_spec_decoding_metrics" in ast.unparse(b) for b in _under_if(batch, "state.finished"))
    spec_ns = ast.parse(read("srt/arg_groups/fields/spec.py"))
    args = {
        n.target.id
        for n in ast.walk(spec_ns)
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.target.id.startswith("speculative_")
    }
    assert len(hist) == 1, f"not one correct-drafts histogram key: {hist}"
    return SpecShapes(
        frozenset(_subscript_keys(fn, "meta_info")), frozenset(direct), hist[0], finished, frozenset(args)
    )


@dataclass(frozen=True)
class ReleaseSpecKeys:
    """The meta_info keys one release's tokenizer_manager._calculate_spec_decoding_metrics sets."""

    keys: tuple[str, ...]  # every key, in the order the source sets them
    cap: frozenset[str]  # set only under a condition on the cap figures (ragged-verify modes, 0.5.18+)
    cap_accept_only: frozenset[str]  # of those, set only in the cap-accept mode


def derive_release_spec(read: Any) -> ReleaseSpecKeys:
    """From any release's source (0.5.9 on): the keys, in order, and which belong to the cap modes."""
    fn = _function(ast.parse(read("srt/managers/tokenizer_manager.py")), "_calculate_spec_decoding_metrics")
    assigned: list[tuple[int, str]] = []
    for n in ast.walk(fn):
        if isinstance(n, ast.Assign):
            for t in n.targets:
                if (
                    isinstance(t, ast.Subscript)
                    and isinstance(t.value, ast.Name)
                    and t.value.id == "meta_info"
                    and isinstance(t.slice, ast.Constant)
                ):
                    assigned.append((n.lineno, t.slice.value))
    cap_ifs = [n for n in ast.walk(fn) if isinstance(n, ast.If) and "cap" in ast.unparse(n.test)]
    cap = {k for b in cap_ifs for k in _subscript_keys(b, "meta_info")}
    accept = {
        k
        for b in cap_ifs
        if "_ragged_verify_cap_accept" in ast.unparse(b.test)
        for k in _subscript_keys(b, "meta_info")
    }
    keys = tuple(k for _, k in sorted(assigned))
    assert len(set(keys)) == len(keys), f"a key set twice: {keys}"
    return ReleaseSpecKeys(keys, frozenset(cap), frozenset(accept))
