"""One shard-graph run in its own process, for the SIGKILL case of test_fault_matrix.py.

    python tests/reliability/fault_worker.py --data DIR --url URL --shard 0000 [--overrides JSON]

The Dagster instance is the one in $DAGSTER_HOME. `--overrides` forces GenerationConfig fields the
resources do not expose (e.g. a small flush size, so chunks land while the run is still going).
Prints one JSON line with the outcome; exit code 0 when the run succeeded.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--url", required=True)
    ap.add_argument("--shard", required=True)
    ap.add_argument("--overrides", default="{}")
    args = ap.parse_args()

    sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parent.parent)]  # fault_helpers, graph_helpers
    import dagster as dg
    from fault_helpers import generation_overrides, run_shard

    instance = dg.DagsterInstance.get()
    with generation_overrides(**json.loads(args.overrides)):
        sh = run_shard(instance, Path(args.data), args.url, args.shard)
    print(json.dumps({"shard": sh.__dict__}), flush=True)
    return 0 if sh.success else 1


if __name__ == "__main__":
    raise SystemExit(main())
