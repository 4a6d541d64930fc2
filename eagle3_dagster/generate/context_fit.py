"""Prompts whose prompt + max_new_tokens exceeds the server's context length: fitted or skipped, never a 400.

SGLang (0.5.23 `TokenizerManager._validate_one_request`) refuses a request with 400 when
`input_tokens + max_new_tokens > context_len` ("Requested token count exceeds the model's maximum context
length of C tokens. ..."); `prompt + max_new_tokens == context_len` is accepted. Only a server started with
`--allow-auto-truncate` lowers `max_new_tokens` to `context_len - input_tokens` itself, unseen by the client.
(A prompt of at least `context_len` tokens is the other check: inputs.PROMPT_TOO_LONG_FOR_SERVER.)

`EAGLE3_CONTEXT_OVERFLOW` (GenerationConfig.context_overflow) decides, per prompt, before sending:

- `fit` (default): send it with `max_new_tokens = context_len - prompt_len` (what auto-truncate would do,
  done here so it is visible and deterministic); `min_new_tokens` is capped at that budget. The row's
  sampling hash, and so its cache key (sample_id), is the hash of the params actually sent: a row
  generated at one budget is never reused for another (a server with a longer context regenerates it).
- `skip`: not sent; an errors.parquet row with reason `context_overflow` names the prompt tokens,
  max_new_tokens and the context length. Not permanent: every run checks it again.

Both are counted: ShardReport.context_fitted / context_overflow_skipped, the step's result line and a
shard-level outcome of the generations gate (quality/request_failures.context_fit_outcome).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .config import GenerationConfig, params_hash, sampling_params

CONTEXT_OVERFLOW = "context_overflow"  # skip mode: prompt + max_new_tokens > the server's context length
FIT = "fit"
SKIP = "skip"


def overflows(prompt_len: int, max_new_tokens: int, context_length: int | None) -> bool:
    """SGLang's rule: a prompt shorter than the context with `prompt_len + max_new_tokens > context_length`."""
    return context_length is not None and prompt_len < context_length and prompt_len + max_new_tokens > context_length


def fitted_max_new_tokens(prompt_len: int, context_length: int) -> int:
    """What `--allow-auto-truncate` sets: `max(0, context_len - input_tokens)` (>= 1 for a prompt that is sent)."""
    return max(0, context_length - prompt_len)


@dataclass
class ContextBudget:
    """The sampling params and sampling hash of each prompt under one server context length."""

    mode: str
    context_length: int | None  # None: some endpoint does not report it (every prompt keeps the full budget)
    params: dict[str, Any]  # the config's sampling_params (full budget)
    s_hash: str  # their hash: the shard's sampling_hash
    _fitted: dict[int, tuple[dict[str, Any], str]] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, config: GenerationConfig, context_length: int | None) -> ContextBudget:
        params = sampling_params(config)
        return cls(config.context_overflow, context_length, params, params_hash(params))

    @property
    def max_new_tokens(self) -> int:
        return int(self.params["max_new_tokens"])

    def overflows(self, prompt_len: int) -> bool:
        return overflows(prompt_len, self.max_new_tokens, self.context_length)

    def fits(self, prompt_len: int) -> bool:
        """Sent with a lowered budget (fit mode and the prompt overflows)."""
        return self.mode == FIT and self.overflows(prompt_len)

    def skips(self, prompt_len: int) -> bool:
        return self.mode == SKIP and self.overflows(prompt_len)

    def _fit(self, prompt_len: int) -> tuple[dict[str, Any], str]:
        budget = fitted_max_new_tokens(prompt_len, int(self.context_length or 0))
        got = self._fitted.get(budget)
        if got is None:
            p = dict(self.params, max_new_tokens=budget)
            p["min_new_tokens"] = min(int(p.get("min_new_tokens", 0)), budget)  # SGLang: min <= max_new_tokens
            got = self._fitted[budget] = (p, params_hash(p))
        return got

    def params_for(self, prompt_len: int) -> dict[str, Any]:
        """The sampling_params sent for a prompt of this length."""
        return self._fit(prompt_len)[0] if self.fits(prompt_len) else self.params

    def hash_for(self, prompt_len: int) -> str:
        """The sampling hash of the params sent (part of the sample_id)."""
        return self._fit(prompt_len)[1] if self.fits(prompt_len) else self.s_hash

    def skip_detail(self, prompt_len: int) -> str:
        total = prompt_len + self.max_new_tokens
        return (
            f"prompt of {prompt_len:,} tokens + max_new_tokens {self.max_new_tokens:,} = {total:,} > the server's "
            f"context length {self.context_length:,} (/server_info context_length): not sent "
            f"(EAGLE3_CONTEXT_OVERFLOW=skip; fit would send it with max_new_tokens "
            f"{fitted_max_new_tokens(prompt_len, int(self.context_length or 0)):,})"
        )
