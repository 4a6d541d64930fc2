"""The checks column of the demo summary's shard table, made to fit a terminal.

A shard has half a dozen checks; written out as `name=PASS` each, a row is ~200 characters. Passing
checks are counted, the others (FAIL, WARN, empty) are named, and a row that is still too wide wraps
under its own column. The quality report keeps every check of every shard.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

SUMMARY_WIDTH = 100  # a terminal of 100 columns shows every row of the shard table unbroken


def checks_column(words: Sequence[tuple[str, str]], indent: int, width: int = SUMMARY_WIDTH) -> list[str]:
    """The column for one shard from its (check name, PASS/WARN/FAIL/empty) pairs, in order: the first
    line's text (it follows `indent` characters of the row), then whole continuation lines indented by
    `indent`. `all 6 PASS` when every check passed; else `4 PASS; generations_gate=empty, ...`."""
    if not words:
        return [""]
    passed = sum(1 for _, w in words if w == "PASS")
    others = ", ".join(f"{name}={w}" for name, w in words if w != "PASS")
    if not others:
        text = f"all {passed} PASS"
    else:
        text = (f"{passed} PASS; " if passed else "") + others
    lines = textwrap.wrap(text, width=max(20, width - indent), break_long_words=False, break_on_hyphens=False) or [text]
    return [lines[0], *(" " * indent + ln for ln in lines[1:])]
