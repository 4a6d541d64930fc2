"""The native template renderers (tokenize/native.py) must give exactly the Jinja template's text.

Kimi-K2.5 and Qwen3 are compared on every prompt of every shared dataset the pipeline ingests and
on a large randomised set of conversations built to hit every branch (and many inputs the native
renderer must decline); Kimi also on every golden case. The Jinja side is the renderer with
`native_templates=False`, i.e. transformers' apply_chat_template.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from eagle3_dagster.config import PROJECT_ROOT
from eagle3_dagster.ingest import ingest_source, load_source_specs
from eagle3_dagster.profiles import ModelProfile
from eagle3_dagster.tokenize import PromptRenderer, RenderRequest, compute_tools_ts_str, tokenize_prompts
from eagle3_dagster.tokenize.native import (
    KIMI_K25_TEMPLATE_SHA256,
    QWEN3_TEMPLATE_SHA256,
    native_renderer_for,
    template_sha256,
)

_GOLDEN = PROJECT_ROOT.parent / "shared" / "tokenizers" / "kimi-k2.5" / "golden"
GOLDEN_CASES = (
    json.loads((_GOLDEN / "chat_renders.json").read_text(encoding="utf-8"))["cases"]
    + json.loads((_GOLDEN / "tools_ts_cases.json").read_text(encoding="utf-8"))["cases"]
)
EXAMPLE_SOURCES = PROJECT_ROOT / "examples" / "shared-sources"
N_RANDOM = 4000


@pytest.fixture(scope="module")
def jinja_renderer(kimi_profile: ModelProfile, kimi_tok) -> PromptRenderer:
    renderer = PromptRenderer(kimi_profile, kimi_tok, native_templates=False)
    assert not renderer.native_template
    return renderer


@pytest.fixture(scope="module")
def native_renderer(kimi_profile: ModelProfile, kimi_tok) -> PromptRenderer:
    renderer = PromptRenderer(kimi_profile, kimi_tok)
    assert renderer.native_template, "the native Kimi renderer must be active for the shared Kimi tokenizer"
    return renderer


@pytest.fixture(scope="module")
def qwen_jinja_renderer(qwen_renderer: PromptRenderer) -> PromptRenderer:
    renderer = PromptRenderer(qwen_renderer.profile, qwen_renderer.tokenizer, native_templates=False)
    assert not renderer.native_template
    return renderer


# (native renderer, Jinja renderer) per model
MODELS = ["kimi", "qwen"]


@pytest.fixture(params=MODELS)
def pair(request: pytest.FixtureRequest) -> tuple[PromptRenderer, PromptRenderer]:
    if request.param == "kimi":
        return request.getfixturevalue("native_renderer"), request.getfixturevalue("jinja_renderer")
    native = request.getfixturevalue("qwen_renderer")
    assert native.native_template, "the native Qwen3 renderer must be active for the shared Qwen3 tokenizer"
    return native, request.getfixturevalue("qwen_jinja_renderer")


@pytest.fixture(scope="module")
def shared_prompts(tmp_path_factory: pytest.TempPathFactory) -> pl.DataFrame:
    """Every prompt the ingest stage accepts from every shared dataset (per source, before dedup)."""
    out = tmp_path_factory.mktemp("native-sources")
    frames = []
    for spec in load_source_specs(EXAMPLE_SOURCES):
        ingest_source(spec, out / spec.name, n_shards=1)
        frames.append(pl.read_parquet(out / spec.name / "accepted.parquet"))
    return pl.concat(frames, how="vertical_relaxed")


def _native_text(renderer: PromptRenderer, request: RenderRequest) -> str | None:
    """The native renderer's text for a request (None: it declines), given what the renderer prepares."""
    tools, kwargs, _ = renderer._prepare(request)
    assert renderer._native is not None
    return renderer._native(request.messages, tools, kwargs, request.add_generation_prompt)


def _jinja_text(renderer: PromptRenderer, request: RenderRequest) -> str:
    tools, kwargs, _ = renderer._prepare(request)
    return renderer._apply_template([request.messages], tools, kwargs, request.add_generation_prompt)[0]


# -- goldens -----------------------------------------------------------------------------------


