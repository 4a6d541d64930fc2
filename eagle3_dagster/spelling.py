"""Did you mean: the known name a misspelt one is closest to (a setting, a source YAML key, a profile key or
name), so a typo is named with what was meant instead of being ignored or refused bare."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(word: str, known: Iterable[str], *, cutoff: float = 0.75) -> str:
    """ " (did you mean 'x'?)" naming the known name a misspelt `word` is closest to (difflib's ratio at least
    `cutoff`), or the one name it is the start of (`kimi` for `kimi-k2.5`); "" when none is close."""
    names = sorted(known)
    close = difflib.get_close_matches(word, names, n=1, cutoff=cutoff)
    started = [n for n in names if word and n.lower().startswith(word.lower())]
    guess = close[0] if close else (started[0] if len(started) == 1 else None)
    return f" (did you mean {guess!r}?)" if guess else ""
