"""The console logger of the runs `eagle3 demo` executes: one line per event, never a stack trace, never a
control character (a server's text cannot clear the terminal or forge a line: secret.printable).

Dagster's default console logger prints a failed step's whole error chain (the stack of each cause)
after its event line; a run whose endpoint is down printed dozens of such traces for one cause the
summary already names. Here a failure event keeps its line and the first line of its error; the full
error and its traces stay in the run's event log (the UI shows them).
"""

from __future__ import annotations

import logging
import sys

import dagster as dg

from ..secret import printable

TRACE_MARK = "Stack Trace:"


def one_line_error(message: str) -> str:
    """An event line with its error's first line instead of the error chain and its stack traces."""
    head, sep, rest = message.partition("\n\n")
    if not sep or TRACE_MARK not in rest:
        return message
    lines = [ln.strip() for ln in rest.splitlines()]
    # the error, or its root cause: Dagster wraps an unexpected exception ("Error occurred while executing op")
    heads = [next((ln for ln in lines if ln), "")]
    heads += [lines[i + 1] for i, ln in enumerate(lines[:-1]) if ln.endswith("caused by the following exception:")]
    first = heads[-1]
    # "eagle3_dagster.ingest.errors.IngestFileError: why" -> "IngestFileError: why"
    cls, colon, why = first.partition(": ")
    short = f"{cls.rsplit('.', 1)[-1]}{colon}{why}" if colon else first
    return f"{head} {short} (stack trace in the run's event log)"


class _OneLineFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        short = logging.makeLogRecord(record.__dict__)
        short.msg, short.args = printable(one_line_error(record.getMessage())), None
        return super().format(short)


class _StderrHandler(logging.StreamHandler):
    """Writes to the sys.stderr of the moment (a step's compute-log capture swaps it)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


@dg.logger(
    config_schema={
        "log_level": dg.Field(str, is_required=False, default_value="INFO"),
        "name": dg.Field(str, is_required=False, default_value="dagster"),
    },
    description="Console lines without stack traces (they stay in the event log).",
)
def one_line_console_logger(init_context: dg.InitLoggerContext) -> logging.Logger:
    cfg = init_context.logger_config
    logger = logging.Logger(cfg["name"], level=cfg["log_level"].upper())
    handler = _StderrHandler()
    handler.setFormatter(
        _OneLineFormatter("%(asctime)s - %(name)s - %(levelname)s - %(message)s", "%Y-%m-%d %H:%M:%S %z")
    )
    logger.addHandler(handler)
    return logger
