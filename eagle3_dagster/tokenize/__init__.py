"""Tokenize stage: token-exact chat templates per model profile (no Dagster imports here).

load_tokenizer(location, *, trust_remote_code=False, cache_dir=None)     loading.py
PromptRenderer(profile, tokenizer=None).render / render_batch / submit_batch    render.py
native Kimi-K2.5 / Qwen3 template renderers (same text as Jinja)              native.py
tokenize_prompts(prompts, renderer, *, max_new_tokens) -> (tokenized, rejects)  pipeline.py
compute_tools_ts_str(tools) -> (sorted tools, tools_ts_str | None, fallback reason)  kimi_tools.py
`eagle3 render` -> cli.run(args) (app/cli.py parses)                      cli.py
"""

from .kimi_tools import ToolSchemaError, compute_tools_ts_str, deep_sort, tools_to_typescript
from .loading import TokenizerLoadError, load_tokenizer
from .pipeline import INVALID_JSON, PROMPT_TOO_LONG, prompt_length_problem, tokenize_prompts
from .render import (
    GENERATION_PROMPT_MISMATCH,
    ID_OUT_OF_VOCAB,
    RENDER_ERROR,
    PendingRender,
    PromptRenderer,
    RenderRequest,
    RenderResult,
    tokenizer_fingerprint,
)

__all__ = [
    "GENERATION_PROMPT_MISMATCH",
    "ID_OUT_OF_VOCAB",
    "INVALID_JSON",
    "PROMPT_TOO_LONG",
    "RENDER_ERROR",
    "PendingRender",
    "PromptRenderer",
    "RenderRequest",
    "RenderResult",
    "TokenizerLoadError",
    "ToolSchemaError",
    "compute_tools_ts_str",
    "deep_sort",
    "load_tokenizer",
    "prompt_length_problem",
    "tokenize_prompts",
    "tokenizer_fingerprint",
    "tools_to_typescript",
]
