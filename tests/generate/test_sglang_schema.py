"""Every request body the client sends, through SGLang 0.5.23's own request code (docs/sglang-schema.md).

What POST /generate does with a body before the scheduler sees it, in SGLang's order, each step SGLang's
code (tests/generate/sglang_source.py loads it from the installed sglang==0.5.23):

1. FastAPI parses the JSON into `GenerateReqInput` (a dataclass: pydantic validates each field against
   io_struct's annotation; a key that is not a field is dropped SILENTLY, so here it fails);
2. `http_server.generate_request` runs `generate_contract_error` (the generated JSON contract: unknown
   sampling keys, wrong JSON types);
3. `GenerateReqInput.normalize_batch_and_arguments()`;
4. per request, `TokenizerManager._create_tokenized_object`: `SamplingParams(**sampling_params)`,
   `.normalize(tokenizer)`, `.verify(vocab_size)`, with the real Kimi-K2.5 / Qwen3 tokenizers of ../shared.

POST /abort_request parses its body into `AbortReq` (pydantic through msgspec_struct_pydantic_core_schema).
The bodies come from the client's own builders (generate_body, stream_body, abort_body) and the sampling
dict from `sampling_params(GenerationConfig.from_profile(...))`, the one the pipeline sends.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import pydantic
import pytest
import sglang_source

from eagle3_dagster.generate import GenerationConfig, sampling_params
from eagle3_dagster.generate.client import abort_body, generate_body, stream_body
from eagle3_dagster.profiles import ModelProfile
from eagle3_dagster.tokenize.loading import load_tokenizer

_SKIP = sglang_source.unavailable_reason()
pytestmark = pytest.mark.skipif(_SKIP is not None, reason=f"SGLang lane not installed: {_SKIP}")


@pytest.fixture(scope="module")
def src() -> sglang_source.SGLangSource:
    return sglang_source.load()


@cache
def _tokenizer(location: str) -> Any:
    return load_tokenizer(location)


class Rejected(AssertionError):
    """SGLang's own code refused (or would silently drop part of) a body; the message says which step."""


def sglang_generate(src: sglang_source.SGLangSource, body: dict[str, Any], tokenizer: Any, vocab_size: int) -> list:
    """What SGLang 0.5.23 does with a POST /generate `body` before scheduling; the per-request SamplingParams."""
    wire = json.loads(json.dumps(body))  # what the server receives
    known = set(src.GenerateReqInput.__dataclass_fields__)
    unknown = sorted(set(wire) - known)
    if unknown:
        raise Rejected(f"GenerateReqInput has no field {unknown}: FastAPI drops them silently")
    parsed: dict[str, Any] = {}
    for name, value in wire.items():
        try:
            ta = pydantic.TypeAdapter(sglang_source.field_annotation(src, name))
            parsed[name] = ta.validate_json(json.dumps(value))
        except pydantic.ValidationError as e:
            raise Rejected(f"FastAPI/pydantic refuses {name}={value!r}: {e}") from None
    err = src.generate_contract_error(wire)
    if err is not None:
        raise Rejected(f"generate_contract_error: {err}")
    obj = src.GenerateReqInput(**parsed)
    try:
        obj.normalize_batch_and_arguments()
    except ValueError as e:
        raise Rejected(f"normalize_batch_and_arguments: {e}") from None
    subs = [obj] if obj.is_single else [obj[i] for i in range(len(obj.rid))]
    out = []
    for sub in subs:
        try:
            sp = src.SamplingParams(**dict(sub.sampling_params))
            sp.normalize(tokenizer)
            sp.verify(vocab_size)
        except (TypeError, ValueError) as e:
            raise Rejected(f"SamplingParams: {e}") from None
        out.append(sp)
    return out


def sglang_abort(src: sglang_source.SGLangSource, body: dict[str, Any]) -> Any:
    """POST /abort_request's body as SGLang parses it (`obj: Annotated[AbortReq, Body()]`)."""
    known = set(src.AbortReq.__struct_fields__)
    unknown = sorted(set(body) - known)
    if unknown:
        raise Rejected(f"AbortReq has no field {unknown}: FastAPI drops them silently")
    try:
        return pydantic.TypeAdapter(src.AbortReq).validate_json(json.dumps(body))
    except pydantic.ValidationError as e:
        raise Rejected(f"AbortReq: {e}") from None


PROFILES = ("kimi_profile", "qwen_profile")
URL = "http://127.0.0.1:9"  # GenerationConfig needs an endpoint; nothing is sent
# Non-default values for every sampling field GenerationConfig sends (a run can override each one).
EVERY_FIELD_SET = dict(
    max_new_tokens=7,
    temperature=0.6,
    top_p=0.8,
    top_k=20,
    min_p=0.05,
    min_new_tokens=2,
    frequency_penalty=0.5,
    presence_penalty=-0.5,
    repetition_penalty=1.1,
    ignore_eos=True,
    stream_interval=3,
)


