"""Hostile server text: a server whose drafter path and revision, version, weight version, error bodies and
abort messages hold newlines, terminal escapes (ESC[2J clears the screen), a right-to-left override and HTML.
None of it reaches a log line, the step's metadata, an error row's message, the Dagster event log, the demo
console or its summary, or the data card as the control characters it holds: each is shown escaped on one line,
so a server cannot forge a log line or clear a terminal. What is stored as data (a row's drafter path) keeps the
server's text as received. Real simulator over HTTP (fleet fault hostile_text), real Parquet.
"""

from __future__ import annotations

import json
import logging
import unicodedata
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from gen_helpers import make_config, make_prompts

from eagle3_dagster.config import settings
from eagle3_dagster.generate import generate_shard, read_generation_errors, read_generations
from eagle3_dagster.generate.report import result_line
from eagle3_dagster.secret import printable

FORGED = "\n2099-01-01 00:00:00 - eagle3 - ERROR - every row was deleted"
HOSTILE = f"{FORGED}\x1b[2J\x1b[31m<script>alert(1)</script>\u202eevil\r\x85\u2028"
SPEC = ("--speculative-draft-model-path", "test/kimi-eagle3-a", "--speculative-num-draft-tokens", "4")


def unprintable(text: str) -> list[str]:
    """The control, format and line-separator characters in `text` (what a terminal or log viewer acts on)."""
    return [c for c in text if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")]


def test_printable_escapes_every_control_format_and_line_separator_character():
    shown = printable(HOSTILE)
    assert not unprintable(shown)
    assert "\\n2099-01-01" in shown and "\\x1b[2J" in shown and "\\u202e" in shown and "\\r" in shown
    assert "\\x85" in shown and "\\u2028" in shown
    assert "<script>" in shown  # HTML is for the HTML writers to escape (the report does), not a control character
    plain = "Kimi-K2.5 — 中文 tokens, café"
    assert printable(plain) is plain  # ordinary text, non-ASCII included, is untouched


@pytest.mark.integration
def test_hostile_server_text_is_shown_escaped_and_stored_as_received(start_sim, tmp_path: Path, caplog):
    sim = start_sim(*SPEC)
    # the drafter's path and revision, the version, the error body and the abort message carry HOSTILE; the
    # weight version (in every answer and the model revision) is hostile too
    sim.faults(hostile_text=HOSTILE, weight_version="v2" + HOSTILE, error_body=1, abort_status=1)
    caplog.set_level(logging.DEBUG)
    out = tmp_path / "s"
    rep = generate_shard(make_prompts(8, seed=97), out, make_config(sim.url, max_retries=0))
    assert sim.stats()["faults_injected"].get("error_body") == 1
    assert rep.errors_by_kind == {"server_error_body": 1, "aborted": 1} and rep.succeeded == 6

    errors = read_generation_errors(out)
    texts = {
        "log": [r.getMessage() for r in caplog.records],
        "metadata": [json.dumps(rep.as_metadata(), ensure_ascii=False, default=str)],
        "metadata values": [str(v) for v in _strings(rep.as_metadata())],
        "result line": [result_line("0000", rep)],
        "error rows": errors["detail"].to_list(),
    }
    for where, lines in texts.items():
        bad = [t for t in lines if unprintable(t)]
        assert not bad, f"{where}: {bad[:2]!r}"
    # the server's words are still there, escaped: the reader sees what the server sent
    details = " ".join(errors["detail"].to_list())
    assert "\\x1b[2J" in details and "\\n2099-01-01" in details and "Aborted by the scheduler" in details
    assert "\\x1b[2J" in rep.model_revision and "\\x1b[2J" in next(iter(rep.server_versions.values()))
    drafter_logged = [m for m in texts["log"] if "test/kimi-eagle3-a" in m]
    assert not [m for m in drafter_logged if "\x1b" in m]

    rows = read_generations(out)
    # data keeps what the server sent: the drafter path of the row is the server's string
    assert set(rows["spec_draft_model_path"]) == {"test/kimi-eagle3-a" + HOSTILE}
    assert not [r for r in rows["model_revision"] if unprintable(r)]  # a key built by the client, shown everywhere


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (*_strings(k), *_strings(v))]
    if isinstance(value, list | tuple):
        return [s for v in value for s in _strings(v)]
    return []


def test_the_dagster_event_log_and_the_demo_console_get_one_escaped_line():
    from eagle3_dagster.defs.generate import _ToDagsterLog
    from eagle3_dagster.orchestration.console import _OneLineFormatter

    said: Counter[str] = Counter()
    log = SimpleNamespace(info=lambda m: said.update([m]), warning=lambda m: said.update([m]), error=said.update)
    handler = _ToDagsterLog(SimpleNamespace(log=log))  # type: ignore[arg-type]
    lg = logging.getLogger("eagle3_dagster.generate.hostile_test")
    lg.addHandler(handler)
    try:
        lg.warning("endpoint %s: drafter %s", "http://x:1", "test/d" + HOSTILE)
    finally:
        lg.removeHandler(handler)
    [msg] = list(said)
    assert not unprintable(msg) and "\\x1b[2J" in msg and "\\n2099-01-01" in msg
    record = logging.LogRecord("dagster", logging.INFO, __file__, 1, "drafter %s", ("test/d" + HOSTILE,), None)
    line = _OneLineFormatter("%(message)s").format(record)
    assert not unprintable(line) and line.startswith("drafter test/d\\n2099-01-01")


def test_the_demo_summary_escapes_what_the_runs_quote(tmp_path: Path):
    from eagle3_dagster.app.demo import summarize, warnings_line
    from eagle3_dagster.orchestration.run import GraphOutcome, ShardOutcome
    from eagle3_dagster.storage import data_root

    shard = ShardOutcome("0000", False, errors=[f"generations: EndpointRefusedError: refused: SGLang 0.5.23{HOSTILE}"])
    outcome = GraphOutcome(True, "r", [shard], logged_warnings=[f"shard 0000: drafter test/d{HOSTILE}"])
    data = tmp_path / "data"
    data.mkdir()
    summary = summarize(outcome, data_root(data), settings())
    lines = summary.split("\n")
    assert not [ln for ln in lines if unprintable(ln)]
    assert not [ln for ln in lines if ln.startswith("2099-01-01")]  # no forged line
    assert any("SGLang 0.5.23\\n2099-01-01" in ln and "\\x1b[2J" in ln for ln in lines)
    line = warnings_line({}, {"0000": {"server_error_body": (1, "the server said" + HOSTILE)}})
    assert not unprintable(line) and "\\x1b[2J" in line


def test_the_data_card_writes_a_hostile_model_revision_on_one_escaped_line():
    from eagle3_dagster.publish.card import model_section

    values: dict[str, Counter[str]] = {
        "tokenizer_fingerprint": Counter({"tf": 3}),
        "model_revision": Counter({"moonshotai/Kimi-K2.5" + HOSTILE + "@default": 3}),
        "template_hash": Counter({"t": 3}),
        "sampling_hash": Counter({"s": 3}),
    }
    text = "\n".join(model_section({"config": {"profile": "kimi-k2.5"}}, values))
    assert not [c for c in text if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") and c != "\n"]
    assert "\\x1b[2J" in text and not [ln for ln in text.split("\n") if ln.startswith("2099-01-01")]
