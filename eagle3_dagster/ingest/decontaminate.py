"""Decontamination: a training prompt that overlaps an eval prompt is quarantined as `eval_overlap`.

Eval sources (`role: eval` in the source YAML) are ingested like any other source (normalized,
deduplicated, their own rejects) but never reach prompts.parquet, so they are never tokenized or
generated: `combine_sources` (pipeline.py) builds an `EvalIndex` from their accepted rows and checks
every training prompt against it.

Which text: the content of the USER turns only -- of the prompt's `messages`, and for a
`regenerate: all_turns` source of its whole `conversation` (its later user turns are sent too).
System prompts, assistant turns, tool results and tool schemas are not compared.

Normalisation (both sides, `words`): invisible characters dropped (format characters such as U+200B
ZERO WIDTH SPACE and U+00AD SOFT HYPHEN, which NFKC keeps, and the other default-ignorable code points:
invisible.py), Unicode NFKC, lowercase (str.lower), then every run of characters that are not letters or
digits (punctuation, symbols, whitespace, '_') is one word boundary. The normalized text is the words
joined by one space: "Janet's ducks lay 16 eggs per day!" -> "janet s ducks lay 16 eggs per day", and
"Ja<U+200B>net's" gives "janet s" too (a zero-width space no longer splits a word).

A training prompt overlaps an eval prompt when

* exact: the normalized text of one of its user turns, or of all its user turns joined, equals the
  normalized text of an eval prompt's user turn or of all its user turns joined; or
* n-gram: the two share 13-grams (13 consecutive normalized words inside one user turn, GPT-3's
  decontamination unit) and shared / min(training prompt's 13-grams, eval prompt's 13-grams) is at
  least the eval source's `overlap_threshold` (default 0.5). The min makes both directions count: a
  training prompt that embeds a whole eval question in a longer text scores 1.0, and so does a
  training prompt that is a 13+-word piece of an eval question. A user text under 13 words has no
  13-gram: only the exact rule can catch it.

The first (most overlapping; on ties the first indexed) eval prompt is named in the reject row.
13-grams are kept as Python `hash()` ints of word tuples: built and looked up in one process only,
never stored, so the per-process hash seed does not matter; a 64-bit collision would need to hit a
whole share of a prompt's 13-grams to matter.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass, field

from .invisible import drop_invisible

NGRAM = 13
DEFAULT_OVERLAP_THRESHOLD = 0.5
REASON = "eval_overlap"

_WORD = re.compile(r"[^\W_]+")
# ASCII text (most prompts): the same words without the regex: non-alphanumerics become spaces
_ASCII_BOUNDARIES = str.maketrans({c: " " for c in map(chr, range(128)) if not c.isalnum()})


def words(text: str) -> list[str]:
    """The normalized words of `text` (see the module docstring)."""
    if text.isascii():  # NFKC leaves ASCII as it is, and ASCII has no invisible character
        return text.lower().translate(_ASCII_BOUNDARIES).split()
    return _WORD.findall(unicodedata.normalize("NFKC", drop_invisible(text)).lower())


def normalize_text(text: str) -> str:
    return " ".join(words(text))


def ngram_hashes(ws: list[str], n: int = NGRAM) -> set[int]:
    """Hashes of every n consecutive words; empty for fewer than n words."""
    if len(ws) < n:
        return set()
    return set(map(hash, zip(*(ws[i:] for i in range(n)), strict=False)))


def user_texts(messages_json: str, conversation_json: str | None = None) -> list[str]:
    """The user turns' content of a prompts row: its whole conversation when it has one (all_turns)."""
    msgs = json.loads(conversation_json if conversation_json else messages_json)
    return [m["content"] for m in msgs if m.get("role") == "user" and isinstance(m.get("content"), str)]


@dataclass(frozen=True)
class EvalPrompt:
    source: str
    prompt_id: str
    source_row: int
    n_grams: int


