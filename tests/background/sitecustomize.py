"""Imported at start-up by every Python process of `make test`'s parallel lane (the Makefile puts this folder
on PYTHONPATH and sets EAGLE3_TEST_BACKGROUND=1 for that lane only).

The parallel lane runs beside the serial lane at the lowest CPU priority (`nice -n 19` in a session of its
own), so the serial lane's wall-clock bounds see a quiet machine while the parallel lane uses the CPU they
leave idle. Linux schedules each session as one group (sched_autogroup): a process the lane starts in a new
session (a simulator, a Dagster daemon: `start_new_session=True`) would compete at full weight again,
whatever its nice value. So such a session leader lowers its own group to 19 as well. Never fails a process.
"""

import os

if os.environ.get("EAGLE3_TEST_BACKGROUND") == "1":
    try:
        if os.getsid(0) == os.getpid():
            with open("/proc/self/autogroup", "w") as f:
                f.write("19")
    except OSError:
        pass
