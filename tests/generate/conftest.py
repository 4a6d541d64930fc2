"""Fixtures for the generation client: real simulator processes on 127.0.0.1, small shards."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from gen_helpers import Sim


@pytest.fixture
def start_sim(tmp_path: Path) -> Iterator[Callable[..., Sim]]:
    sims: list[Sim] = []

    def _start(*extra_args: str, env: dict[str, str] | None = None, port: int | None = None, wait: bool = True) -> Sim:
        d = tmp_path / f"sim-{len(sims)}"
        d.mkdir()
        s = Sim(port=port, extra_args=tuple(extra_args), env=env, log_path=d / "sim.log", wait=wait)
        sims.append(s)
        return s

    yield _start
    for s in sims:
        s.kill()


@pytest.fixture(scope="module")
def shared_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    """One simulator for a module's tests (faults cleared before each use): saves process start-ups."""
    s = Sim(log_path=tmp_path_factory.mktemp("sim") / "sim.log")
    yield s
    s.kill()


@pytest.fixture
def clean_sim(shared_sim: Sim) -> Sim:
    shared_sim.faults(clear=True)
    return shared_sim