@dataclass(frozen=True)
class Overlap:
    kind: str  # "exact" | "ngram"
    eval_prompt: EvalPrompt
    shared: int = 0  # 13-grams in common (ngram)
    denominator: int = 0  # min(training 13-grams, eval 13-grams) (ngram)
    fraction: float = 1.0
    threshold: float = 0.0
    kind_of_set: str = "eval"  # or "probe": which kind of reference set the prompt belongs to

    def detail(self) -> str:
        e = self.eval_prompt
        where = f"{self.kind_of_set} source {e.source!r} prompt {e.prompt_id} (row {e.source_row})"
        if self.kind == "exact":
            return f"exact match after normalisation with {where}"
        return (
            f"{NGRAM}-gram overlap with {where}: {self.shared} of min(training, eval) {self.denominator} "
            f"{NGRAM}-grams shared = {self.fraction:.2f} >= overlap_threshold {self.threshold:g}"
        )


def _turn_words(texts: Iterable[str]) -> list[list[str]]:
    return [w for w in (words(t) for t in texts) if w]


def _exact_keys(turns: list[list[str]]) -> list[str]:
    keys = [" ".join(w) for w in turns]
    if len(keys) > 1:
        keys.append(" ".join(keys))
    return keys


@dataclass
class EvalSourceStats:
    """Per eval source, for the report: its prompts and what it removed."""

    eval_prompts: int = 0
    overlap_threshold: float = DEFAULT_OVERLAP_THRESHOLD
    exact: int = 0
    ngram: int = 0


@dataclass
class EvalIndex:
    """Every eval prompt's exact keys and 13-gram hashes; `match` checks one training prompt."""

    prompts: list[EvalPrompt] = field(default_factory=list)
    stats: dict[str, EvalSourceStats] = field(default_factory=dict)
    _exact: dict[str, int] = field(default_factory=dict)
    _owner: dict[int, int] = field(default_factory=dict)  # 13-gram -> eval prompt index; -1: several
    _owners: dict[int, list[int]] = field(default_factory=dict)  # the 13-grams with several owners

    def add_source(self, name: str, overlap_threshold: float = DEFAULT_OVERLAP_THRESHOLD) -> None:
        if name in self.stats:
            raise ValueError(f"eval source {name!r} is indexed twice")
        self.stats[name] = EvalSourceStats(overlap_threshold=float(overlap_threshold))

    def add(self, source: str, prompt_id: str, source_row: int, texts: Iterable[str]) -> None:
        turns = _turn_words(texts)
        grams: set[int] = set()
        for w in turns:
            grams |= ngram_hashes(w)
        idx = len(self.prompts)
        self.prompts.append(EvalPrompt(source, prompt_id, source_row, len(grams)))
        self.stats[source].eval_prompts += 1
        for key in _exact_keys(turns):
            self._exact.setdefault(key, idx)
        for h in grams:
            prev = self._owner.get(h)
            if prev is None:
                self._owner[h] = idx
            elif prev >= 0:
                self._owner[h] = -1
                self._owners[h] = [prev, idx]
            else:
                self._owners[h].append(idx)

    def __len__(self) -> int:
        return len(self.prompts)

    def match(self, texts: Iterable[str]) -> Overlap | None:
        """The eval prompt this training prompt's user texts overlap, or None."""
        turns = _turn_words(texts)
        hits_exact = [self._exact[k] for k in _exact_keys(turns) if k in self._exact]
        if hits_exact:
            return Overlap("exact", self.prompts[min(hits_exact)])
        grams: set[int] = set()
        for w in turns:
            grams |= ngram_hashes(w)
        if not grams or self._owner.keys().isdisjoint(grams):
            return None
        hits: dict[int, int] = {}
        for h in grams:
            o = self._owner.get(h)
            if o is None:
                continue
            for idx in (o,) if o >= 0 else self._owners[h]:
                hits[idx] = hits.get(idx, 0) + 1
        best: Overlap | None = None
        for idx in sorted(hits):
            e = self.prompts[idx]
            denominator = min(len(grams), e.n_grams)
            fraction = hits[idx] / denominator
            threshold = self.stats[e.source].overlap_threshold
            if fraction >= threshold and (best is None or fraction > best.fraction):
                best = Overlap("ngram", e, hits[idx], denominator, fraction, threshold)
        return best

    def record(self, overlap: Overlap) -> None:
        """Count a removed training prompt against its eval source."""
        s = self.stats[overlap.eval_prompt.source]
        if overlap.kind == "exact":
            s.exact += 1
        else:
            s.ngram += 1
