"""Parsing generations from their tokens, and the round trip back to the same ids."""

from __future__ import annotations

import json

import polars as pl
import pytest
from dataset_texts import dataset_strings

from eagle3_dagster.tokenize.parse import parse_generation, round_trip_mismatch, round_trips
from eagle3_dagster.train.conversations import parse_generations

TOOL_TURN = (
    "The user wants Paris weather.</think>Let me check."
    "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
    '{"city": "Paris"}<|tool_call_end|><|tool_call_begin|>functions.get_time:1<|tool_call_argument_begin|>'
    '{"tz": "Europe/Paris"}<|tool_call_end|><|tool_calls_section_end|><|im_end|>'
)


def _ids(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def test_plain_answer_splits_reasoning_and_answer(kimi_profile, kimi_tokenizer):
    ids = _ids(kimi_tokenizer, "2+2 is basic arithmetic.</think>It is **4**.<|im_end|>")
    p = parse_generation(ids, kimi_profile, kimi_tokenizer)
    assert (p.reasoning, p.content, p.tool_calls, p.problems) == ("2+2 is basic arithmetic.", "It is **4**.", [], [])
    assert ids[p.think_end_pos] == 163607
    assert round_trips(ids, p, kimi_profile, kimi_tokenizer)


def test_kimi_tool_calls_become_openai_tool_calls(kimi_profile, kimi_tokenizer):
    ids = _ids(kimi_tokenizer, TOOL_TURN)
    p = parse_generation(ids, kimi_profile, kimi_tokenizer)
    assert p.content == "Let me check."
    assert [c["id"] for c in p.tool_calls] == ["functions.get_weather:0", "functions.get_time:1"]
    assert [c["function"]["name"] for c in p.tool_calls] == ["get_weather", "get_time"]
    assert json.loads(p.tool_calls[0]["function"]["arguments"]) == {"city": "Paris"}
    assert p.problems == []
    assert round_trips(ids, p, kimi_profile, kimi_tokenizer)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("no end of thinking here, just an answer<|im_end|>", "no_think_end"),
        ("thinking</think>answer without end of turn", "no_end_of_turn"),
        (
            "r</think><|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{bad json"
            "<|tool_call_end|><|tool_calls_section_end|><|im_end|>",
            "tool_arguments_not_json",
        ),
        (
            "r</think><|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|im_end|>",
            "unterminated_tool_section",
        ),
    ],
)
def test_malformed_generations_are_flagged(kimi_profile, kimi_tokenizer, text, problem):
    p = parse_generation(_ids(kimi_tokenizer, text), kimi_profile, kimi_tokenizer)
    assert problem in p.problems


def test_non_canonical_tokenization_is_flagged_not_a_parse_problem(kimi_profile, kimi_tokenizer):
    """A model may emit a token split the tokenizer would never produce: valid output (the drafter must learn
    it), so it is no parse problem; the round trip reports where re-tokenizing its text gives other ids."""
    canonical = _ids(kimi_tokenizer, "hello world</think>ok<|im_end|>")
    # split the first word into single characters: same text, different ids
    chars = [i for ch in "hello" for i in _ids(kimi_tokenizer, ch)]
    weird = chars + canonical[len(_ids(kimi_tokenizer, "hello")) :]
    assert kimi_tokenizer.decode(weird) == kimi_tokenizer.decode(canonical) and weird != canonical
    p = parse_generation(weird, kimi_profile, kimi_tokenizer)
    assert p.problems == []
    assert not round_trips(weird, p, kimi_profile, kimi_tokenizer)
    assert round_trip_mismatch(weird, p, kimi_profile, kimi_tokenizer) == 0
    assert (
        round_trip_mismatch(
            canonical, parse_generation(canonical, kimi_profile, kimi_tokenizer), kimi_profile, kimi_tokenizer
        )
        is None
    )


def test_qwen3_layout(qwen_profile):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(qwen_profile.tokenizer)
    ids = tok.encode("<think>\nLet me add.\n</think>\n\nFour.<|im_end|>", add_special_tokens=False)
    p = parse_generation(ids, qwen_profile, tok)
    assert p.problems == [] and p.reasoning == "\nLet me add.\n" and p.content == "\n\nFour."
    assert round_trips(ids, p, qwen_profile, tok)