@pytest.mark.parametrize("case", GOLDEN_CASES, ids=lambda c: c["name"])
def test_native_render_of_every_golden_case(
    native_renderer: PromptRenderer, jinja_renderer: PromptRenderer, case: dict[str, Any]
) -> None:
    request = RenderRequest(case["messages"], case["tools"], case["add_generation_prompt"], case["template_kwargs"])
    native = _native_text(native_renderer, request)
    assert native is not None, "the native renderer declined a golden case"
    assert native == case["text"] == _jinja_text(jinja_renderer, request)
    (result,) = native_renderer.render_batch([request])
    assert result.text == case["text"] and result.input_ids == case["input_ids"]


# -- every shared-dataset prompt -------------------------------------------------------------


def _requests(frame: pl.DataFrame) -> list[RenderRequest]:
    return [
        RenderRequest(json.loads(m), json.loads(t) if t else None, tools_key=t)
        for m, t in zip(frame["messages"].to_list(), frame["tools"].to_list())
    ]


def test_native_equals_jinja_on_every_shared_dataset_prompt(
    shared_prompts: pl.DataFrame, pair: tuple[PromptRenderer, PromptRenderer]
) -> None:
    native_renderer, jinja_renderer = pair
    requests = _requests(shared_prompts)
    assert len(requests) >= 4793
    declined = [i for i, r in enumerate(requests) if _native_text(native_renderer, r) is None]
    assert declined == [], f"native renderer declined {len(declined)} dataset prompts (slow path)"
    native = native_renderer.render_batch(requests)
    jinja = jinja_renderer.render_batch(requests)
    for i, (a, b) in enumerate(zip(native, jinja, strict=True)):
        assert a.ok and b.ok, (i, a.detail, b.detail)
        assert a.text == b.text, f"row {i} ({shared_prompts['prompt_id'][i]}): text differs"
        assert a.input_ids == b.input_ids, f"row {i}: ids differ"
    sources = set(shared_prompts["source"].to_list())
    assert len(sources) == len(load_source_specs(EXAMPLE_SOURCES))


def test_native_ids_equal_apply_chat_template_tokenize_on_shared_datasets(
    shared_prompts: pl.DataFrame, pair: tuple[PromptRenderer, PromptRenderer]
) -> None:
    """Independent reference: transformers' own tokenize=True path, row by row."""
    native_renderer = pair[0]
    tok, kimi = native_renderer.tokenizer, native_renderer.profile.template_family == "kimi_ts"
    requests = _requests(shared_prompts)
    results = native_renderer.render_batch(requests)
    for request, result in zip(requests, results, strict=True):
        kwargs = dict(native_renderer.profile.template_kwargs)
        tools = request.tools
        if tools and kimi:
            tools, ts, _ = compute_tools_ts_str(tools)
            if ts:
                kwargs["tools_ts_str"] = ts
        reference = tok.apply_chat_template(
            request.messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False, **kwargs
        )
        assert result.input_ids == list(reference)


def test_pipeline_frames_identical_native_vs_jinja(
    shared_prompts: pl.DataFrame, pair: tuple[PromptRenderer, PromptRenderer]
) -> None:
    native_renderer, jinja_renderer = pair
    max_new = native_renderer.profile.sampling.max_new_tokens
    fast_ok, fast_bad = tokenize_prompts(shared_prompts, native_renderer, max_new_tokens=max_new)
    slow_ok, slow_bad = tokenize_prompts(shared_prompts, jinja_renderer, max_new_tokens=max_new)
    assert fast_ok.height == shared_prompts.height
    assert_frame_equal(fast_ok, slow_ok)
    assert_frame_equal(fast_bad, slow_bad)


# -- randomised conversations ----------------------------------------------------------------

