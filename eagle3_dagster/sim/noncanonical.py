"""Non-canonical token splits, as a real sampler emits them (`eagle3-sim --noncanonical-rate R`).

A model sampling at temperature 1.0 regularly emits a token sequence that is not the canonical BPE
encoding of its own text: `hel` + `lo` where encoding the text gives the single token `hello`, or a
multi-byte character's bytes split over two tokens where the tokenizer has one. Such output is valid
(it is exactly what a drafter must learn to predict), and the pipeline must keep it.

`NonCanonicalSplitter.apply(ids, rng)` rewrites up to `max_splits` ordinary tokens of a sample into two
vocabulary tokens whose bytes concatenate to the original token's bytes. Every rewrite is checked with
the real tokenizer before it is used: decode(split) == decode(original) and encode(text) != split ids.
Multi-byte tokens (CJK, symbols) are preferred, since that is where real samplers split most.
Special / added tokens (markers, `<think>`, tool-call delimiters, end of turn) are never split.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Sequence
from typing import Any


def check_noncanonical_args(rate: float, max_splits: int) -> None:
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"--noncanonical-rate must be within [0, 1], got {rate}")
    if max_splits < 1:
        raise ValueError(f"--noncanonical-max-splits must be >= 1, got {max_splits}")


class NonCanonicalSplitter:
    def __init__(self, tokenizer: Any, rate: float, *, max_splits: int = 3) -> None:
        check_noncanonical_args(rate, max_splits)
        self.tok = tokenizer
        self.rate = rate
        self.max_splits = max_splits
        self._vocab: dict[str, int] = tokenizer.get_vocab()
        self._protected = set(getattr(tokenizer, "added_tokens_decoder", {}) or {}) | set(tokenizer.all_special_ids)
        self._pairs: dict[int, tuple[int, int] | None] = {}
        self._lock = threading.Lock()
        self.samples_split = 0  # samples whose ids were rewritten
        self.tokens_split = 0  # tokens replaced by two
        self.rejected = 0  # candidate rewrites that failed the tokenizer check (never emitted)

    def _pair(self, tid: int) -> tuple[int, int] | None:
        """Two vocabulary tokens whose byte strings concatenate to token `tid`'s, or None."""
        if tid in self._pairs:
            return self._pairs[tid]
        best = None
        if tid not in self._protected:
            piece = self.tok.convert_ids_to_tokens(tid)
            if isinstance(piece, str) and len(piece) >= 2:
                # middle-most split first: for a 3-byte character that is 1+2 or 2+1 bytes
                for k in sorted(range(1, len(piece)), key=lambda k: abs(2 * k - len(piece))):
                    a, b = self._vocab.get(piece[:k]), self._vocab.get(piece[k:])
                    if a is not None and b is not None and a not in self._protected and b not in self._protected:
                        best = (a, b)
                        break
        self._pairs[tid] = best
        return best

    def _multibyte(self, tid: int) -> bool:
        text = self.tok.decode([tid], skip_special_tokens=False)
        return any(ord(c) > 127 for c in text) or "\ufffd" in text

    def apply(self, ids: Sequence[int], rng: random.Random) -> list[int]:
        """`ids` with up to max_splits tokens split (for a `rate` share of samples), text unchanged."""
        ids = list(ids)
        if self.rate <= 0 or rng.random() >= self.rate:
            return ids
        with self._lock:
            cands = [i for i, t in enumerate(ids) if self._pair(t) is not None]
            if not cands:
                return ids
            multi = [i for i in cands if self._multibyte(ids[i])]
            pool = multi if multi else cands
            n = rng.randint(1, self.max_splits)
            chosen = set(rng.sample(pool, min(n, len(pool))))
            if len(chosen) < n:
                rest = [i for i in cands if i not in chosen]
                chosen |= set(rng.sample(rest, min(n - len(chosen), len(rest))))
            out: list[int] = []
            for i, t in enumerate(ids):
                pair = self._pair(t) if i in chosen else None
                out.extend(pair if pair else (t,))
            text = self.tok.decode(ids, skip_special_tokens=False)
            ok = (
                self.tok.decode(out, skip_special_tokens=False) == text
                and self.tok.encode(text, add_special_tokens=False) != out
            )
            if not ok:
                self.rejected += 1
                return ids
            self.samples_split += 1
            self.tokens_split += len(chosen)
            return out

    def stats(self) -> dict[str, Any]:
        return {
            "rate": self.rate,
            "max_splits": self.max_splits,
            "samples_split": self.samples_split,
            "tokens_split": self.tokens_split,
            "rejected_checks": self.rejected,
        }
