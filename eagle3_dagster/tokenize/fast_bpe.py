"""An exact, faster encode/decode for byte-level BPE tokenizers: a `tiktoken` encoding built from the
loaded Hugging Face tokenizer itself.

Why: the training stage re-encodes every assistant turn (the round trip, tokenize/parse.py). Through the
`tokenizers` library most of that time is its pre-tokenizer regex (Oniguruma); `tiktoken` runs the
same regex (fancy-regex) and the same byte-level BPE several times faster, and decodes ids to bytes
without building token strings.

What is built (`FastBPE.from_tokenizer`), all from the tokenizer's own Rust backend (so it does not
matter whether it was loaded from tokenizer.json, vocab.json + merges.txt or a converted tiktoken file):
  - ranks: every vocabulary token's bytes (GPT-2 byte<->unicode map) -> its id;
  - the pattern: the pre-tokenizer's `Split` regex;
  - special tokens: every added token (special or not: both are cut out of the text before BPE);
  - the normalizer: none, or NFC applied to each piece of text between added tokens, as `tokenizers` does.
It is used only when it is exact: anything outside that shape (not BPE, byte fallback, another
normalizer or pre-tokenizer, added tokens with strip/word options) is refused, and a probe (special
tokens and text around them, CJK, emoji, combining marks, whitespace runs, digits, contractions,
non-canonical splits, invalid UTF-8 byte runs, random ids) must give exactly the tokenizer's own
`encode` ids and `decode` text. `fast_bpe_for` returns None otherwise and logs ONE line naming the
reason; callers then use the `tokenizers` path (same results, slower).
"""

from __future__ import annotations

import itertools
import logging
import os
import random
import re
import unicodedata
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)


