"""The tiktoken twin of a byte-level BPE tokenizer (tokenize/fast_bpe.py) gives exactly the tokenizer's own
encode ids and decode text, or it is not used (one log line, the `tokenizers` path instead)."""

from __future__ import annotations

import logging
import random
import sys

import pytest
from dataset_texts import dataset_strings

from eagle3_dagster.tokenize.fast_bpe import FastBPE, byte_to_unicode, fast_bpe_for, grouped_pattern
from eagle3_dagster.tokenize.parse import batch_decode, batch_encode

LOGGER = "eagle3_dagster.tokenize.fast_bpe"


@pytest.fixture(params=["kimi", "qwen"])
def tok(request, kimi_tok, qwen_renderer):
    return kimi_tok if request.param == "kimi" else qwen_renderer.tokenizer


def _reference_encode(tok, texts):
    return [tok.encode(t, add_special_tokens=False) for t in texts]


def _reference_decode(tok, seqs):
    return [tok.decode(s, skip_special_tokens=False, clean_up_tokenization_spaces=False) for s in seqs]


def test_encode_and_decode_equal_the_tokenizer_on_every_shared_dataset(tok, datasets_dir):
    from eagle3_dagster.sim.noncanonical import NonCanonicalSplitter

    fast = fast_bpe_for(tok)
    assert fast is not None
    texts = dataset_strings(datasets_dir)
    rng = random.Random(3)
    added = sorted(tok.added_tokens_decoder.values(), key=lambda t: t.content)
    # added tokens (special or not) glued to real text on both sides, and near-misses of them
    texts += [
        f"{a[-200:]}{rng.choice(added).content}{b[:200]}{rng.choice(added).content[:-1]}"
        for a, b in zip(texts, texts[7:] + texts[:7])
    ]
    want = _reference_encode(tok, texts)
    assert fast.encode_batch(texts, threads=2) == want
    assert fast.encode_batch(texts, threads=1) == want
    # decode: canonical ids, the simulator's non-canonical splits, and id runs that are not valid UTF-8
    splitter = NonCanonicalSplitter(tok, 1.0, max_splits=3)
    seqs = want + [splitter.apply(ids, rng) for ids in want]
    byte_ids = [tok.convert_tokens_to_ids(byte_to_unicode()[b]) for b in range(256)]
    seqs += [[rng.choice(byte_ids[0x80:]) for _ in range(rng.randint(1, 9))] + ids[:20] for ids in want[:100]]
    assert sum(s != w for s, w in zip(seqs[len(want) :], want)) > 100  # the splitter did split
    assert fast.decode_batch(seqs) == _reference_decode(tok, seqs)
    assert any("\ufffd" in t for t in _reference_decode(tok, seqs[-100:]))


def test_the_twin_runs_the_grouped_pattern_and_splits_whitespace_runs_as_the_tokenizer(tok):
    """The twin's regex is the grouped one (so the dataset test above covers it), and whitespace runs of
    every kind before every character class (where the lookahead alternative decides) encode the same."""
    fast = fast_bpe_for(tok)
    assert fast is not None
    pattern = fast._enc._pat_str
    assert pattern.startswith("(?:") and pattern.endswith(r")|\s+(?!\S)|\s+")
    rng = random.Random(11)
    pieces = [" ", "  ", "\t", "\n", "\r\n", "\u3000", "\xa0", "\u2029", "a", "Ab", "中文", "7", "12345", "'s", "'LL",
              "!", "?!", "é", "e\u0301", "👍", "x y", "<|", "|>"]  # fmt: skip
    texts = ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 30))) for _ in range(3000)]
    assert fast.encode_batch(texts) == _reference_encode(tok, texts)


def test_grouped_pattern_groups_only_the_shape_it_is_the_same_for():
    assert grouped_pattern(r"a|b+|\s+(?!\S)|\s+") == r"(?:a|b+)|\s+(?!\S)|\s+"
    assert grouped_pattern(r"(?i:'s|'t)|x\\|\s+(?!\S)|\s+") == r"(?:(?i:'s|'t)|x\\)|\s+(?!\S)|\s+"  # escaped backslash
    for unchanged in (
        r"a|\s+",  # no lookahead tail
        r"a(?=b)|\s+(?!\S)|\s+",  # another lookaround before it
        r"a(?<!b)|\s+(?!\S)|\s+",
        r"(a)\1|\s+(?!\S)|\s+",  # a backreference
        r"a\|\s+(?!\S)|\s+",  # the tail's `|` is escaped: not an alternation
        r"|\s+(?!\S)|\s+",  # nothing before it
    ):
        assert grouped_pattern(unchanged) == unchanged


def test_batch_paths_equal_the_reference_also_for_ids_outside_the_vocabulary(tok):
    """An id the vocabulary lacks: the fast decode refuses it, batch_decode falls back to the tokenizers
    path (which skips it, as the per-sample reference does)."""
    text = "Zürich 你好 👍🏽 it's 123</think>"
    ids = tok.encode(text, add_special_tokens=False)
    seqs = [ids, ids[:3] + [len(tok) + 5] + ids[3:], []]
    assert batch_decode(tok, seqs) == _reference_decode(tok, seqs)
    assert batch_encode(tok, [text, "", " \n "]) == _reference_encode(tok, [text, "", " \n "])


