"""SGLang-protocol simulator: the `eagle3-sim` program and `start_simulator` (process.py) to run it as a child.

Its modules, from the process down: server.py (startup, serving, draining; `python -m eagle3_dagster.sim.server`),
cli.py (flags), app.py (the routes), generate_route.py (/generate), chat.py (/v1/chat/completions),
admin.py (the /_sim/ fault and stats routes' logic), engine.py (an item in time), answer.py (its answer),
state.py (what a running server knows), protocol.py (validation and the output plan), model.py / agentic.py
(what the model says), speculative.py (a drafter's figures), faults.py / fleet_faults.py (fault state),
stats.py (counters), responses.py (answer shapes), cache.py, record.py, deployment.py, noncanonical.py,
settings.py (the environment).
"""

from .process import SimProcess, SimulatorError, start_simulator

__all__ = ["SimProcess", "SimulatorError", "start_simulator"]
