"""The demo's console shows a failed step as one line with its error's root cause, never the stack traces."""

from __future__ import annotations

from eagle3_dagster.orchestration.console import one_line_error

WRAPPED = (
    'ingest - r1 - 42 - source__lost - STEP_FAILURE - Execution of step "source__lost" failed.\n\n'
    'dagster._core.errors.DagsterExecutionStepExecutionError: Error occurred while executing op "source__lost":\n\n'
    'Stack Trace:\n  File "/x/execute_plan.py", line 243, in dagster_event_sequence_for_step\n    yield\n\n'
    "The above exception was caused by the following exception:\n"
    "eagle3_dagster.ingest.errors.IngestFileError: source 'lost': file not found: /a/nowhere.jsonl\n\n"
    'Stack Trace:\n  File "/x/spec.py", line 120, in files\n    raise\n'
)


def test_a_wrapped_error_is_one_line_naming_its_cause():
    line = one_line_error(WRAPPED)
    assert "\n" not in line and "Stack Trace" not in line and "File " not in line
    assert line == (
        'ingest - r1 - 42 - source__lost - STEP_FAILURE - Execution of step "source__lost" failed. '
        "IngestFileError: source 'lost': file not found: /a/nowhere.jsonl (stack trace in the run's event log)"
    )


def test_a_failure_without_cause_keeps_its_own_line_and_other_messages_are_untouched():
    failure = "x - STEP_FAILURE - failed.\n\ndagster._core.definitions.events.Failure: shard 0000: why\n\nStack Trace:\n  File a\n"
    assert (
        one_line_error(failure)
        == "x - STEP_FAILURE - failed. Failure: shard 0000: why (stack trace in the run's event log)"
    )
    assert one_line_error("a user's\n\nmulti-line log") == "a user's\n\nmulti-line log"