def test_parse_generations_builds_conversations_and_quarantines(kimi_profile, kimi_tokenizer):
    prompts = pl.DataFrame(
        {
            "prompt_id": ["p1", "p2"],
            "messages": [
                json.dumps([{"role": "user", "content": "weather?"}]),
                json.dumps([{"role": "user", "content": "x"}]),
            ],
            "tools": [json.dumps([{"type": "function", "function": {"name": "get_weather"}}]), None],
        }
    )
    canonical = _ids(kimi_tokenizer, "hello world</think>ok<|im_end|>")
    split = [i for ch in "hello" for i in _ids(kimi_tokenizer, ch)] + canonical[len(_ids(kimi_tokenizer, "hello")) :]
    gens = pl.DataFrame(
        {
            "sample_id": ["s1", "s2", "s3", "s4"],
            "prompt_id": ["p1", "p2", "missing", "p2"],
            "output_ids": [
                _ids(kimi_tokenizer, TOOL_TURN),
                _ids(kimi_tokenizer, "no think end<|im_end|>"),
                [1, 2],
                split,
            ],
        }
    )
    ok, failed, counts = parse_generations(gens, prompts, kimi_profile, kimi_tokenizer)
    # the non-canonical row s4 is kept (flagged), only real parse problems are quarantined
    assert ok["sample_id"].to_list() == ["s1", "s4"]
    assert ok["text_exact"].to_list() == [True, False] and ok["text_mismatch_pos"].to_list() == [None, 0]
    conv = json.loads(ok["conversation"][0])
    assert [m["role"] for m in conv] == ["user", "assistant"]
    assert conv[1]["reasoning_content"] == "The user wants Paris weather." and len(conv[1]["tool_calls"]) == 2
    # the generated turn's arguments: a JSON string, byte for byte as the model emitted them
    assert conv[1]["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'
    assert json.loads(ok["conversation"][1])[1]["reasoning_content"] == "hello world"
    reasons = dict(zip(failed["row_id"].to_list(), failed["reasons"].to_list()))
    assert "no_think_end" in reasons["s2"] and reasons["s3"] == ["prompt_missing"]
    assert not any("round_trip_mismatch" in r for r in reasons.values())
    assert counts == {"parsed": 4, "round_trip_ok": 1, "parse_failures": 2, "text_exact_false": 1}


def test_history_tool_call_arguments_become_json_strings(kimi_profile, kimi_tokenizer):
    """One tool-call shape in conversations: OpenAI's, arguments a JSON string, in history turns too."""
    history = [
        {"role": "user", "content": "weather in Zürich?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "functions.get_weather:0",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Zürich", "days": [1, 2]}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "sunny"},
        {"role": "user", "content": "and tomorrow?"},
    ]
    prompts = pl.DataFrame({"prompt_id": ["p1"], "messages": [json.dumps(history)], "tools": [None]})
    gens = pl.DataFrame({"sample_id": ["s1"], "prompt_id": ["p1"], "output_ids": [_ids(kimi_tokenizer, TOOL_TURN)]})
    ok, _, _ = parse_generations(gens, prompts, kimi_profile, kimi_tokenizer)
    conv = json.loads(ok["conversation"][0])
    args = [c["function"]["arguments"] for m in conv for c in m.get("tool_calls", [])]
    assert all(isinstance(a, str) for a in args) and len(args) == 3
    # history: the text the chat template rendered into the prompt (json.dumps, non-ASCII kept)
    assert args[0] == '{"city": "Zürich", "days": [1, 2]}'
    assert args[1:] == ['{"city": "Paris"}', '{"tz": "Europe/Paris"}']


# --- the batched path (tiktoken twin, tokenize/fast_bpe.py) equals the per-sample reference -------


