"""Which model an endpoint serves, against the model the run is for: refused when it is another one.

SGLang's `/model_info` (`/get_model_info` on a router or smg gateway, from one of its workers) names what
the server loaded: `model_path` (its --model-path: a Hugging Face id or a local folder) and `model_type`
(the model's Hugging Face config `model_type`: `kimi_k25` for Kimi-K2.5, `kimi_k2` for Kimi-K2, `qwen3`
for the dense Qwen3 models, `qwen3_moe` for the MoE ones). The token gates catch a model with another
tokenizer; a sibling that shares it (Kimi-K2 under the Kimi-K2.5 profile) or an unrelated model whose ids
happen to fit would pass them, and a drafter would learn the wrong target. So every endpoint, and every
worker behind a router that the client can reach, is judged here before anything is sent:

- its `model_type` must be one of the profile's `model_types` (assets/models/<name>.yaml);
- its `model_path` must equal the profile's `model_path` when the profile pins one;
- with EAGLE3_SERVED_MODEL set (a local folder, a fine-tune the user means to use), its `model_path`
  must equal that instead, and a `model_type` outside the profile's is then a warning, not a refusal
  (the user vouched for this model; the data card states the pin).

Paths compare as written, without surrounding spaces and trailing `/`. A server that does not say its
`model_type` cannot be told apart from another model: refused unless pinned by path. `judge_served_model`
is a plain function of one `/model_info` answer and an `ExpectedModel`, for any caller that has to know
whether an endpoint serves the run's model (the endpoint pool, a candidate endpoint before it is added).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..profiles import ModelProfile
from ..secret import redact

PIN_SETTING = "EAGLE3_SERVED_MODEL"


def _path(v: Any) -> str | None:
    s = str(v).strip().rstrip("/") if v is not None else ""
    return s or None


@dataclass(frozen=True)
class ExpectedModel:
    """What the run's endpoints must serve: from the model profile, and the user's pin (EAGLE3_SERVED_MODEL)."""

    profile: str  # the profile's name, for messages
    model_types: tuple[str, ...] = ()  # () accepts any model_type (no profile: a pin alone decides)
    model_path: str | None = None  # the profile's `model_path`, when it pins one
    pinned_path: str | None = None  # EAGLE3_SERVED_MODEL: the model_path the user means to use

    @classmethod
    def of(cls, profile: ModelProfile, pinned_path: str | None = None) -> ExpectedModel:
        return cls(profile.name, tuple(profile.model_types), _path(profile.model_path), _path(pinned_path))

    def with_pin(self, pinned_path: str | None) -> ExpectedModel:
        return replace(self, pinned_path=_path(pinned_path)) if pinned_path else self

    def describe(self) -> str:
        """One line: what is checked (logs, the data card)."""
        types = " or ".join(repr(t) for t in self.model_types) or "any"
        if self.pinned_path:
            return f"model_path {redact(self.pinned_path)!r} (pinned by {PIN_SETTING}; profile {self.profile} expects model_type {types})"
        path = f", model_path {self.model_path!r}" if self.model_path else ""
        return f"model_type {types}{path} (profile {self.profile})"


@dataclass(frozen=True)
class ServedModel:
    """What one `/model_info` answer says is served (model_path redacted: a URI may carry credentials)."""

    model_path: str | None
    model_type: str | None

    @classmethod
    def of(cls, info: Mapping[str, Any]) -> ServedModel:
        path = _path(info.get("model_path"))
        mtype = info.get("model_type")
        mtype_text = str(mtype).strip() if mtype is not None else ""
        return cls(redact(path) if path else None, mtype_text or None)

    def describe(self) -> str:
        return f"model_path {self.model_path!r} (model_type {self.model_type!r})"


@dataclass(frozen=True)
class ModelVerdict:
    refusal: str | None = None  # why the endpoint must not be used (names what it serves and what is expected)
    warning: str | None = None  # used, but worth a line: a pinned model whose model_type is not the profile's
    served: ServedModel | None = None


def judge_served_model(info: Mapping[str, Any], expected: ExpectedModel, *, who: str = "the endpoint") -> ModelVerdict:
    """Is the model `info` (one /model_info answer) names the one `expected`? `who` starts the message."""
    served = ServedModel.of(info)
    if expected.pinned_path:
        return _judge_pinned(served, expected, who)
    if not expected.model_types and not expected.model_path:
        return ModelVerdict(served=served)
    wanted = " or ".join(repr(t) for t in expected.model_types)
    if expected.model_types and served.model_type is None:
        why = (
            f"{who} does not say which model it serves (/model_info has no model_type; model_path "
            f"{served.model_path!r}): the model profile {expected.profile} expects model_type {wanted}. If it "
            f"serves the right model, pin it: {PIN_SETTING}={served.model_path or '<its model path>'}"
        )
        return ModelVerdict(refusal=why, served=served)
    if expected.model_types and served.model_type not in expected.model_types:
        why = (
            f"{who} serves another model: {served.describe()}, but the model profile {expected.profile} expects "
            f"model_type {wanted}. Point the run at a server of that model, choose the profile of this one "
            f"(EAGLE3_MODEL), or, if you mean to use this model, pin it: {PIN_SETTING}={served.model_path or '...'}"
        )
        return ModelVerdict(refusal=why, served=served)
    if expected.model_path and _path(info.get("model_path")) != expected.model_path:
        why = (
            f"{who} serves {served.describe()}, but the model profile {expected.profile} pins model_path "
            f"{expected.model_path!r}. If you mean to use this one (a local copy, a fine-tune), pin it: "
            f"{PIN_SETTING}={served.model_path or '...'}"
        )
        return ModelVerdict(refusal=why, served=served)
    return ModelVerdict(served=served)


def _judge_pinned(served: ServedModel, expected: ExpectedModel, who: str) -> ModelVerdict:
    pin = expected.pinned_path
    if served.model_path != redact(pin or ""):
        why = f"{who} serves {served.describe()}, but {PIN_SETTING} pins model_path {redact(pin or '')!r}"
        return ModelVerdict(refusal=why, served=served)
    if expected.model_types and served.model_type not in expected.model_types:
        note = (
            f"{who} serves {served.describe()}: not the model_type {' or '.join(map(repr, expected.model_types))} "
            f"of the model profile {expected.profile}, used because {PIN_SETTING} pins it"
        )
        return ModelVerdict(warning=note, served=served)
    return ModelVerdict(served=served)
