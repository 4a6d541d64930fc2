"""SGLang-protocol simulator: `eagle3-sim` (server.py runs it, app.py its routes) and `start_simulator` (process.py)."""

from .process import SimProcess, SimulatorError, start_simulator

__all__ = ["SimProcess", "SimulatorError", "start_simulator"]
