"""The tests `make test` runs after the parallel lane, one after another in one process.

`make test` runs the suite in pytest-xdist workers (-n 3 --dist loadfile: a module's tests share a worker,
so a module-scoped simulator or Dagster deployment is built once), then, alone, the tests marked `serial`
here (tests/conftest.py marks them): those that measure the wall clock (bounds on waits, stalls and
timeouts), send signals to process groups or drive the browser, which a busy machine would make flaky.
Every test makes its own dirs (tmp_path) and ports (free_port), so the workers share nothing.
"""

from __future__ import annotations

from collections.abc import Collection

SERIAL_MODULES = frozenset(
    {
        "tests/generate/test_fleet_states.py",  # a bounded 3-8 s wait, named within 2 s
        "tests/generate/test_run_wait.py",  # one shard's wait ends another's in < 0.5 s
        "tests/generate/test_sglang_router.py",  # no second wait: took < half the wait
        "tests/sim/test_sim_abort_faults.py",  # slot and busy seconds against the wall clock
        "tests/pipeline/test_run_config_overrides.py",  # 1 s stall and read timeouts
        "tests/pipeline/test_fleet_graph.py",  # dead endpoints named within 10 s of the start
        "tests/reliability/test_fault_matrix.py",  # stall and read timeouts of 1-3 s, SIGKILL mid-chunk
        "tests/pipeline/test_demo_stop.py",  # Ctrl-C / SIGTERM to a running demo
        "tests/pipeline/test_publish_stop_graph.py",
        "tests/pipeline/test_stopping_and_versions.py",
        "tests/publish/test_publish_stop.py",
        # whole runs against the wall clock, or whose runs must overlap: beside two busy workers they run out
        "tests/reliability/test_postgres_pool.py",  # four shard runs, two generating at once
        "tests/pipeline/test_demo_dead_url.py",  # a cached shard in < 60 s, a dead endpoint named in < 90 s
        "tests/pipeline/test_demo_plain_errors.py",  # FAILED in < 60 s
        "tests/generate/test_cached_no_server.py",  # no wait for a dead endpoint: < 30 s
        "tests/reliability/test_browser.py",  # headless Chromium
        "tests/reliability/test_screenshots.py",
    }
)
# The parallel lane's longest modules (seconds of one worker, measured), started first: xdist hands modules out in
# collection order, so a long one collected last would run alone at the end while the other workers sit idle.
LONG_MODULES = (
    "tests/pipeline/test_nightly_daemon.py",
    "tests/pipeline/test_fleet_backfill.py",
    "tests/pipeline/test_nightly_incremental.py",
    "tests/test_gpu_smoke.py",
    "tests/plan/test_plan_cli.py",
    "tests/reliability/test_executors.py",
    "tests/report/test_quality_html_report.py",
    "tests/pipeline/test_demo_named_jobs.py",
    "tests/generate/test_router_capacity.py",
    "tests/reliability/test_object_storage.py",
    "tests/pipeline/test_acceptance_drift_graph.py",
    "tests/pipeline/test_probe_graph.py",
    "tests/pipeline/test_multiturn_graph.py",
    "tests/pipeline/test_bfcl_multiturn_graph.py",
    "tests/pipeline/test_demo_lock.py",
    "tests/pipeline/test_requeue_quarantined.py",
    "tests/publish/test_specforge_lane.py",
    "tests/pipeline/test_publish_gates.py",
)
# the session's `eagle3 ui` (a simulator and `dagster dev`) starts once, in the serial lane, not once per worker
SERIAL_FIXTURES = frozenset({"eagle3_ui"})
# The tests marked `full` (`make test-full` only): a whole other deployment for minutes. Marking one more means
# adding it here, so a test cannot leave `make test` unseen (tests/test_test_lanes.py holds the marks to it).
FULL_TESTS = frozenset(
    {
        "tests/pipeline/test_nightly_daemon.py::test_nightly_under_the_real_daemon_publishes_then_fails_loudly",
        "tests/pipeline/test_fleet_backfill.py::"
        "test_a_four_shard_backfill_overlaps_runs_and_keeps_generation_within_the_pool",
        "tests/test_gpu_smoke.py::test_the_gpu_path_runs_end_to_end_with_the_simulator_standing_in_for_sglang",
        "tests/test_gpu_smoke.py::test_the_summary_names_the_gate_that_failed",
        "tests/reliability/test_executors.py::test_step_processes_fork_from_a_server_that_never_loaded_polars",
        "tests/reliability/test_executors.py::"
        "test_k8s_executor_from_config_alone_loads_and_accepts_the_documented_run_config",
        "tests/reliability/test_executors.py::"
        "test_multiprocess_executor_on_postgres_instance_runs_each_step_in_its_own_process",
        "tests/reliability/test_object_storage.py::test_whole_graph_on_s3_matches_a_local_run",
        "tests/pipeline/test_nightly_incremental.py::test_dg_launch_runs_a_shard",
    }
)


def is_serial(module: str, fixtures: Collection[str]) -> bool:
    """Whether a test in `module` (its path from the project root) using `fixtures` runs in the serial lane."""
    return module in SERIAL_MODULES or not SERIAL_FIXTURES.isdisjoint(fixtures)


def long_modules_first(modules: list[str]) -> list[str]:
    """`modules` (paths from the project root, in collection order) with LONG_MODULES first, in their order."""
    rank = {m: i for i, m in enumerate(LONG_MODULES)}
    return sorted(modules, key=lambda m: rank.get(m, len(rank)))