_TEXTS = [
    "",
    "hi",
    "What is 2+2?",
    "  leading and trailing  ",
    "line1\nline2\n\n",
    "中文 é 🙂",
    "<|im_end|>",
    "<think>x</think>",
    "{{ messages }}",
    "{% if x %}y{% endif %}",
    "## Return of x",
    "\\n \" ' <b>&",
    "None",
    "<|tool_call_begin|>",
    "\t",
    "a" * 300,
    "<think>\nreason\n</think>\n\nanswer",
    "</think>",
    "\n<think>r</think>",
    "<tool_response>x</tool_response>",
    "<tool_response>",
    "<|im_start|>",
]
_WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather <now> é",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
_SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "parameters": {"type": "object", "properties": {"q": {"type": "string", "description": "query"}}},
    },
}
_PLUGIN = {"type": "_plugin", "name": "web", "config": {"z": 1, "a": [{"y": 2, "b": 3}]}}
_BAD_SCHEMA = {
    "type": "function",
    "function": {"name": "bad", "parameters": {"type": "object", "properties": {"x": {"oneOf": [{"const": 1}]}}}},
}
_TOOLSETS: list[list[dict[str, Any]] | None] = [
    None,
    None,
    None,
    [],
    [_WEATHER],
    [_WEATHER, _SEARCH],
    [_PLUGIN],
    [_WEATHER, _BAD_SCHEMA],
]
_MISSING = object()


def _pick(rng: random.Random, options: list[Any]) -> Any:
    return options[rng.randrange(len(options))]


def _text(rng: random.Random) -> str:
    return "".join(_pick(rng, _TEXTS) for _ in range(rng.randint(1, 3)))


def _content(rng: random.Random, wild: bool) -> Any:
    roll = rng.random() if wild else rng.random() * 0.9
    if roll < 0.70:
        return _text(rng)
    if roll < 0.78:
        return _pick(rng, [None, _MISSING])
    if roll < 0.90:
        return [{"type": "text", "text": _text(rng)} for _ in range(rng.randint(0, 3))]
    return _pick(
        rng,
        [  # shapes the native renderer must decline (or that the template mangles)
            [{"type": "image_url", "image_url": {"url": "x"}}, {"type": "text", "text": "t"}],
            [{"type": "video", "video": "v"}],
            [{"type": "text"}],
            [{"text": "no type"}],
            [{"type": "text", "text": None}],
            ["bare string part"],
            {"type": "text", "text": "a dict, not a list"},
            42,
            [],
        ],
    )


def _tool_call(rng: random.Random, i: int, wild: bool) -> Any:
    args = _pick(
        rng,
        [
            {"city": _text(rng)},
            {"city": "Paris", "days": 3, "opts": [1, 2.5, None, True, {"k": "é"}]},
            json.dumps({"city": "Paris"}),
            "",
            "not json {",
            [1, 2],
            None,
            7,
            {},
        ],
    )
    call: Any = {
        "id": f"functions.get_weather:{i}",
        "type": "function",
        "function": {"name": "get_weather", "arguments": args},
    }
    if rng.random() < 0.1:  # an OpenAI-less shape: name and arguments on the call itself (Qwen reads it)
        call = {"id": f"functions.get_weather:{i}", "name": "get_weather", "arguments": args}
    roll = rng.random()
    if roll < 0.85 or not wild:
        return call
    broken = json.loads(json.dumps(call))
    if roll < 0.88:
        del broken["id"]
    elif roll < 0.91:
        broken["id"] = 3
    elif roll < 0.94:
        del broken.get("function", broken)["arguments"]
    elif roll < 0.97:
        broken["function"] = "get_weather"
    else:
        return "not a dict"
    return broken


def _message(rng: random.Random, role: str, wild: bool) -> dict[str, Any]:
    """A message; `wild` adds shapes the native renderer declines (non-string fields, malformed calls)."""
    message: dict[str, Any] = {"role": role}
    content = _content(rng, wild)
    if content is not _MISSING:
        message["content"] = content
    if rng.random() < 0.1:
        message["name"] = _pick(rng, ["alice", "", None, 5, False, "工具"] if wild else ["alice", "", None, "工具"])
    if role == "assistant":
        roll = rng.random()
        if roll < 0.35:
            message["tool_calls"] = [_tool_call(rng, i, wild) for i in range(rng.randint(1, 3))]
        elif roll < 0.45:
            message["tool_calls"] = _pick(rng, [[], None, {"id": "x"}, "calls"] if wild else [[], None])
        for field in ("reasoning_content", "thinking", "reasoning"):
            if rng.random() < 0.25:
                message[field] = _pick(rng, [_text(rng), _text(rng), "", None] + ([1, True] if wild else []))
    if role == "tool":
        roll = rng.random()
        if roll < 0.8:
            message["tool_call_id"] = f"functions.get_weather:{rng.randint(0, 2)}"
        elif roll < 0.9:
            message["tool_call_id"] = _pick(rng, [None, 7, ""] if wild else [None, ""])
    if rng.random() < 0.05:
        message["extra_key"] = {"ignored": True}
    return message


