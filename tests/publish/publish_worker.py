"""A publisher in a process of its own: `python publish_worker.py DATA_DIR RUN_ID MODE [READY_FILE]`.

Runs publish.snapshot.build_snapshot on DATA_DIR's shard 0 and 1 (every gate passed) with the real
exporters, plus one more exporter that, by MODE, returns at once ("fast"), sleeps 1.5 s while the
snapshot is staged and the lock held ("slow"), or writes READY_FILE and then blocks forever ("hang",
for a SIGKILL mid-publish). Prints the result as one JSON line; lock waits go to stderr.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from eagle3_dagster.publish.export import EXPORTERS
from eagle3_dagster.publish.snapshot import PublishLockOptions, SnapshotContent, build_snapshot
from eagle3_dagster.storage import DataDirLocked


def main() -> int:
    data, run_id, mode = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    ready = Path(sys.argv[4]) if len(sys.argv) > 4 else None

    def extra(staging, exports):
        if ready is not None:
            ready.write_text(str(staging))
        if mode == "slow":
            time.sleep(1.5)
        elif mode == "hang":
            time.sleep(3600)
        return {}

    shards = sorted(int(p.name.split("=")[1]) for p in (data / "training_samples").glob("shard=*"))
    try:
        snap = build_snapshot(
            data,
            shards,
            lambda g, k: SimpleNamespace(success=True),
            SnapshotContent(config={"c": 1}, exporters=[*EXPORTERS, extra]),
            lock=PublishLockOptions(
                run_id=run_id, wait_s=60, on_wait=lambda line: print(line, file=sys.stderr, flush=True)
            ),
        )
    except DataDirLocked as e:
        print(str(e), file=sys.stderr, flush=True)
        return 3
    print(json.dumps({"version": snap.version, "created": snap.created, "latest": snap.latest}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
