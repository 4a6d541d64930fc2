"""The simulator's own settings from the environment: the only place under sim/ that reads it.

`eagle3-sim` is its own program with its own command line; the pipeline's settings live in
eagle3_dagster/config.py. Rule (tests/test_layout.py): only these two modules read the process
environment. Everything else is handed values as parameters.

Read here:
  - the API key, from the variable `--api-key-env VAR` names (never from argv, never logged);
  - the environment a simulator child process inherits (process.py), offline by default;
  - TRANSFORMERS_VERBOSITY=error unless set (the tokenizer load is quiet in the server log).
"""

from __future__ import annotations

import os
from collections.abc import Mapping


def api_key_from_env(var: str | None, env: Mapping[str, str] | None = None) -> str | None:
    """The key in the variable `var` names (`env` first, then the process environment); None if unset/empty."""
    if not var:
        return None
    return (env.get(var) if env is not None else None) or os.environ.get(var) or None


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a simulator child process: ours, `extra` on top, Hugging Face offline unless set."""
    env = dict(os.environ)
    env.update(extra or {})
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    return env


def quiet_transformers() -> None:
    """TRANSFORMERS_VERBOSITY=error unless the user set it (for the libraries this process loads)."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