def _random_request(rng: random.Random, thinking_kwarg: str = "thinking") -> RenderRequest:
    roles = ["user", "assistant", "system", "tool", "developer", "function", "USER"]
    weights = [35, 30, 10, 15, 4, 3, 3]
    wild = rng.random() < 0.4
    messages = [_message(rng, rng.choices(roles, weights)[0], wild) for _ in range(rng.randint(1, 9))]
    tools = _pick(rng, _TOOLSETS)
    think = thinking_kwarg
    template_kwargs = _pick(
        rng,
        [None, None, None, {think: False}, {think: True}, {think: None}]
        + ([{"tools_ts_str": "# custom\n"}, {"tools_ts_str": ""}] if think == "thinking" else [])
        + ([{think: 0}, {think: "false"}, {"other_kwarg": 1}] if wild else []),
    )
    return RenderRequest(
        messages,
        tools,
        add_generation_prompt=rng.random() < 0.8,
        template_kwargs=template_kwargs,
        tools_key=json.dumps(tools) if tools is not None and rng.random() < 0.5 else None,
        # the generator puts control-token text into the data on purpose: compare it as served
        control_text="as_served",
    )


def _random_requests(native_renderer: PromptRenderer) -> list[RenderRequest]:
    rng = random.Random(20260801)
    kwarg = "thinking" if native_renderer.profile.template_family == "kimi_ts" else "enable_thinking"
    return [_random_request(rng, kwarg) for _ in range(N_RANDOM)]


def test_native_equals_jinja_on_random_conversations(pair: tuple[PromptRenderer, PromptRenderer]) -> None:
    native_renderer, jinja_renderer = pair
    random_requests = _random_requests(native_renderer)
    rendered = declined = jinja_errors = 0
    for i, request in enumerate(random_requests):
        try:
            native = _native_text(native_renderer, request)
        except ValueError:  # _prepare's validation: neither path renders it
            continue
        try:
            reference: str | None = _jinja_text(jinja_renderer, request)
        except Exception:
            reference = None
            jinja_errors += 1
        if native is None:
            declined += 1
            continue
        rendered += 1
        assert reference is not None, f"case {i}: native rendered a conversation the template rejects"
        assert native == reference, f"case {i}: native text differs from the template\n{request!r}"
    # the generator must exercise both the native path and its declines, and template errors
    assert rendered >= N_RANDOM // 2 and declined >= N_RANDOM // 10 and jinja_errors > 0, (
        rendered,
        declined,
        jinja_errors,
    )


def test_render_batch_results_identical_native_vs_jinja(pair: tuple[PromptRenderer, PromptRenderer]) -> None:
    """Whole RenderResults (text, ids, failure reason and detail), through the batched entry point."""
    native_renderer, jinja_renderer = pair
    random_requests = _random_requests(native_renderer)
    native = native_renderer.render_batch(random_requests)
    jinja = jinja_renderer.render_batch(random_requests)
    assert native == jinja
    assert sum(r.ok for r in native) >= N_RANDOM // 2


Case = tuple[list[dict[str, Any]], dict[str, Any] | None, bool]  # messages, template kwargs, generation prompt


def _assert_native_equals_jinja(renderers: tuple[PromptRenderer, PromptRenderer], case: Case) -> None:
    """The native renderer handles the case, with no tools and with each tool set, exactly as jinja."""
    native_renderer, jinja_renderer = renderers
    messages, template_kwargs, add_generation_prompt = case
    for tools in (None, [_WEATHER], [_PLUGIN]):
        request = RenderRequest(messages, tools, add_generation_prompt, template_kwargs)
        native = _native_text(native_renderer, request)
        assert native is not None, "expected the native renderer to handle this case"
        assert native == _jinja_text(jinja_renderer, request)


