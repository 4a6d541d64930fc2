"""User and model text inside Markdown metadata, shown as code and never rendered.

Dagster's UI renders `MetadataValue.md` as Markdown: a prompt holding `![x](https://host/p.png)` would
make every viewer's browser fetch that URL, and a heading or link in a model answer would be drawn as
one. Text that came from a dataset or a server goes through `fence` (a block) or `code_span` (inline),
whose delimiters are longer than any backtick run in the text, so the text cannot close them.
"""

from __future__ import annotations

import re

_BACKTICKS = re.compile(r"`+")


def _longest_backtick_run(text: str) -> int:
    return max((len(m) for m in _BACKTICKS.findall(text)), default=0)


def fence(text: str, lang: str = "text") -> str:
    """A fenced code block holding `text` verbatim (its fence is longer than any backtick run in it)."""
    f = "`" * max(3, _longest_backtick_run(text) + 1)
    return f"{f}{lang}\n{text}\n{f}"


def code_span(text: str) -> str:
    """`text` as one inline code span on one line (newlines become spaces)."""
    flat = " ".join(text.splitlines())
    ticks = "`" * (_longest_backtick_run(flat) + 1)
    # a space on each side lets a span start or end with a backtick; CommonMark strips one of each
    pad = " " if flat.startswith("`") or flat.endswith("`") or not flat.strip() else ""
    return f"{ticks}{pad}{flat}{pad}{ticks}"