class FastBPEUnavailable(Exception):
    """This tokenizer cannot be served exactly by the fast backend; the message says why."""


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level map: every byte -> one printable character (the vocabulary's alphabet)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    out = {b: chr(b) for b in keep}
    n = 0
    for b in range(256):
        if b not in out:
            out[b] = chr(256 + n)
            n += 1
    return out


def _state(component: Any) -> dict[str, Any] | None:
    import json

    return None if component is None else json.loads(component.__getstate__())


def _check_shape(backend: Any) -> tuple[str, bool]:
    """(the pre-tokenizer's Split regex, whether NFC is applied) or FastBPEUnavailable naming what differs."""
    model = backend.model  # its attributes, not its state (that would serialize the whole vocabulary)
    if type(model).__name__ != "BPE":
        raise FastBPEUnavailable(f"the model is {type(model).__name__}, not BPE")
    for key, ok in (
        ("byte_fallback", (False, None)),
        ("dropout", (None, 0.0)),
        ("continuing_subword_prefix", (None, "")),
        ("end_of_word_suffix", (None, "")),
    ):
        if getattr(model, key, None) not in ok:
            raise FastBPEUnavailable(f"BPE {key}={getattr(model, key, None)!r} is not supported")
    normalizer = _state(backend.normalizer)
    nfc = normalizer is not None
    if nfc and normalizer != {"type": "NFC"}:
        raise FastBPEUnavailable(f"normalizer {normalizer} is not supported (only none or NFC)")
    pre = _state(backend.pre_tokenizer) or {}
    steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else None
    if (
        not steps
        or len(steps) != 2
        or steps[0].get("type") != "Split"
        or "Regex" not in (steps[0].get("pattern") or {})
        or steps[0].get("behavior") != "Isolated"
        or steps[0].get("invert")
        or steps[1].get("type") != "ByteLevel"
        or steps[1].get("add_prefix_space")
        or steps[1].get("use_regex")
    ):
        raise FastBPEUnavailable(f"pre-tokenizer {str(pre)[:200]} is not Split(regex) + ByteLevel")
    decoder = _state(backend.decoder) or {}
    if decoder.get("type") != "ByteLevel":
        raise FastBPEUnavailable(f"decoder {decoder.get('type')!r} is not ByteLevel")
    return steps[0]["pattern"]["Regex"], nfc


# The pre-tokenizer regexes of GPT-4-style byte-level BPE tokenizers (Kimi-K2.5, Qwen3, cl100k, o200k) end
# with these two alternatives; the first has a lookahead, which regex crates cannot run.
_WHITESPACE_TAIL = r"|\s+(?!\S)|\s+"


def grouped_pattern(pattern: str) -> str:
    """The same regex with every alternative before the whitespace tail in one non-capturing group.

    tiktoken runs the pattern with fancy-regex. Because of the lookahead, the pattern is "hard": its
    top-level alternation runs in fancy-regex's backtracking VM, which tries each alternative as its
    own delegated regex-crate match, in order, at every piece. Grouped, the lookahead-free alternatives
    are one delegate (the regex crate's leftmost-first semantics pick the same alternative and the
    same length a backtracking engine does), tried once per piece: the same pieces, ~25% less encode
    time on long outputs. Anything that does not have exactly that shape (other lookarounds or
    backreferences before the tail, an escaped `|`) is returned unchanged; the probe checks the result.
    """
    if not pattern.endswith(_WHITESPACE_TAIL):
        return pattern
    head = pattern[: -len(_WHITESPACE_TAIL)]
    trailing_backslashes = len(head) - len(head.rstrip("\\"))
    if not head or trailing_backslashes % 2 or re.search(r"\(\?<?[=!]|\\[1-9k]", head):
        return pattern
    return f"(?:{head}){_WHITESPACE_TAIL}"


class FastBPE:
    """tokenizer.encode(text, add_special_tokens=False) and tokenizer.decode(ids, skip_special_tokens=False,
    clean_up_tokenization_spaces=False) through tiktoken; build with `from_tokenizer` (checked by a probe)."""

    def __init__(self, encoding: Any, specials: dict[str, int], nfc: bool) -> None:
        self._enc = encoding
        self._specials = specials
        self._nfc = nfc
        # longest first: the leftmost-longest added token wins, as in `tokenizers`
        alternatives = sorted(specials, key=len, reverse=True)
        self._split = re.compile("(" + "|".join(re.escape(s) for s in alternatives) + ")") if specials else None
        self._allowed = frozenset(specials)
        # tiktoken matches added tokens itself (leftmost-first, any order) when no token is a prefix of another
        ordered = sorted(specials)  # a token that is a prefix of another sorts right before one of them
        prefix_free = not any(b.startswith(a) for a, b in itertools.pairwise(ordered))
        self._joins: dict[str, bool] = {}  # joins_at, per `end`
        self._encode: Callable[[str], list[int]] = (
            self._encode_native if prefix_free and not nfc else self._encode_segments
        )

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> FastBPE:
        """Build and probe; raises FastBPEUnavailable with the reason when it is not exact."""
        try:
            import tiktoken
        except ImportError:
            raise FastBPEUnavailable("the tiktoken package is not installed") from None
        backend = getattr(tokenizer, "backend_tokenizer", None) or getattr(tokenizer, "_tokenizer", None)
        if backend is None or not hasattr(backend, "get_vocab"):
            raise FastBPEUnavailable(f"{type(tokenizer).__name__} has no `tokenizers` backend")
        pattern, nfc = _check_shape(backend)
        alphabet = byte_to_unicode()
        vocab = backend.get_vocab(with_added_tokens=False)
        stray = set("".join(vocab)) - set(alphabet.values())
        if stray:
            raise FastBPEUnavailable(f"vocabulary characters {sorted(stray)[:5]} are not byte-level")
        # each byte-level character -> the character whose code is its byte, then latin-1: the token's bytes
        to_byte = str.maketrans({c: chr(b) for b, c in alphabet.items()})
        ranks = {token.translate(to_byte).encode("latin-1"): token_id for token, token_id in vocab.items()}
        if len(ranks) != len(vocab):
            raise FastBPEUnavailable("two vocabulary tokens have the same bytes")
        if len(ranks) < 256 or any(bytes([b]) not in ranks for b in range(256)):
            raise FastBPEUnavailable("the vocabulary does not hold every single byte")
        specials: dict[str, int] = {}
        for token_id, added in backend.get_added_tokens_decoder().items():
            if added.lstrip or added.rstrip or added.single_word or (added.normalized and nfc):
                raise FastBPEUnavailable(f"added token {added.content!r} has strip/word/normalized options")
            specials[added.content] = int(token_id)
        if set(specials.values()) & set(ranks.values()):
            raise FastBPEUnavailable("added tokens share ids with the vocabulary")
        try:
            enc = tiktoken.Encoding(
                "eagle3-fast-bpe", pat_str=grouped_pattern(pattern), mergeable_ranks=ranks, special_tokens=specials
            )
        except Exception as e:  # tiktoken raises ValueError / its own errors on a bad regex or duplicate ids
            raise FastBPEUnavailable(f"tiktoken cannot build it: {type(e).__name__}: {e}") from None
        fast = cls(enc, specials, nfc)
        fast.check_against(tokenizer, probe_texts(specials), probe_ids(ranks, specials))
        return fast

    # ------------------------------------------------------------------------------------------ encode

    def _encode_native(self, text: str) -> list[int]:
        return self._enc.encode(text, allowed_special=self._allowed, disallowed_special=())

    def _encode_segments(self, text: str) -> list[int]:
        """Added tokens cut out here (leftmost-longest), NFC on the text between them, BPE per piece."""
        pieces = self._split.split(text) if self._split is not None else [text]
        out: list[int] = []
        for k, piece in enumerate(pieces):
            if k % 2:
                out.append(self._specials[piece])
            elif piece:
                out += self._enc.encode_ordinary(unicodedata.normalize("NFC", piece) if self._nfc else piece)
        return out

    def encode(self, text: str) -> list[int]:
        return self._encode(text)

    def encode_array(self, text: str) -> np.ndarray:
        """encode as a uint32 array: tiktoken's own buffer when it matches added tokens itself (no Python int
        per id), else encode's list as an array."""
        if self._encode == self._encode_native:
            return self._enc.encode_to_numpy(text, allowed_special=self._allowed, disallowed_special=())
        return np.asarray(self._encode(text), dtype=np.uint32)

    def joins_at(self, end: str) -> bool:
        """True when texts that each end with the added token `end` encode, joined, to exactly their encodings
        one after another: tiktoken cuts added tokens out first (leftmost; they are prefix-free on this path)
        and runs the regex only between them, so a join can only differ where an added token's match crosses
        the `end` a text ends with. That needs an added token of which a proper suffix is a prefix of `end`
        (it would start before `end` and overlap it) or begins with `end` (it would cover it and run on), and
        none has either here (checked once per `end`; `end` itself included: it cannot overlap itself)."""
        ok = self._joins.get(end)
        if ok is None:
            ok = (
                self._encode == self._encode_native
                and end in self._specials
                and not any(
                    s[k:].startswith(end) or end.startswith(s[k:]) for s in self._specials for k in range(1, len(s))
                )
            )
            self._joins[end] = ok
        return ok

    def encode_turns(self, texts: Sequence[str], end: str) -> list[np.ndarray]:
        """encode_array for each text, in ONE tiktoken call for the texts that end with the added token `end`
        and hold it nowhere else (the usual assistant turn): joined, their encodings follow one another, each
        ending with `end`'s id and holding it nowhere else (see joins_at), so they are cut at its ids. One call
        converts the added-token set once (not per text) and runs without the GIL for the whole batch. Other
        texts, or any `end` joins_at refuses, are encoded one by one."""
        out: list[np.ndarray | None] = [None] * len(texts)
        if self.joins_at(end):
            joined = [i for i, t in enumerate(texts) if t.endswith(end) and t.count(end) == 1]
            if joined:
                ids = self._enc.encode_to_numpy(
                    "".join(texts[i] for i in joined), allowed_special=self._allowed, disallowed_special=()
                )
                cuts = np.flatnonzero(ids == self._specials[end]) + 1
                if len(cuts) == len(joined):  # always, by joins_at; else the texts are encoded one by one below
                    for i, a, b in zip(joined, [0, *cuts[:-1].tolist()], cuts.tolist()):
                        out[i] = ids[a:b]
        return [o if o is not None else self.encode_array(t) for o, t in zip(out, texts)]

    def encode_batch(self, texts: Sequence[str], threads: int = 1) -> list[list[int]]:
        """encode for each text; `threads` > 1 splits the batch over a thread pool (tiktoken releases the GIL)."""
        if threads <= 1 or len(texts) < 2:
            return [self._encode(t) for t in texts]
        return list(_pool(threads).map(self._encode, texts, chunksize=max(1, len(texts) // (4 * threads))))

    # ------------------------------------------------------------------------------------------ decode

    def decode(self, ids: Sequence[int]) -> str:
        # errors="replace": one U+FFFD per maximal invalid subpart, as Rust's from_utf8_lossy in `tokenizers`
        return self._enc.decode_bytes(ids).decode("utf-8", errors="replace")

    def decode_batch(self, seqs: Sequence[Sequence[int]]) -> list[str]:
        """decode for each sequence. An id outside the vocabulary raises KeyError (the caller falls back:
        `tokenizers` skips such ids silently)."""
        return [self.decode(s) for s in seqs]

    def check_against(self, tokenizer: Any, texts: list[str], seqs: list[list[int]]) -> None:
        """Raise FastBPEUnavailable at the first text / id sequence where this differs from the tokenizer."""
        for t in texts:
            want = tokenizer.encode(t, add_special_tokens=False)
            got = self.encode(t)
            if got != want:
                raise FastBPEUnavailable(f"probe differs: encode({t[:60]!r}) gives {got[:12]} not {want[:12]}")
        for s in seqs:
            want_text = tokenizer.decode(s, skip_special_tokens=False, clean_up_tokenization_spaces=False)
            got_text = self.decode(s)
            if got_text != want_text:
                raise FastBPEUnavailable(f"probe differs: decode({s[:12]}) gives {got_text[:60]!r}")


_PROBE_TEXTS = [
    "",
    " ",
    "Hello, world! It's a test; I'd've said you'll see WE'RE DONE. DON'T stop, it'S fine.",
    "  leading spaces, trailing spaces   \n\n\n\t\ttabs\r\n\r\n  \u00a0nbsp\u3000ideographic space  ",
    "digits 1 12 123 1234 12345678901 3.14159 1,000,000 -42 0x1F ١٢٣٤ ४२ ½ ²",
    "你好\uff0c世界\uff01这是一个测试。日本語のテキスト、カタカナとひらがな。한국어 텍스트입니다。中文English混合123",
    "emoji 👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️ 🤔🤔🤔 \U0001f9d1\u200d\U0001f4bb",
    "combining: e\u0301 cafe\u0301 caf\u00e9 A\u030a \u212b \ufb01 \u1e9b\u0323 Hangul \u1100\u1161\u11a8",
    "Ελληνικά русский текст עברית العربية हिन्दी ไทย ქართული Ⅻ ǅ",
    "def f(x):\n    return {\"a\": [1, 2.5, None], 'b': x ** 2}  # comment\n\n\n    if x:\n\tpass\n",
    '{"city": "Z\u00fcrich", "days": [1, 2]}\n```json\n{}\n```\n- item\n* item\n1. item',
    "\x00\x01\x7f control \u200b zero width \ufeff bom \ufffd replacement \U0010ffff",
    "...!!!???---___===+++ <<>> [[ ]] (( )) {{ }} ||| &&& @@@ ### $$$ %%% ^^^ ~~~ ```",
]


def probe_texts(specials: dict[str, int]) -> list[str]:
    """The encode probe: fixed texts, each added token between and beside text, near-misses of added tokens."""
    texts = list(_PROBE_TEXTS)
    names = sorted(specials)
    texts.append("".join(f"a{s}b {s} {s}{s}\n{s}" for s in names))
    texts.append("".join(f"{s[:-1]} {s[1:]}<{s}>" for s in names if len(s) > 1))
    texts.append(" ".join(f"{_PROBE_TEXTS[k % len(_PROBE_TEXTS)]}{s}" for k, s in enumerate(names)))
    return texts


def probe_ids(ranks: dict[bytes, int], specials: dict[str, int], seed: int = 17) -> list[list[int]]:
    """The decode probe: single bytes (invalid UTF-8 alone and in runs), cut multi-byte characters,
    every added token alone, and random id sequences over the whole vocabulary."""
    byte_id = {b: ranks[bytes([b])] for b in range(256)}
    seqs = [[byte_id[b]] for b in range(256)]
    for raw in (b"\xe4\xbd", b"\xe4\xbda", b"\xf0\x9f\x91", b"\x80\x80\x80abc", b"\xff\xfe", b"\xc3", b"\xed\xa0\x80"):
        seqs.append([byte_id[b] for b in raw])
    seqs.append([byte_id[b] for b in "é👍中".encode()])  # a non-canonical split: one id per byte
    seqs += [[i] for i in specials.values()]
    rng = random.Random(seed)
    known = set(ranks.values()) | set(specials.values())
    top = max(known) + 1
    for _ in range(64):
        drawn = (rng.randrange(top) for _ in range(rng.randint(1, 64)))
        seqs.append([i for i in drawn if i in known])
    return seqs


_POOLS: dict[tuple[int, int], ThreadPoolExecutor] = {}


def _pool(threads: int) -> ThreadPoolExecutor:
    """One long-lived pool per size (and process: a forked child makes its own). The same threads serve every
    batch, so tiktoken's per-thread regex state stays warm instead of being rebuilt for new threads."""
    key = (os.getpid(), threads)
    if key not in _POOLS:
        _POOLS[key] = ThreadPoolExecutor(threads, thread_name_prefix="fast-bpe")
    return _POOLS[key]


_CACHE: weakref.WeakKeyDictionary[Any, FastBPE | None] = weakref.WeakKeyDictionary()


def fast_bpe_for(tokenizer: Any) -> FastBPE | None:
    """The probed fast backend for this tokenizer (built once per tokenizer object), or None after ONE
    log line naming why the `tokenizers` path is used instead."""
    try:
        return _CACHE[tokenizer]
    except KeyError:
        pass
    except TypeError:  # not weak-referenceable: build every time (never the case for transformers tokenizers)
        pass
    fast: FastBPE | None
    try:
        fast = FastBPE.from_tokenizer(tokenizer)
    except FastBPEUnavailable as e:
        logger.warning(
            "fast BPE not used for %s (%s): %s; encoding/decoding through the tokenizers library instead "
            "(same results, slower)",
            type(tokenizer).__name__,
            getattr(tokenizer, "name_or_path", "?"),
            e,
        )
        fast = None
    try:
        _CACHE[tokenizer] = fast
    except TypeError:
        pass
    return fast