@pytest.mark.parametrize(
    "messages, template_kwargs",
    [
        ([{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hi"}], None),
        ([{"role": "user", "content": ""}], None),
        ([{"role": "user", "content": None}], None),
        ([{"role": "user"}], None),
        ([{"role": "user", "content": [{"type": "text", "text": "part one "}, {"type": "text", "text": "two"}]}], None),
        (
            [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": "a", "reasoning_content": "why"},
                {"role": "user", "content": "q2"},
            ],
            None,
        ),
        (
            [
                {"role": "user", "content": "q"},
                {
                    "role": "assistant",
                    "content": "",
                    "reasoning_content": "plan",
                    "tool_calls": [{"id": "functions.f:0", "function": {"name": "f", "arguments": {"a": "é"}}}],
                },
                {"role": "tool", "content": "42", "tool_call_id": "functions.f:0"},
            ],
            None,
        ),
        (
            [
                {"role": "user", "content": "q"},
                {
                    "role": "assistant",
                    "content": "",
                    "reasoning_content": "plan",
                    "tool_calls": [{"id": "functions.f:0", "function": {"name": "f", "arguments": '{"a":1}'}}],
                },
                {"role": "tool", "content": "42", "tool_call_id": "functions.f:0"},
            ],
            {"thinking": False},
        ),
        (
            [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "reasoning": "old field name"}],
            None,
        ),
        ([{"role": "user", "content": "q", "name": "alice"}, {"role": "tool", "content": "r"}], None),
    ],
)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_edge_cases_rendered_natively_and_equal(
    native_renderer: PromptRenderer,
    jinja_renderer: PromptRenderer,
    messages: list[dict[str, Any]],
    template_kwargs: dict[str, Any] | None,
    add_generation_prompt: bool,
) -> None:
    _assert_native_equals_jinja((native_renderer, jinja_renderer), (messages, template_kwargs, add_generation_prompt))


@pytest.mark.parametrize(
    "messages, template_kwargs",
    [
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}], None),  # media part
        ([{"role": "user", "content": {"type": "text", "text": "x"}}], None),  # dict content
        ([{"role": "assistant", "content": "a", "reasoning_content": 5}, {"role": "user", "content": "q"}], None),
        ([{"role": "user", "content": "q", "name": 7}], None),
        ([{"role": "tool", "content": "r", "tool_call_id": 3}], None),
        ([{"role": "assistant", "content": "", "tool_calls": [{"function": {"arguments": "{}"}}]}], None),  # no id
        ([{"role": "user", "content": "q"}], {"unknown_kwarg": True}),
        ([{"role": "user", "content": "q"}], {"thinking": "no"}),
    ],
)
def test_native_declines_what_it_does_not_model(
    native_renderer: PromptRenderer,
    jinja_renderer: PromptRenderer,
    messages: list[dict[str, Any]],
    template_kwargs: dict[str, Any] | None,
) -> None:
    request = RenderRequest(messages, None, True, template_kwargs)
    assert _native_text(native_renderer, request) is None
    # ...and the renderer then gives exactly what the Jinja path gives (text or failure)
    assert native_renderer.render_batch([request]) == jinja_renderer.render_batch([request])


# -- gating -------------------------------------------------------------------------------------


class _FakeTokenizer:
    def __init__(self, chat_template: str, special_tokens_map: dict[str, str] | None = None) -> None:
        self.chat_template = chat_template
        self.special_tokens_map = special_tokens_map or {}


def test_native_only_for_the_exact_template_hash(kimi_tok, native_renderer: PromptRenderer) -> None:
    assert template_sha256(kimi_tok.chat_template) == KIMI_K25_TEMPLATE_SHA256
    apply = native_renderer._apply_template
    assert native_renderer_for(_FakeTokenizer(kimi_tok.chat_template), apply) is not None
    assert native_renderer_for(_FakeTokenizer(kimi_tok.chat_template + " "), apply) is None
    assert (
        native_renderer_for(_FakeTokenizer(kimi_tok.chat_template.replace("## Return of", "## Result of")), apply)
        is None
    )


