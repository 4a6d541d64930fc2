"""The simulator in conversations, over real HTTP: tool calls of declared functions in each model's
own format, agent loops that end, and answers that depend on the whole prompt.

Prompts are rendered the way the pipeline renders them (tokenize.PromptRenderer: the model's chat
template, Kimi tools as tools_ts_str); outputs are parsed the way the pipeline parses them
(tokenize/parse.py), so these tests also prove the parse of the simulator's tool calls into
OpenAI-shape `tool_calls` for both profiles.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from sim_helpers import gen

from eagle3_dagster.profiles import ModelProfile
from eagle3_dagster.tokenize import PromptRenderer
from eagle3_dagster.tokenize.parse import parse_generation, round_trips

pytestmark = pytest.mark.integration  # the simulators are reached through getfixturevalue

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city", "days"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search_flights",
            "description": "Flights between two airports.",
            "parameters": {
                "type": "object",
                "properties": {"origin": {"type": "string"}, "dest": {"type": "string"}, "direct": {"type": "boolean"}},
                "required": ["origin", "dest"],
            },
        },
    },
]
REQUIRED = {"get_weather": {"city", "days"}, "search_flights": {"origin", "dest"}}
N_QUESTIONS = 16
N_CALL_QUESTIONS = 20  # enough prompts that some turn holds two calls for both profiles
MAX_ROUNDS = 8


@pytest.fixture(scope="module", params=["kimi", "qwen"])
def model(request: pytest.FixtureRequest) -> tuple[Any, PromptRenderer]:
    """(simulator, renderer) for one profile."""
    if request.param == "kimi":
        profile: ModelProfile = request.getfixturevalue("kimi_profile")
        return request.getfixturevalue("sim"), PromptRenderer(profile, request.getfixturevalue("kimi_tokenizer"))
    return request.getfixturevalue("qsim"), PromptRenderer(request.getfixturevalue("qwen_profile"))


def _generate(sim: Any, renderer: PromptRenderer, messages: list[dict[str, Any]], tools: Any = TOOLS) -> list[int]:
    rendered = renderer.render(messages, tools)
    assert rendered.ok, rendered.detail
    r = gen(sim, {"input_ids": rendered.input_ids, "sampling_params": {"max_new_tokens": 4000}})
    assert r.status_code == 200, r.text
    out = r.json()["output_ids"]
    p = renderer.profile
    assert out[-1] == p.end_of_turn_id and out.count(p.think_end_id) == 1  # raw ids, </think> kept
    return out


def _question(i: int) -> str:
    return f"Plan trip number {i}: weather in Lyon and flights from CDG to LYS please"


def test_tool_calls_name_declared_functions_and_parse_to_openai_shape(model: tuple[Any, PromptRenderer]) -> None:
    sim, renderer = model
    profile, tok = renderer.profile, renderer.tokenizer
    kimi = profile.template_family == "kimi_ts"
    turns_with_calls = multi_call_turns = 0
    for i in range(N_CALL_QUESTIONS):
        out = _generate(sim, renderer, [{"role": "user", "content": _question(i)}])
        parsed = parse_generation(out, profile, tok)
        assert parsed.problems == [], parsed.problems
        assert round_trips(out, parsed, profile, tok)  # the ids are exactly the parsed turn
        if not parsed.tool_calls:
            continue
        turns_with_calls += 1
        multi_call_turns += len(parsed.tool_calls) > 1
        for k, call in enumerate(parsed.tool_calls):
            name, arguments = call["function"]["name"], call["function"]["arguments"]
            assert call["type"] == "function" and name in REQUIRED
            assert isinstance(arguments, str)  # OpenAI shape: a JSON string, the model's own bytes
            args = json.loads(arguments)
            assert set(args) >= REQUIRED[name], (name, args)
            if name == "get_weather":
                assert isinstance(args["days"], int) and isinstance(args["city"], str)
            # Kimi: functions.NAME:IDX with IDX counting the conversation's calls; Qwen3: no ids, ours
            assert call["id"] == (f"functions.{name}:{k}" if kimi else f"call_{k}")
    # --tool-call-rate 0.6 (default), deterministic per prompt: the agentic path is exercised
    assert turns_with_calls >= N_CALL_QUESTIONS // 3, turns_with_calls
    assert multi_call_turns >= 1
    # no declared tools: never a call
    for i in range(4):
        out = _generate(sim, renderer, [{"role": "user", "content": _question(i)}], tools=None)
        assert parse_generation(out, profile, tok).tool_calls == []


def test_agent_loops_carry_the_models_own_calls_and_end_with_an_answer(model: tuple[Any, PromptRenderer]) -> None:
    """assistant tool_calls -> tool results -> assistant ...: each round's prompt holds the model's
    own earlier turns (parsed from its ids); Kimi call ids keep counting; every loop ends."""
    sim, renderer = model
    profile, tok = renderer.profile, renderer.tokenizer
    kimi = profile.template_family == "kimi_ts"
    chains = longest = 0
    for i in range(N_QUESTIONS):
        messages: list[dict[str, Any]] = [{"role": "user", "content": _question(i)}]
        calls_so_far = tool_rounds = 0
        for _ in range(MAX_ROUNDS):
            out = _generate(sim, renderer, messages)
            parsed = parse_generation(out, profile, tok)
            assert parsed.problems == []
            messages.append(parsed.assistant_message())
            if not parsed.tool_calls:
                break
            if kimi:
                assert [c["id"].rsplit(":", 1)[1] for c in parsed.tool_calls] == [
                    str(calls_so_far + k) for k in range(len(parsed.tool_calls))
                ]
            calls_so_far += len(parsed.tool_calls)
            tool_rounds += 1
            for call in parsed.tool_calls:
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": '{"ok": true, "n": 3}'})
        else:
            pytest.fail(f"conversation {i}: still calling tools after {MAX_ROUNDS} rounds")
        chains += tool_rounds >= 1
        longest = max(longest, tool_rounds)
    assert chains >= N_QUESTIONS // 3 and longest >= 2, (chains, longest)


def _answer(renderer: PromptRenderer, out: list[int]) -> str:
    return parse_generation(out, renderer.profile, renderer.tokenizer).content


def test_answers_depend_on_the_whole_prompt(model: tuple[Any, PromptRenderer]) -> None:
    """Same prompt -> same ids; a different earlier assistant turn (same last question) -> a
    different answer; the answer echoes the last user message, so the context is visible."""
    sim, renderer = model
    last = {"role": "user", "content": "And what about <b>tomorrow</b> in Paris?"}
    history_a = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"}, last]
    history_b = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hey there."}, last]
    a1 = _generate(sim, renderer, history_a, tools=None)
    a2 = _generate(sim, renderer, history_a, tools=None)
    b = _generate(sim, renderer, history_b, tools=None)
    assert a1 == a2
    assert a1 != b and _answer(renderer, a1) != _answer(renderer, b)
    for out in (a1, b):
        # the last words of the last user message, marker characters removed
        assert _answer(renderer, out).lstrip("\n").startswith('Re "about b tomorrow /b in Paris?": ')
    # the echo follows the LAST user message, not an earlier one
    c = _generate(
        sim,
        renderer,
        [*history_a, {"role": "assistant", "content": "Sunny."}, {"role": "user", "content": "Thanks!"}],
        tools=None,
    )
    assert re.match(r'\n*Re "Thanks!": ', _answer(renderer, c))
