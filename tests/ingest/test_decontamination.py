"""Decontamination against eval sets (ingest/decontaminate.py), through the real ingest path.

The eval source is the real GSM8K test split (../shared/datasets/gsm8k_test, 1319 questions, `role:
eval`). The training sources are a JSONL built here from some of those questions (verbatim, with
changed case / spacing / punctuation, as a later turn of a conversation, embedded in a longer
request, and paraphrased with one number changed), plus real unrelated prompts (NuminaMath problems,
the same domain, and Alpaca instructions) that must all pass.

What a user relies on: no training prompt that is a benchmark question reaches prompts.parquet; each
removed one is a reject row `eval_overlap` naming the eval source and the matched question's
prompt id; the counts reconcile; the eval prompts themselves are never tokenized.

Which paraphrases are caught is predicted here from the rule, not from the code: a question of w
normalized words has w-12 13-grams; changing the word at position k breaks the 13-grams that hold
it; the paraphrase is caught when the intact share is >= 0.5 (the default overlap_threshold).
A short question, or a number in its middle, leaves too few intact 13-grams: that one passes, and
the test says so.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import polars as pl
import pytest

from eagle3_dagster.ingest import SourceSpec, combine_sources, ingest_source, load_source_specs
from eagle3_dagster.ingest.decontaminate import DEFAULT_OVERLAP_THRESHOLD, normalize_text, words
from eagle3_dagster.ingest.pipeline import DECONTAMINATION_FILE, EvalSet
from eagle3_dagster.orchestration.asset_names import stage_assets

VERBATIM = 20  # question index: the training prompt is the question as is
SHOUTED = 21  # upper case, doubled spaces, extra punctuation: equal after normalisation
LATER_TURN = 22  # the second user turn of a conversation with a system prompt
EMBEDDED = 23  # inside a longer request: every 13-gram of the question is in the training prompt
PARAPHRASED = range(12)  # the first number of the question changed (+7)


def _questions(datasets_dir: Path) -> list[str]:
    lines = (datasets_dir / "gsm8k_test" / "test.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line)["question"] for line in lines]


def _paraphrase(q: str) -> tuple[str, int]:
    """q with its first number changed, and the position of the changed word in words(q)."""
    m = re.search(r"\d+", q)
    assert m
    return q[: m.start()] + str(int(m.group()) + 7) + q[m.end() :], len(words(q[: m.start()]))


def _predicted_caught(q: str, k: int) -> bool:
    n = len(words(q)) - 12  # 13-grams of the question (and of the paraphrase: same word count)
    intact = sum(1 for s in range(n) if not s <= k < s + 13)
    return intact / n >= DEFAULT_OVERLAP_THRESHOLD


def _user(text: str) -> dict:
    return {"messages": [{"role": "user", "content": text}, {"role": "assistant", "content": "..."}]}


def _write_sources(tmp_path: Path, datasets_dir: Path) -> tuple[Path, dict[int, tuple[str, str]]]:
    """assets/sources with gsm8k_test (eval), mixed (built here), numina and alpaca (real, unrelated).
    Returns the folder and {line of mixed.jsonl: (kind, question index)} for the contaminated lines."""
    qs = _questions(datasets_dir)
    rows: list[dict] = []
    planted: dict[int, tuple[str, str]] = {}

    def plant(row: dict, kind: str, i: int) -> None:
        rows.append(row)
        planted[len(rows)] = (kind, str(i))

    plant(_user(qs[VERBATIM]), "exact", VERBATIM)
    shouted = "  ".join(qs[SHOUTED].upper().split()).replace("?", "?!!")
    plant(_user(shouted), "exact", SHOUTED)
    plant(
        {
            "messages": [
                {"role": "system", "content": "You are a patient maths tutor."},
                {"role": "user", "content": "Can you help me with my homework?"},
                {"role": "assistant", "content": "Of course. What is the problem?"},
                {"role": "user", "content": qs[LATER_TURN]},
            ]
        },
        "exact",
        LATER_TURN,
    )
    plant(_user(f"Here is a problem from my worksheet. {qs[EMBEDDED]} Explain every step, please."), "ngram", EMBEDDED)
    for i in PARAPHRASED:
        plant(_user(_paraphrase(qs[i])[0]), "paraphrase", i)
    rows += [_user(t) for t in ("What is the capital of Australia?", "Write a haiku about autumn rain.")]
    sources = tmp_path / "assets" / "sources"
    sources.mkdir(parents=True)
    (sources / "mixed.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    (sources / "mixed.yaml").write_text("path: mixed.jsonl\nformat: openai\n")
    (sources / "gsm8k_test.yaml").write_text(
        f"path: {datasets_dir / 'gsm8k_test' / 'test.jsonl'}\nformat: gsm8k\nrole: eval\n"
    )
    numina = datasets_dir / "numina_cot_sharegpt" / "numina_cot_sharegpt_data_1k.jsonl"
    (sources / "numina.yaml").write_text(f"path: {numina}\nformat: sharegpt\nlimit: 200\n")
    alpaca = datasets_dir / "alpaca_gpt4_en_demo" / "alpaca_en_demo.json"
    (sources / "alpaca.yaml").write_text(f"path: {alpaca}\nformat: alpaca\nlimit: 100\n")
    return sources, planted


def _ingest_all(sources: Path, data: Path):
    specs = load_source_specs(sources)
    for spec in specs:
        ingest_source(spec, data / "sources" / spec.name, n_shards=4)
    train = [data / "sources" / s.name for s in specs if s.role == "train"]
    evals = [EvalSet(s.name, data / "sources" / s.name) for s in specs if s.role == "eval"]
    return combine_sources(train, data / "prompts", n_shards=4, eval_sets=evals)


def test_eval_overlap_quarantines_gsm8k_questions_and_passes_unrelated(tmp_path, datasets_dir) -> None:
    sources, planted = _write_sources(tmp_path, datasets_dir)
    data = tmp_path / "data"
    counts = _ingest_all(sources, data)
    qs = _questions(datasets_dir)

    prompts = pl.read_parquet(data / "prompts" / "prompts.parquet")
    rejects = pl.read_parquet(data / "prompts" / "prompt_rejects.parquet").filter(pl.col("reason") == "eval_overlap")
    evals = pl.read_parquet(data / "sources" / "gsm8k_test" / "accepted.parquet")
    assert evals.height == 1319  # every GSM8K question is a reference prompt
    eval_id_of_question = {r["source_row"] - 1: r["prompt_id"] for r in evals.iter_rows(named=True)}

    # the eval source never reaches prompts.parquet: neither by name nor by prompt
    assert "gsm8k_test" not in set(prompts["source"])
    assert not set(prompts["prompt_id"]) & set(evals["prompt_id"])

    predicted = {}
    for line, (kind, i) in planted.items():
        if kind == "paraphrase":
            q = qs[int(i)]
            predicted[line] = "ngram" if _predicted_caught(q, _paraphrase(q)[1]) else None
        else:
            predicted[line] = kind
    # honest about the rule's reach: some paraphrases are caught, some are not
    assert {v for line, v in predicted.items() if planted[line][0] == "paraphrase"} == {"ngram", None}

    removed = {r["source_row"]: r for r in rejects.iter_rows(named=True)}
    assert set(removed) == {line for line, kind in predicted.items() if kind}
    assert set(rejects["source"]) == {"mixed"}  # no NuminaMath or Alpaca prompt matched a GSM8K question
    for line, row in removed.items():
        kind, i = planted[line]
        # the detail names the eval source and the matched question's prompt id (and row)
        assert f"eval source 'gsm8k_test' prompt {eval_id_of_question[int(i)]} (row {int(i) + 1})" in row["detail"]
        assert row["detail"].startswith("exact match" if predicted[line] == "exact" else "13-gram overlap")
    mixed = prompts.filter(pl.col("source") == "mixed")
    missed = {line for line, kind in predicted.items() if kind is None}
    assert set(mixed["source_row"]) == missed | {len(planted) + 1, len(planted) + 2}  # + the two unrelated
    assert prompts.filter(pl.col("source") == "numina").height == 200
    assert prompts.filter(pl.col("source") == "alpaca").height > 90  # (Alpaca has duplicates of its own)

    # counts reconcile, with eval_overlap inside rejects
    assert counts.eval_overlap == len(removed) == counts.rejects_by_reason["eval_overlap"]
    assert counts.input_accepted == counts.prompts + counts.cross_source_duplicates + counts.eval_overlap
    assert counts.read == (
        counts.prompts + counts.cross_source_duplicates + counts.rejects + counts.source_duplicates + counts.sampled_out
    )
    assert counts.eval_overlap_by_source == {"mixed": len(removed)}
    assert (counts.eval_sources, counts.eval_prompts, counts.prompts) == (1, 1319, prompts.height)

    summary = json.loads((data / "prompts" / DECONTAMINATION_FILE).read_text())
    (g,) = summary["eval_sources"]
    n_exact = sum(1 for k in predicted.values() if k == "exact")
    assert (g["source"], g["eval_prompts"], g["exact"], g["ngram"]) == (
        "gsm8k_test",
        1319,
        n_exact,
        len(removed) - n_exact,
    )
    assert summary["training_prompts_checked"] == counts.input_accepted - counts.cross_source_duplicates


def test_normalisation_rule() -> None:
    assert normalize_text("Janet\u2019s ducks  lay 16 eggs per day!\n") == "janet s ducks lay 16 eggs per day"
    assert normalize_text("A ROBE takes 2 bolts...") == normalize_text("a robe takes 2 bolts")
    # NFKC folds full-width letters; '-', '_' and ':' are word boundaries
    assert normalize_text("well-known_fact: \uff21\uff22\uff23") == "well known fact abc"


def test_ascii_fast_path_gives_the_same_words(datasets_dir) -> None:
    import unicodedata

    from eagle3_dagster.ingest.decontaminate import _WORD

    texts = _questions(datasets_dir) + [
        r["instruction"] + r["input"]
        for r in json.loads((datasets_dir / "alpaca_gpt4_en_demo" / "alpaca_en_demo.json").read_text())
    ]
    assert sum(t.isascii() for t in texts) > 2000
    for t in texts:
        assert words(t) == _WORD.findall(unicodedata.normalize("NFKC", t).lower())


def test_overlap_threshold_decides_a_paraphrase(tmp_path, datasets_dir) -> None:
    """The same paraphrase (Janet's ducks, 16 -> 23 eggs: 36 of 41 13-grams intact = 0.88) passes
    when the eval source asks for more overlap than it has, and is removed at the default."""
    q = _questions(datasets_dir)[0]
    (tmp_path / "train.jsonl").write_text(json.dumps(_user(_paraphrase(q)[0])) + "\n")
    train = SourceSpec(name="train", path=str(tmp_path / "train.jsonl"))
    ingest_source(train, tmp_path / "train", n_shards=1)
    ev = SourceSpec(name="gsm8k", path=str(datasets_dir / "gsm8k_test" / "test.jsonl"), format="gsm8k", role="eval")
    ingest_source(ev, tmp_path / "gsm8k", n_shards=1)
    strict = combine_sources(
        [tmp_path / "train"], tmp_path / "a", n_shards=1, eval_sets=[EvalSet("gsm8k", tmp_path / "gsm8k", 0.9)]
    )
    default = combine_sources(
        [tmp_path / "train"], tmp_path / "b", n_shards=1, eval_sets=[EvalSet("gsm8k", tmp_path / "gsm8k")]
    )
    assert (strict.prompts, strict.eval_overlap) == (1, 0)
    assert (default.prompts, default.eval_overlap) == (0, 1)
    (row,) = pl.read_parquet(tmp_path / "b" / "prompt_rejects.parquet").to_dicts()
    assert "36 of min(training, eval) 41 13-grams shared = 0.88" in row["detail"]


def test_all_turns_conversation_is_checked_on_its_later_user_turns(tmp_path, datasets_dir) -> None:
    """regenerate: all_turns sends every user turn of the conversation: a benchmark question in turn 2
    removes the conversation although its first prompt (turn 1) is harmless."""
    q = _questions(datasets_dir)[5]
    conv = {
        "messages": [
            {"role": "user", "content": "Hi, can you help with maths?"},
            {"role": "assistant", "content": "Yes."},
            {"role": "user", "content": q},
            {"role": "assistant", "content": "..."},
        ]
    }
    (tmp_path / "t.jsonl").write_text(json.dumps(conv) + "\n" + json.dumps(_user("Tell me a joke.")) + "\n")
    train = SourceSpec(name="t", path=str(tmp_path / "t.jsonl"), regenerate="all_turns")
    ingest_source(train, tmp_path / "t", n_shards=1)
    ev = SourceSpec(name="gsm8k", path=str(datasets_dir / "gsm8k_test" / "test.jsonl"), format="gsm8k", role="eval")
    ingest_source(ev, tmp_path / "gsm8k", n_shards=1)
    counts = combine_sources(
        [tmp_path / "t"], tmp_path / "out", n_shards=1, eval_sets=[EvalSet("gsm8k", tmp_path / "gsm8k")]
    )
    assert (counts.prompts, counts.eval_overlap) == (1, 1)
    (row,) = pl.read_parquet(tmp_path / "out" / "prompt_rejects.parquet").to_dicts()
    assert (row["source_row"], row["reason"]) == (1, "eval_overlap")
    assert row["detail"].startswith("exact match after normalisation with eval source 'gsm8k' prompt ")
    assert "(row 6)" in row["detail"]


def test_an_eval_source_passed_as_training_data_is_refused(tmp_path, datasets_dir) -> None:
    """A caller that hands every source folder to combine_sources as training data is stopped, naming it."""
    from eagle3_dagster.ingest import IngestFileError

    ev = SourceSpec(name="gsm8k", path=str(datasets_dir / "gsm8k_test" / "test.jsonl"), format="gsm8k", role="eval")
    ingest_source(ev, tmp_path / "gsm8k", n_shards=1)
    with pytest.raises(IngestFileError, match="source 'gsm8k' was ingested as role: eval"):
        combine_sources([tmp_path / "gsm8k"], tmp_path / "out", n_shards=1)
    assert not (tmp_path / "out" / "prompts.parquet").exists()


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ("role: test\n", "field 'role': 'test' is not one of train, eval"),
        ("overlap_threshold: 0.5\n", "field 'overlap_threshold' only applies with 'role: eval'"),
        ("role: eval\noverlap_threshold: 0\n", "field 'overlap_threshold': must be a number in (0, 1], got 0"),
    ],
)
def test_bad_role_fields_are_named(tmp_path, body: str, problem: str) -> None:
    from eagle3_dagster.ingest import SourceSpecError

    (tmp_path / "s.yaml").write_text("path: x.jsonl\n" + body)
    with pytest.raises(SourceSpecError, match=re.escape(problem)):
        load_source_specs(tmp_path)


def test_report_has_a_decontamination_section(tmp_path, datasets_dir) -> None:
    from eagle3_dagster.report.model import collect
    from eagle3_dagster.report.render import render

    sources, planted = _write_sources(tmp_path, datasets_dir)
    counts = _ingest_all(sources, tmp_path / "data")
    page = render(
        collect(tmp_path / "data", tmp_path / "work", n_shards=4), tmp_path / "work" / "reports" / "index.html"
    )
    section = page.split("<h2>Decontamination</h2>", 1)[1].split("<h2>", 1)[0]
    exact = sum(1 for kind, _ in planted.values() if kind == "exact")
    checked = counts.input_accepted - counts.cross_source_duplicates
    assert (
        '<tr><td><code>gsm8k_test</code></td><td class="num">1319</td><td class="num">0.5</td>'
        f'<td class="num">{checked}</td><td class="num">{exact}</td><td class="num">{counts.eval_overlap - exact}</td>'
        f'<td class="num">{counts.eval_overlap}</td></tr>'
    ) in section
    assert f"Removed by training source: mixed {counts.eval_overlap}." in section
    assert '<code>gsm8k_test</code> <span class="small">eval set</span>' in page  # in the sources table

    # no eval source: the section says the prompts were not checked
    (sources / "gsm8k_test.yaml").unlink()
    _ingest_all(sources, tmp_path / "data2")
    page = render(
        collect(tmp_path / "data2", tmp_path / "work", n_shards=4), tmp_path / "work" / "reports" / "index.html"
    )
    assert "No eval source declared" in page.split("<h2>Decontamination</h2>", 1)[1]


@pytest.mark.integration
def test_dagster_ingest_keeps_the_eval_source_out_of_tokenized_prompts(
    tmp_path, monkeypatch, datasets_dir, kimi_profile
) -> None:
    """One Dagster run of the ingest group, then tokenized_prompts for the shard the eval prompts would
    fill most: training prompts are tokenized there, no eval prompt is (so none can be generated)."""
    import dagster as dg

    from eagle3_dagster.config import PROJECT_ROOT, settings
    from eagle3_dagster.defs.ingest import build_ingest_assets
    from eagle3_dagster.defs.tokenize import tokenized_prompts
    from eagle3_dagster.ingest import shard_of
    from eagle3_dagster.orchestration.resources import pipeline_resource

    sources, _ = _write_sources(tmp_path, datasets_dir)
    (sources.parent / "models").symlink_to(PROJECT_ROOT / "assets" / "models")
    monkeypatch.setenv("EAGLE3_ASSETS_DIR", str(sources.parent))
    data = tmp_path / "data"
    s = settings()
    assets = [*build_ingest_assets(s), tokenized_prompts(s)]
    res = {
        "pipeline": pipeline_resource(
            settings(), data_dir=str(data), work_dir=str(tmp_path / "work"), tokenizer=kimi_profile.tokenizer
        )
    }
    with dg.instance_for_test() as instance:
        r = dg.materialize(assets, selection=stage_assets("ingest"), instance=instance, resources=res)
        assert r.success
        meta = instance.get_latest_materialization_event(dg.AssetKey("prompts")).asset_materialization.metadata
        assert meta["eval_prompts"].value == 1319 and meta["eval_overlap"].value > 0
        eval_ids = set(pl.read_parquet(data / "sources" / "gsm8k_test" / "accepted.parquet")["prompt_id"])
        by_shard = pl.DataFrame({"shard": [shard_of(p, s.shards.n_shards) for p in eval_ids]}).group_by("shard").len()
        shard = by_shard.sort(["len", "shard"], descending=[True, False])["shard"][0]
        key = f"{shard:04d}"
        t = dg.materialize(
            assets,
            selection=dg.AssetSelection.assets("tokenized_prompts"),
            partition_key=key,
            instance=instance,
            resources=res,
        )
        assert t.success
    tok = pl.read_parquet(data / "tokenized_prompts" / f"shard={key}" / "part-0000.parquet")
    in_shard = pl.read_parquet(data / "prompts" / "prompts.parquet").filter(pl.col("shard") == shard)
    assert tok.height > 0 and set(tok["prompt_id"]) <= set(in_shard["prompt_id"])
    assert "gsm8k_test" not in set(tok["source"]) and not set(tok["prompt_id"]) & eval_ids