def test_native_disabled_when_special_tokens_shadow_template_variables(
    kimi_tok, native_renderer: PromptRenderer
) -> None:
    fake = _FakeTokenizer(kimi_tok.chat_template, {"thinking": "<x>"})
    assert native_renderer_for(fake, native_renderer._apply_template) is None


def test_native_disabled_when_a_probe_differs(kimi_tok, native_renderer: PromptRenderer) -> None:
    """E.g. a transformers version that preprocesses messages differently: the probe comparison catches it."""

    def slightly_different(conversations, tools, kwargs, add_generation_prompt):
        texts = native_renderer._apply_template(conversations, tools, kwargs, add_generation_prompt)
        return [t.replace("<|im_end|>", "<|im_end|>\n", 1) if "tool_declare" in t else t for t in texts]

    def failing(*args):
        raise RuntimeError("template error")

    assert native_renderer_for(_FakeTokenizer(kimi_tok.chat_template), slightly_different) is None
    assert native_renderer_for(_FakeTokenizer(kimi_tok.chat_template), failing) is None


def test_qwen_native_only_for_its_template(qwen_renderer: PromptRenderer) -> None:
    template = qwen_renderer.tokenizer.chat_template
    assert template_sha256(template) == QWEN3_TEMPLATE_SHA256
    apply = qwen_renderer._apply_template
    assert native_renderer_for(_FakeTokenizer(template, {"eos_token": "<|im_end|>"}), apply) is not None
    assert native_renderer_for(_FakeTokenizer(template.replace("<tool_call>", "<call>")), apply) is None
    assert native_renderer_for(_FakeTokenizer(template, {"enable_thinking": "x"}), apply) is None


@pytest.mark.parametrize(
    "messages, template_kwargs",
    [
        ([{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hi"}], None),
        (
            [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": "<think>\nr\n</think>\n\na"},
                {"role": "user", "content": "q2"},
            ],
            None,
        ),
        (
            [
                {"role": "user", "content": "q"},
                {
                    "role": "assistant",
                    "content": "",
                    "reasoning_content": "plan",
                    "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": {"a": "é"}}}],
                },
                {"role": "tool", "content": "42"},
                {"role": "tool", "content": "43"},
            ],
            None,
        ),
        (
            [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "reasoning": "old field name"}],
            {"enable_thinking": False},
        ),
        ([{"role": "user", "content": [{"type": "text", "text": "parts are not strings here"}]}], None),
        ([{"role": "user", "content": None}, {"role": "system", "content": "late"}], None),
    ],
)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_qwen_edge_cases_rendered_natively_and_equal(
    qwen_renderer: PromptRenderer,
    qwen_jinja_renderer: PromptRenderer,
    messages: list[dict[str, Any]],
    template_kwargs: dict[str, Any] | None,
    add_generation_prompt: bool,
) -> None:
    _assert_native_equals_jinja(
        (qwen_renderer, qwen_jinja_renderer), (messages, template_kwargs, add_generation_prompt)
    )


@pytest.mark.parametrize(
    "messages, template_kwargs",
    [
        ([{"role": "system", "content": [{"type": "text", "text": "x"}]}, {"role": "user", "content": "q"}], None),
        ([{"role": "system"}, {"role": "user", "content": "q"}], None),
        ([{"role": "user", "content": {"type": "text", "text": "x"}}], None),
        ([{"role": "assistant", "content": "", "tool_calls": [{"function": {"arguments": "{}"}}]}], None),  # no name
        ([{"role": "user", "content": "q"}], {"thinking": False}),  # Kimi's kwarg, not Qwen's
        ([{"role": "user", "content": "q"}], {"enable_thinking": 0}),
    ],
)
def test_qwen_native_declines_what_it_does_not_model(
    qwen_renderer: PromptRenderer,
    qwen_jinja_renderer: PromptRenderer,
    messages: list[dict[str, Any]],
    template_kwargs: dict[str, Any] | None,
) -> None:
    request = RenderRequest(messages, None, True, template_kwargs)
    assert _native_text(qwen_renderer, request) is None
    assert qwen_renderer.render_batch([request]) == qwen_jinja_renderer.render_batch([request])