def _outputs(profile, tok, texts: list[str]) -> list[list[int]]:
    """Generations as a sampler writes them: plain answers, tool calls (valid and broken JSON), truncated
    outputs, and non-canonical token splits made by the simulator's own splitter (eagle3-sim --noncanonical-rate)."""
    import random

    from eagle3_dagster.sim.noncanonical import NonCanonicalSplitter

    kimi = profile.tool_call_ids.section_begin is not None
    splitter = NonCanonicalSplitter(tok, 1.0, max_splits=3)
    rng = random.Random(17)
    out: list[list[int]] = []
    for i, (r, a) in enumerate(zip(texts, texts[1:] + texts[:1])):
        r, a = r[:3000], a[:3000]
        if kimi:
            turn = f"{r}</think>{a}<|im_end|>"
            args = json.dumps({"q": a[:300], "n": i}, ensure_ascii=False) if i % 3 else a[:80]
            tools = (
                f"{r}</think>{a[:200]}<|tool_calls_section_begin|><|tool_call_begin|>functions.f_{i}:0"
                f"<|tool_call_argument_begin|>{args}<|tool_call_end|><|tool_calls_section_end|><|im_end|>"
            )
        else:
            turn = f"<think>\n{r}\n</think>\n\n{a}<|im_end|>"
            tools = f'<think>\n{r}\n</think>\n\n<tool_call>\n{{"name": "f", "arguments": {json.dumps(a[:200])}}}\n</tool_call><|im_end|>'
        ids = tok.encode(turn, add_special_tokens=False)
        out += [ids, tok.encode(tools, add_special_tokens=False), ids[: len(ids) // 2]]
        out.append(splitter.apply(ids, rng))
    return out


@pytest.mark.parametrize("which", ["kimi", "qwen"])
def test_batched_parse_and_round_trip_equal_the_per_sample_path(
    which, kimi_profile, kimi_tokenizer, qwen_profile, datasets_dir
):
    from transformers import AutoTokenizer

    from eagle3_dagster.tokenize.parse import parse_generations_batch, round_trip_mismatches

    profile, tok = (
        (kimi_profile, kimi_tokenizer)
        if which == "kimi"
        else (qwen_profile, AutoTokenizer.from_pretrained(qwen_profile.tokenizer))
    )
    from eagle3_dagster.tokenize.fast_bpe import fast_bpe_for

    assert fast_bpe_for(tok) is not None  # the fast backend is the path under test, for both models
    outputs = _outputs(profile, tok, dataset_strings(datasets_dir))
    reference = [parse_generation(ids, profile, tok) for ids in outputs]
    batched = parse_generations_batch(outputs, profile, tok)
    assert batched == reference
    ref_rt = [round_trip_mismatch(ids, p, profile, tok) for ids, p in zip(outputs, reference)]
    assert round_trip_mismatches(outputs, batched, profile, tok) == ref_rt
    # the inputs cover what the equality must hold for: clean, quarantined, non-canonical, tool calls
    problems = {p for g in reference for p in g.problems}
    assert {"no_end_of_turn", "no_think_end"} <= problems
    clean = [m for g, m in zip(reference, ref_rt) if not g.problems]
    assert sum(m is None for m in clean) > 300 and sum(m is not None for m in clean) > 50
    if which == "kimi":
        assert "tool_arguments_not_json" in problems and sum(bool(g.tool_calls) for g in reference) > 100


def test_the_batch_path_reads_sliced_chunked_and_missing_outputs_like_lists(kimi_profile, kimi_tokenizer):
    """IdBatch reads a polars/Arrow list column zero-copy: a slice of it, a column of several chunks and a
    missing output (read as empty: no_end_of_turn) give what the same lists give the per-sample path."""
    from eagle3_dagster.tokenize.parse import IdBatch, parse_generations_batch, round_trip_mismatches

    enc = kimi_tokenizer.encode
    turns = ["a</think>b<|im_end|>", "r1</think>answer two<|im_end|>", "no end", "x</think>y", "q</think>z<|im_end|>"]
    lists = [enc(t, add_special_tokens=False) for t in turns]
    lists[1][1:1] = enc(" hel", add_special_tokens=False) + enc("lo", add_special_tokens=False)  # non-canonical
    col = pl.concat(
        [pl.Series("o", lists[:2], dtype=pl.List(pl.Int32)), pl.Series("o", lists[2:], dtype=pl.List(pl.Int32))],
        rechunk=False,
    )
    assert col.n_chunks() == 2
    with_null = pl.Series("o", [lists[0], None, lists[4]], dtype=pl.List(pl.Int32))
    for series, want in ((col, lists), (col.slice(1, 3), lists[1:4]), (with_null, [lists[0], [], lists[4]])):
        batch = IdBatch(series)
        assert [batch.row(i).tolist() for i in range(len(batch))] == want
        parsed = parse_generations_batch(batch, kimi_profile, kimi_tokenizer)
        reference = [parse_generation(ids, kimi_profile, kimi_tokenizer) for ids in want]
        assert parsed == reference
        assert round_trip_mismatches(batch, parsed, kimi_profile, kimi_tokenizer) == [
            round_trip_mismatch(ids, p, kimi_profile, kimi_tokenizer) for ids, p in zip(want, reference)
        ]
    assert parse_generations_batch(with_null, kimi_profile, kimi_tokenizer)[1].problems == [
        "no_end_of_turn",
        "no_think_end",
    ]
    assert (
        round_trip_mismatches(
            col, parse_generations_batch(col, kimi_profile, kimi_tokenizer), kimi_profile, kimi_tokenizer
        )[1]
        == 1
    )


def test_parse_generations_frame_equals_the_per_row_path(kimi_profile, kimi_tokenizer, datasets_dir):
    """parse_generations (batched, in PARSE_BATCH rows) gives the frame the per-row loop gave, row for row."""
    from eagle3_dagster.train.conversations import CONVERSATION_FAILURES_SCHEMA, CONVERSATIONS_SCHEMA, openai_tool_calls

    outputs = _outputs(kimi_profile, kimi_tokenizer, dataset_strings(datasets_dir, per_file=25))
    n = len(outputs)
    assert n > 600  # more than two batches
    prompts = pl.DataFrame(
        {
            "prompt_id": [f"p{i}" for i in range(0, n, 2)],
            "messages": [json.dumps([{"role": "user", "content": f"q{i}"}]) for i in range(0, n, 2)],
            "tools": [None] * len(range(0, n, 2)),
        }
    )
    gens = pl.DataFrame(
        {
            "sample_id": [f"s{i:05d}" for i in range(n)],
            "prompt_id": [f"p{i - i % 2}" if i % 97 else "missing" for i in range(n)],
            "output_ids": outputs,
        }
    )
    ok, failed, counts = parse_generations(gens, prompts, kimi_profile, kimi_tokenizer)
    # the per-row reference (the loop parse_generations ran before batching)
    by_prompt = {r["prompt_id"]: (r["messages"], r["tools"]) for r in prompts.iter_rows(named=True)}
    ok_rows, fail_rows, rt_ok = [], [], 0
    for r in gens.iter_rows(named=True):
        if r["prompt_id"] not in by_prompt:
            fail_rows.append({"row_id": r["sample_id"], "reasons": ["prompt_missing"]})
            continue
        p = parse_generation(r["output_ids"], kimi_profile, kimi_tokenizer)
        mm = round_trip_mismatch(r["output_ids"], p, kimi_profile, kimi_tokenizer)
        rt_ok += mm is None
        if p.problems:
            fail_rows.append({"row_id": r["sample_id"], "reasons": list(p.problems)})
            continue
        conv = openai_tool_calls(json.loads(by_prompt[r["prompt_id"]][0])) + [p.assistant_message()]
        ok_rows.append(
            {
                "sample_id": r["sample_id"],
                "conversation": json.dumps(conv, ensure_ascii=False, sort_keys=True),
                "tools": None,
                "text_exact": mm is None,
                "text_mismatch_pos": mm,
            }
        )
    assert ok.equals(pl.DataFrame(ok_rows, schema=CONVERSATIONS_SCHEMA))
    assert failed.equals(pl.DataFrame(fail_rows, schema=CONVERSATION_FAILURES_SCHEMA))
    assert counts["round_trip_ok"] == rt_ok and counts["parsed"] == n == ok.height + failed.height
    assert (
        counts["text_exact_false"] > 0 and failed.filter(pl.col("reasons").list.contains("prompt_missing")).height > 0
    )


QWEN_TOOL_TURN = (
    "<think>\nNeed weather and time.\n</think>\n\nChecking both.\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich",  "days":2}}\n</tool_call>\n'
    '<tool_call>\n{"arguments": {"tz": "UTC"}, "name": "get_time"}\n</tool_call><|im_end|>'
)