def _setup(request: pytest.FixtureRequest, name: str) -> tuple[ModelProfile, Any, int]:
    profile: ModelProfile = request.getfixturevalue(name)
    tok = _tokenizer(profile.tokenizer)
    assert len(tok) == profile.vocab_size, "the profile's vocab_size is the real tokenizer's"
    return profile, tok, len(tok)


def _prompt(profile: ModelProfile, tok: Any) -> list[int]:
    return [*tok.encode("Say hello in three languages.", add_special_tokens=False), profile.think_start_id]


def _configs(profile: ModelProfile) -> list[GenerationConfig]:
    base = GenerationConfig.from_profile(profile, URL)
    return [base, base.with_(**EVERY_FIELD_SET), base.with_(stop_token_ids=())]


@pytest.mark.parametrize("profile_name", PROFILES)
def test_every_generate_body_passes_sglang(src, request, profile_name: str) -> None:
    profile, tok, vocab = _setup(request, profile_name)
    ids = _prompt(profile, tok)
    seen_fields: set[str] = set()
    for cfg in _configs(profile):
        sent = sampling_params(cfg)
        single = generate_body(ids, sent, "sample0123-nonce-0")
        streamed = stream_body(single, cfg.effective_stream_interval())
        for body in (single, streamed):
            [sp] = sglang_generate(src, body, tok, vocab)
            sp_sent = body["sampling_params"]
            seen_fields |= set(sp_sent)
            # SGLang keeps every value as sent (top_k -1 is its "whole vocabulary").
            for k, v in sp_sent.items():
                got = getattr(sp, k)
                if k == "top_k" and v == -1:
                    assert got == 1 << 30
                elif k == "stop_token_ids":
                    assert sorted(got) == sorted(v)
                else:
                    assert got == v, k
        assert streamed["stream"] is True and single["stream"] is False
        assert streamed["sampling_params"]["stream_interval"] == cfg.effective_stream_interval()
    # every sampling field the client can send went through SGLang at least once
    assert seen_fields == {*sampling_params(_configs(profile)[0]), "stream_interval"}


@pytest.mark.parametrize("profile_name", PROFILES)
def test_a_batch_of_client_bodies_passes_sglang_normalization(src, request, profile_name: str) -> None:
    """The client sends one prompt per request; the same fields as a batch (list input_ids, list rid)
    normalize too, each item keeping its rid (the simulator's batch answers are checked against it)."""
    profile, tok, vocab = _setup(request, profile_name)
    sent = sampling_params(GenerationConfig.from_profile(profile, URL))
    one = generate_body(_prompt(profile, tok), sent, "r")
    batch = {**one, "input_ids": [one["input_ids"], one["input_ids"][:3]], "rid": ["a-0", "b-0"]}
    assert len(sglang_generate(src, batch, tok, vocab)) == 2


def test_abort_body_passes_sglang(src) -> None:
    req = sglang_abort(src, abort_body("sample0123-nonce-2"))
    assert req.rid == "sample0123-nonce-2" and req.abort_all is False


def test_sglang_rejects_what_it_should(src, request) -> None:
    """The checks above can fail: SGLang's own code refuses each of these broken bodies."""
    profile, tok, vocab = _setup(request, "kimi_profile")
    good = generate_body(_prompt(profile, tok), sampling_params(GenerationConfig.from_profile(profile, URL)), "r-0")
    cases = {
        # an OpenAI spelling: the contract knows the sampling keys, and SamplingParams(**) has no such argument
        "unknown sampling key": (
            {**good, "sampling_params": {**good["sampling_params"], "max_tokens": 5}},
            "max_tokens",
        ),
        "wrong JSON type": ({**good, "stream": "yes"}, "expected a boolean"),
        "invalid value (top_p 0)": ({**good, "sampling_params": {**good["sampling_params"], "top_p": 0.0}}, "top_p"),
        "min_new_tokens > max_new_tokens": (
            {**good, "sampling_params": {**good["sampling_params"], "min_new_tokens": 10**6}},
            "min_new_tokens",
        ),
        "top-level key SGLang would drop silently": ({**good, "return_logprobs": True}, "return_logprobs"),
        "no prompt": ({k: v for k, v in good.items() if k != "input_ids"}, "should be provided"),
        "empty prompt": ({**good, "input_ids": []}, "cannot be empty"),
        "logit_bias outside the vocabulary": (
            {**good, "sampling_params": {**good["sampling_params"], "logit_bias": {str(vocab): 1.0}}},
            "logit_bias",
        ),
        "duplicate rids in a batch": ({**good, "input_ids": [[1, 2], [3]], "rid": ["x", "x"]}, "Duplicate"),
    }
    for name, (body, needle) in cases.items():
        with pytest.raises(Rejected, match=needle):
            sglang_generate(src, body, tok, vocab)
            pytest.fail(f"SGLang accepted {name}")
    with pytest.raises(Rejected, match="rid"):
        sglang_abort(src, {"rid": 12})
    with pytest.raises(Rejected, match="request_id"):
        sglang_abort(src, {"request_id": "x"})