def test_dataset_fixture_covers_every_example_source(shared_prompts: pl.DataFrame, datasets_dir: Path) -> None:
    assert set(shared_prompts["source"].to_list()) == {p.name for p in datasets_dir.iterdir() if p.is_dir()}


def test_vocabulary_check_per_row_when_a_chunk_has_an_out_of_vocab_id(kimi_profile: ModelProfile, kimi_tok) -> None:
    """The chunk-level max decides whether rows are scanned; only the offending row is quarantined."""
    import dataclasses

    narrow = PromptRenderer(dataclasses.replace(kimi_profile, vocab_size=163602), kimi_tok)  # <think> is 163606
    requests = [
        RenderRequest([{"role": "user", "content": text}], add_generation_prompt=False, control_text="as_served")
        for text in ("hi", "a <think> b", "there")  # as served: the literal <think> becomes id 163606
    ]
    results = narrow.render_batch(requests)
    assert [r.reason for r in results] == [None, "id_out_of_vocab", None]
    assert results[0].input_ids == PromptRenderer(kimi_profile, kimi_tok).render_batch(requests[:1])[0].input_ids


# -- multi-turn conversations with the model's own earlier turns (issue 16) -----------------------

N_MULTI_TURN = 400


def _multi_turn_conversation(rng: random.Random, kimi: bool) -> tuple[list[dict[str, Any]], bool]:
    """A conversation as an all-turns regeneration renders it: user turns, each answered by an
    assistant turn (reasoning_content, content, maybe tool calls -> tool results -> assistant ...).

    Returns (messages, add_generation_prompt): ends on a user or tool message (a prompt for the
    next turn) or on an assistant turn (a whole conversation, no generation prompt).
    """
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.3:
        messages.append({"role": "system", "content": _pick(rng, ["sys", "You are terse.", "中文 é"])})
    n_calls = 0
    for _ in range(rng.randint(1, 4)):
        messages.append({"role": "user", "content": _pick(rng, ["q", "What is 2+2?", "line1\nline2", "中文 🙂"])})
        for _ in range(rng.choice([0, 0, 1, 1, 2, 3])):  # tool-call rounds in this turn
            k = rng.choice([1, 1, 2, 3])  # calls in one assistant turn
            calls = []
            for _ in range(k):
                name = _pick(rng, ["get_weather", "search"])
                args = _pick(rng, [{"city": "Paris"}, {"q": "é <&>", "n": [1, 2.5, None]}, {}])
                if rng.random() < 0.5:  # the model's own bytes, as tokenize/parse.py keeps them
                    args = json.dumps(args, ensure_ascii=rng.random() < 0.5)
                call_id = f"functions.{name}:{n_calls}" if kimi else f"call_{n_calls}"
                calls.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": args}})
                n_calls += 1
            messages.append(
                {
                    "role": "assistant",
                    "content": _pick(rng, ["", "", "I'll call a tool.", "\n\nchecking"]),
                    "reasoning_content": _pick(rng, ["plan", "", "\nr\n", "think <b> é"]),
                    "tool_calls": calls,
                }
            )
            for c in calls:
                messages.append(
                    {
                        "role": "tool",
                        "content": _pick(rng, ["42", "", '{"t": 21}', "<html>x</html>"]),
                        "tool_call_id": c["id"],
                    }
                )
        final: dict[str, Any] = {"role": "assistant", "content": _pick(rng, ["a", "", "\n\nanswer", "答案 4"])}
        if rng.random() < 0.8:
            final["reasoning_content"] = _pick(rng, ["why", "", "\nlong\nreasoning\n"])
        messages.append(final)
    cut = rng.random()
    if cut < 0.4:
        messages.append({"role": "user", "content": "next?"})
        return messages, True
    if cut < 0.7:  # a prompt in the middle of the last turn: after a tool result or a user message
        stops = [i for i, m in enumerate(messages) if m["role"] in ("user", "tool")]
        return messages[: _pick(rng, stops) + 1], True
    return messages, False