def test_qwen3_tool_calls_become_openai_tool_calls_with_the_models_bytes(qwen_profile):
    """Qwen3's <tool_call> blocks leave `content` and become tool_calls whose arguments are exactly
    the JSON text the model wrote (spacing, key order, non-ASCII kept); the ids still round-trip."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(qwen_profile.tokenizer)
    ids = tok.encode(QWEN_TOOL_TURN, add_special_tokens=False)
    p = parse_generation(ids, qwen_profile, tok)
    assert p.problems == []
    assert p.content == "\n\nChecking both.\n"
    assert p.tool_calls == [
        {
            "id": "call_0",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Zürich",  "days":2}'},
        },
        {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": '{"tz": "UTC"}'}},
    ]
    assert p.assistant_message()["tool_calls"] == p.tool_calls
    assert round_trips(ids, p, qwen_profile, tok)  # token ids untouched: the turn encodes back exactly
    for text, problem in (
        ('<think>\nr\n</think>\n\n<tool_call>\n{"name": "f", "arguments": {}}<|im_end|>', "unterminated_tool_call"),
        ("<think>\nr\n</think>\n\n<tool_call>\n{bad json\n</tool_call><|im_end|>", "tool_arguments_not_json"),
        ('<think>\nr\n</think>\n\n<tool_call>\n{"name": "f"}\n</tool_call><|im_end|>', "tool_arguments_not_json"),
        (
            '<think>\nr\n</think>\n\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>and more<|im_end|>',
            "text_after_tool_section",
        ),
    ):
        bad = tok.encode(text, add_special_tokens=False)
        assert problem in parse_generation(bad, qwen_profile, tok).problems, text
