"""Simulator fixtures: real `eagle3-sim` processes on 127.0.0.1, shared per session where possible.

Shared servers get their runtime faults cleared after every test, so tests stay independent.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sim_ctl import HTTP
from sim_helpers import KIMI_ARGS, QWEN_ARGS, QWEN_DIR

from eagle3_dagster.sim.process import SimProcess, start_simulator


def _start(extra: list[str], **kw: Any) -> SimProcess:
    return start_simulator(extra_args=extra, ready_timeout=60, **kw)


@pytest.fixture(scope="session")
def sim() -> Iterator[SimProcess]:
    """Kimi-K2.5 profile, SGLang 0.5.23 behaviour."""
    with _start(KIMI_ARGS) as s:
        yield s


@pytest.fixture(scope="session")
def sim059() -> Iterator[SimProcess]:
    """Kimi-K2.5 profile, SGLang 0.5.9 behaviour."""
    with _start(KIMI_ARGS + ["--version", "0.5.9"]) as s:
        yield s


@pytest.fixture(scope="session")
def qsim() -> Iterator[SimProcess]:
    """Qwen3 profile."""
    with _start(QWEN_ARGS) as s:
        yield s


@pytest.fixture(autouse=True)
def _clear_faults(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    for name in ("sim", "sim059", "qsim"):
        if name in request.fixturenames:
            s: SimProcess = request.getfixturevalue(name)
            if s.alive():
                HTTP.post(s.url + "/_sim/faults", json={"clear": True}, timeout=5).raise_for_status()


@pytest.fixture(scope="session")
def kimi_tok(kimi_tokenizer: Any) -> Any:
    return kimi_tokenizer


@pytest.fixture(scope="session")
def qwen_tok() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(QWEN_DIR)