@pytest.mark.parametrize("model", MODELS)
def test_multi_turn_history_turns_native_equals_apply_chat_template_text_and_ids(
    model: str, request: pytest.FixtureRequest
) -> None:
    """Every such conversation renders natively (no Jinja fallback) to exactly the template's text,
    and to exactly the ids of transformers' apply_chat_template(tokenize=True); with and without
    tools, thinking on and off. Counted through the renderer's native/Jinja row counters."""
    native_renderer, jinja_renderer = _pair_for(model, request)
    kimi = model == "kimi"
    think = "thinking" if kimi else "enable_thinking"
    rng = random.Random(160016)
    requests = []
    for _ in range(N_MULTI_TURN):
        messages, gen = _multi_turn_conversation(rng, kimi)
        tools = _pick(rng, [None, [_WEATHER, _SEARCH]])
        kwargs = _pick(rng, [None, None, {think: False}])
        requests.append(RenderRequest(messages, tools, gen, kwargs, tools_key=json.dumps(tools)))
    before_native, before_jinja = native_renderer.native_rows, native_renderer.jinja_rows
    native = native_renderer.render_batch(requests)
    assert native_renderer.jinja_rows - before_jinja == 0, "the native renderer declined multi-turn rows"
    assert native_renderer.native_rows - before_native == N_MULTI_TURN
    jinja_before = jinja_renderer.jinja_rows
    jinja = jinja_renderer.render_batch(requests)
    assert jinja_renderer.jinja_rows - jinja_before == N_MULTI_TURN and jinja_renderer.native_rows == 0
    tok = native_renderer.tokenizer
    kept_history_reasoning = dropped_history_reasoning = 0
    for i, (req, a, b) in enumerate(zip(requests, native, jinja, strict=True)):
        assert a.ok and b.ok, (i, a.detail, b.detail)
        assert a.text == b.text, f"case {i}: native text differs from the template\n{req!r}"
        tools = req.tools
        kwargs = dict(native_renderer.profile.template_kwargs) | (req.template_kwargs or {})
        if tools and kimi:
            tools, ts, _ = compute_tools_ts_str(tools)
            if ts:
                kwargs["tools_ts_str"] = ts
        reference = tok.apply_chat_template(
            req.messages,
            tools=tools,
            add_generation_prompt=req.add_generation_prompt,
            tokenize=True,
            return_dict=False,
            **kwargs,
        )
        assert a.input_ids == list(reference), f"case {i}: ids differ from apply_chat_template(tokenize=True)"
        for m in req.messages:
            if (
                m["role"] == "assistant"
                and m.get("reasoning_content", "").strip("\n")
                and "<" not in m["reasoning_content"]
            ):
                if m["reasoning_content"].strip("\n") in a.text:
                    kept_history_reasoning += 1
                else:
                    dropped_history_reasoning += 1
    # the generator must exercise both sides of each template's history rule
    assert kept_history_reasoning > 100 and dropped_history_reasoning > 100, (
        kept_history_reasoning,
        dropped_history_reasoning,
    )


def _pair_for(model: str, request: pytest.FixtureRequest) -> tuple[PromptRenderer, PromptRenderer]:
    if model == "kimi":
        return request.getfixturevalue("native_renderer"), request.getfixturevalue("jinja_renderer")
    return request.getfixturevalue("qwen_renderer"), request.getfixturevalue("qwen_jinja_renderer")


@pytest.mark.parametrize("model", MODELS)
def test_native_disabled_when_the_template_keeps_history_reasoning_differently(
    model: str, request: pytest.FixtureRequest
) -> None:
    """The startup probe includes multi-turn conversations: a Jinja path that renders the reasoning
    of an in-progress tool-call chain differently (here: drops it) disables the native renderer."""
    native_renderer, _ = _pair_for(model, request)
    template = native_renderer.tokenizer.chat_template

    def drops_chain_reasoning(conversations, tools, kwargs, add_generation_prompt):
        texts = native_renderer._apply_template(conversations, tools, kwargs, add_generation_prompt)
        return [t.replace("mt-r3", "") for t in texts]  # only the multi-turn probes carry it

    assert native_renderer_for(_FakeTokenizer(template), native_renderer._apply_template) is not None
    assert native_renderer_for(_FakeTokenizer(template), drops_chain_reasoning) is None
