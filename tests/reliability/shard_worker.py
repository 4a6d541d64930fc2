"""One Dagster run in its own process, on the instance in $DAGSTER_HOME (used by test_postgres_pool).

    python tests/reliability/shard_worker.py --ingest
    python tests/reliability/shard_worker.py --shard 0002 --ready FILE --go FILE

With --ready/--go the worker imports everything, touches FILE(ready) and waits for FILE(go), so
several workers start their runs at the same moment. Prints one JSON line with the outcome.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ingest", action="store_true")
    ap.add_argument("--shard", action="append", default=[])
    ap.add_argument("--max-new-tokens", type=int, default=512)
    ap.add_argument("--ready")
    ap.add_argument("--go")
    args = ap.parse_args()

    import dagster as dg

    from eagle3_dagster.config import settings
    from eagle3_dagster.definitions import defs
    from eagle3_dagster.orchestration.resources import pipeline_resource
    from eagle3_dagster.orchestration.run import GraphScope, materialize_graph

    instance = dg.DagsterInstance.get()
    resources = {"pipeline": pipeline_resource(settings(), max_new_tokens=args.max_new_tokens)}
    if args.ready:
        # Warm the process like a long-lived worker: the imports the steps make lazily (GX,
        # transformers) and the tokenizer, so the runs start on equal terms when `go` appears.
        import importlib

        from eagle3_dagster.orchestration.resources import cached_renderer

        importlib.import_module("great_expectations")

        cached_renderer(resources["pipeline"].profile())
        Path(args.ready).touch()
        deadline = time.monotonic() + 120
        while not Path(args.go).exists():
            if time.monotonic() > deadline:
                raise SystemExit("no go signal")
            time.sleep(0.02)
    out = materialize_graph(
        defs, instance, scope=GraphScope(shards=args.shard, run_ingest=args.ingest), resources=resources
    )
    print(
        json.dumps(
            {
                "ingest_success": out.ingest_success,
                "ingest_run_id": out.ingest_run_id,
                "shards": [s.__dict__ for s in out.shards],
                "storage": type(instance.event_log_storage).__name__,
            }
        ),
        flush=True,
    )
    return 0 if out.success else 1


if __name__ == "__main__":
    raise SystemExit(main())
