"""`eagle3 backfill`: the whole graph against the configured SGLang fleet, with the demo's summary.

What `make backfill` runs. The same graph run as `eagle3 demo` (app/demo.py: the order and the publish rule
of orchestration/sequence.py, the report last), but never with a simulator: it needs EAGLE3_SGLANG_URL.
"""

from __future__ import annotations

import argparse
import sys


def run(args: argparse.Namespace) -> int:
    """`eagle3 backfill` with its parsed arguments (app/cli.py declares them); the exit code."""
    from ..config import settings
    from .demo import run_graph_command

    if not settings().urls_configured:
        print(
            "eagle3 backfill: error: EAGLE3_SGLANG_URL is not set: a backfill generates through a real SGLang "
            "server or router (for a try-out with a simulator, `eagle3 demo`)",
            file=sys.stderr,
        )
        return 2
    return run_graph_command(args, "backfill")
