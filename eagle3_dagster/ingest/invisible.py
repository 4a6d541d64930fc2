"""Invisible characters dropped before every overlap comparison (eval and probe decontamination).

NFKC keeps format characters (Unicode category Cf: U+200B ZERO WIDTH SPACE, U+00AD SOFT HYPHEN, U+2060
WORD JOINER, U+FEFF ZERO WIDTH NO-BREAK SPACE, the bidi controls, ...). None of them is a letter or a
digit, so decontaminate.words would take each one for a word boundary: one U+200B inside a word splits
it in two ("capi<U+200B>tal" -> "capi", "tal"), and a training prompt that differs from an eval or probe
prompt only by such characters would no longer match it. So they are dropped before the comparison
(before NFKC, so that what they separated composes and joins as if they were never there).

Dropped: every Cf character, and the other default-ignorable code points a reader does not see either
(Unicode's Default_Ignorable_Code_Point beyond Cf): U+034F COMBINING GRAPHEME JOINER, the Hangul fillers
U+115F, U+1160, U+3164, U+FFA0, the Khmer inherent vowels U+17B4-17B5, the Mongolian free variation
selectors U+180B-180F, the variation selectors U+FE00-FE0F and U+E0100-E01EF, and the rest of the tag
block U+E0000-E0FFF. `INVISIBLE_RANGES` covers every Cf character of Python's Unicode database
(tests/ingest/test_invisible_overlaps.py checks it against `unicodedata`, so a newer Unicode that adds
one fails there instead of opening a hole).

Only overlap comparisons drop them. Deduplication stays exact (the prompt_id is a hash of the messages as
sent): two prompts that differ by a format character are different token sequences for the model, and
some of these characters change what a reader sees (U+200D ZERO WIDTH JOINER turns three emoji into one
family emoji, U+200C ZERO WIDTH NON-JOINER changes how Persian is written), so both are kept as
training inputs; a near-duplicate costs a little redundancy, while an overlap missed leaks a benchmark.
"""

from __future__ import annotations

# (first, last) code points, inclusive; Cf of Unicode 14-16 plus the default-ignorable extras above
INVISIBLE_RANGES: tuple[tuple[int, int], ...] = (
    (0x00AD, 0x00AD),  # SOFT HYPHEN
    (0x034F, 0x034F),  # COMBINING GRAPHEME JOINER
    (0x0600, 0x0605),  # Arabic number signs (prepended concatenation marks)
    (0x061C, 0x061C),  # ARABIC LETTER MARK
    (0x06DD, 0x06DD),  # ARABIC END OF AYAH
    (0x070F, 0x070F),  # SYRIAC ABBREVIATION MARK
    (0x0890, 0x0891),  # Arabic pound / piastre mark above
    (0x08E2, 0x08E2),  # ARABIC DISPUTED END OF AYAH
    (0x115F, 0x1160),  # Hangul choseong / jungseong fillers
    (0x17B4, 0x17B5),  # Khmer inherent vowels
    (0x180B, 0x180F),  # Mongolian free variation selectors, U+180E MONGOLIAN VOWEL SEPARATOR
    (0x200B, 0x200F),  # ZERO WIDTH SPACE, ZWNJ, ZWJ, LRM, RLM
    (0x202A, 0x202E),  # bidi embeddings and overrides
    (0x2060, 0x206F),  # WORD JOINER, invisible operators, bidi isolates, deprecated format characters
    (0x3164, 0x3164),  # HANGUL FILLER
    (0xFE00, 0xFE0F),  # variation selectors
    (0xFEFF, 0xFEFF),  # ZERO WIDTH NO-BREAK SPACE (byte order mark)
    (0xFFA0, 0xFFA0),  # HALFWIDTH HANGUL FILLER
    (0xFFF9, 0xFFFB),  # interlinear annotation anchors
    (0x110BD, 0x110BD),  # KAITHI NUMBER SIGN
    (0x110CD, 0x110CD),  # KAITHI NUMBER SIGN ABOVE
    (0x13430, 0x1343F),  # Egyptian hieroglyph format controls
    (0x1BCA0, 0x1BCA3),  # shorthand format controls
    (0x1D173, 0x1D17A),  # musical symbol format controls
    (0xE0000, 0xE0FFF),  # tags (LANGUAGE TAG, the emoji tag sequences' letters), variation selectors supplement
)

# str.translate table: each invisible code point -> removed
_DROP: dict[int, None] = {c: None for lo, hi in INVISIBLE_RANGES for c in range(lo, hi + 1)}


def drop_invisible(text: str) -> str:
    """`text` without the characters of INVISIBLE_RANGES (ASCII text has none and comes back as it is)."""
    if text.isascii():
        return text
    return text.translate(_DROP)