# --- when it is not used: refused with one log line, the reference result all the same ------------


def _tiny_bpe(merges: list[tuple[str, str]], *, model: str = "bpe"):
    """A small byte-level BPE (or WordLevel) tokenizer: the 256 bytes, `ce` and `es`, one added token."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = byte_to_unicode()
    vocab = {alphabet[b]: b for b in range(256)} | {"ce": 256, "es": 257}
    if model == "bpe":
        backend = Tokenizer(models.BPE(vocab, merges))
    else:
        backend = Tokenizer(models.WordLevel(vocab, unk_token=alphabet[0]))
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r" ?\p{L}+| ?[^\s\p{L}]+|\s+"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(["<|end|>"])
    return PreTrainedTokenizerFast(tokenizer_object=backend)


TEXTS = ["spaces races cess", "ces<|end|>es", "naïve 你好"]


def test_a_consistent_small_bpe_is_served_fast():
    tok = _tiny_bpe([("c", "e"), ("e", "s")])  # merge order = id order: what tiktoken's ranks mean
    assert isinstance(fast_bpe_for(tok), FastBPE)
    assert batch_encode(tok, TEXTS) == _reference_encode(tok, TEXTS)


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda: _tiny_bpe([("e", "s"), ("c", "e")]), "probe differs: encode("),  # merge order != id order
        (lambda: _tiny_bpe([], model="wordlevel"), "the model is WordLevel, not BPE"),
    ],
)
def test_a_tokenizer_it_cannot_serve_exactly_falls_back_with_one_log_line(make, reason, caplog):
    tok = make()
    caplog.set_level(logging.WARNING, logger=LOGGER)
    seqs = _reference_encode(tok, TEXTS)
    assert batch_encode(tok, TEXTS) == seqs  # the tokenizers path: the reference result
    assert batch_decode(tok, seqs) == _reference_decode(tok, seqs)
    records = [r for r in caplog.records if r.name == LOGGER]
    assert len(records) == 1, [r.getMessage() for r in records]  # once per tokenizer, not per call
    assert reason in records[0].getMessage() and "fast BPE not used" in records[0].getMessage()


def test_without_tiktoken_the_tokenizers_path_is_used(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "tiktoken", None)  # `import tiktoken` raises ImportError
    tok = _tiny_bpe([("c", "e"), ("e", "s")])
    caplog.set_level(logging.WARNING, logger=LOGGER)
    assert fast_bpe_for(tok) is None
    assert batch_encode(tok, TEXTS) == _reference_encode(tok, TEXTS)
    assert "tiktoken package is not installed" in caplog.text


def test_turns_are_encoded_in_one_call_exactly_as_one_by_one(kimi_tok, datasets_dir, monkeypatch):
    """encode_turns joins the turns that end with the end-of-turn token (and hold it nowhere else) into ONE
    tiktoken call and cuts the result at that token's ids: the same ids as encoding each turn alone, also
    beside turns that hold the token twice, not at their end, or right after a near-miss of it."""
    fast = fast_bpe_for(kimi_tok)
    assert fast is not None
    end = "<|im_end|>"
    assert fast.joins_at(end)
    texts = dataset_strings(datasets_dir)[:300]
    turns = [f"{a[-300:]}</think>{b[:200]}{end}" for a, b in zip(texts, texts[1:] + texts[:1])]
    turns[5:5] = [f"a{end}b{end}", "no end", end, f" {end}", f"x<|im_{end}", f"{end[:-1]}{end}", "", f"  \n{end}"]
    turns += [f"{t}  {end}" for t in texts[:20]] + [f"{t}\n\n{end}" for t in texts[20:40]]
    calls: list[int] = []
    native = fast._enc.encode_to_numpy
    monkeypatch.setattr(fast._enc, "encode_to_numpy", lambda *a, **k: calls.append(1) or native(*a, **k))
    got = fast.encode_turns(turns, end)
    assert [g.tolist() for g in got] == _reference_encode(kimi_tok, turns)
    one_by_one = sum(not (t.endswith(end) and t.count(end) == 1) for t in turns)
    assert one_by_one == 3 and len(calls) == 1 + one_by_one  # the other 345 turns in one call


def test_an_end_token_another_added_token_can_overlap_is_never_joined():
    """joins_at refuses an end token that another added token could overlap from the left (a suffix of it
    begins the end token): that token, matched first, would hide the end; such turns are encoded one by one."""
    import tiktoken

    ranks = {bytes([b]): b for b in range(256)}
    specials = {"<|end|>": 256, "x<|e": 257, "<|go|>": 258}
    fast = FastBPE(
        tiktoken.Encoding("t", pat_str=r"\S+|\s+", mergeable_ranks=ranks, special_tokens=specials), specials, False
    )
    assert not fast.joins_at("<|end|>")
    assert fast.joins_at("<|go|>")
    texts = ["ax<|end|>", "b<|end|>", "c<|go|>"]
    assert [a.tolist() for a in fast.encode_turns(texts, "<|end|>")] == [fast.encode(t) for t in texts]
    assert fast.encode("ax<|end|>")[:2] == [ord("a"), 257]  # "x<|e" hides the end token
