"""BFCL's own multi-turn files with their function docs (source option `function_docs`, issue 28).

Real files in tests/data/bfcl (gorilla commit 6ea5797, see its README.md): the whole
BFCL_v4_multi_turn_base.json (gzip), an excerpt of BFCL_v4_multi_turn_miss_func.json and the
multi_turn_func_doc/ files of the eight classes they use. What a user relies on: every record is
accepted with the docs of its involved_classes (BFCL's class-to-file mapping, in BFCL's order),
minus `excluded_function`; a `missed_function` appears only from the turn BFCL adds it; the Kimi
prompt declares exactly those tools; a missing or wrong doc is a reject or an error naming it.
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow.parquet as pq
import pytest

from eagle3_dagster.app.cli import main as eagle3
from eagle3_dagster.generate.multiturn import conversations_from_prompts
from eagle3_dagster.ingest import (
    IngestFileError,
    SourceSpec,
    SourceSpecError,
    canonical_json,
    ingest_source,
    load_source_spec,
)
from eagle3_dagster.ingest.bfcl import ADDITIONAL_FUNCTION_PROMPT, MULTI_TURN_FUNC_DOC_FILE_MAPPING
from eagle3_dagster.ingest.fingerprint import source_files_fingerprint
from eagle3_dagster.ingest.normalize import normalize_tools
from eagle3_dagster.profiles import ModelProfile
from eagle3_dagster.tokenize import PromptRenderer
from eagle3_dagster.tokenize.kimi_tools import compute_tools_ts_str
from eagle3_dagster.tokenize.pipeline import tokenize_prompts

BFCL = Path(__file__).resolve().parents[1] / "data" / "bfcl"
BASE = BFCL / "BFCL_v4_multi_turn_base.json.gz"
MISS_FUNC = BFCL / "BFCL_v4_multi_turn_miss_func.excerpt.json"
DOCS = BFCL / "multi_turn_func_doc"


def _records(path: Path) -> list[dict[str, Any]]:
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    return [json.loads(line) for line in raw.decode().splitlines() if line.strip()]


def _class_docs(name: str) -> list[dict[str, Any]]:
    text = (DOCS / MULTI_TURN_FUNC_DOC_FILE_MAPPING[name]).read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _expected_docs(rec: dict[str, Any]) -> list[dict[str, Any]]:
    """BFCL's rule, written out: the classes' docs in involved_classes order, minus the excluded and missed."""
    held = {n for names in rec.get("missed_function", {}).values() for n in names}
    out = [d for c in rec["involved_classes"] for d in _class_docs(c)]
    return [d for d in out if d["name"] not in set(rec.get("excluded_function", [])) | held]


def _spec(path: Path, **kw: Any) -> SourceSpec:
    return SourceSpec(name="bfcl_mt", path=str(path), format="bfcl", function_docs=str(DOCS), **kw)


def _ingest(spec: SourceSpec, out: Path) -> tuple[Any, list[dict[str, Any]]]:
    counts = ingest_source(spec, out, n_shards=1)
    return counts, pq.read_table(out / "accepted.parquet").to_pylist()


@pytest.mark.parametrize("regenerate", ["final_turn", "all_turns"])
def test_all_200_base_records_are_accepted_with_their_class_docs(tmp_path: Path, regenerate: str) -> None:
    records = _records(BASE)
    assert len(records) == 200
    counts, rows = _ingest(_spec(BASE, regenerate=regenerate), tmp_path)
    assert counts.reconciles() and (counts.read, counts.accepted, counts.rejected, counts.duplicates) == (
        200,
        200,
        0,
        0,
    )
    excluded_seen = 0
    for row in rows:
        rec = records[row["source_row"] - 1]
        tools = json.loads(row["tools"])
        assert tools == normalize_tools(_expected_docs(rec))
        names = [t["function"]["name"] for t in tools]
        for name in rec.get("excluded_function", []):
            excluded_seen += 1
            assert name not in names
            assert name in [d["name"] for c in rec["involved_classes"] for d in _class_docs(c)]
        questions = [turn[0]["content"] for turn in rec["question"]]
        if regenerate == "final_turn":
            assert json.loads(row["messages"]) == [{"role": "user", "content": questions[0]}]
            assert row["regenerate"] is None
            continue
        # all_turns: every question followed by a turn the model answers, one planned turn per question
        conversation = json.loads(row["conversation"])
        assert [m["content"] for m in conversation if m["role"] == "user"] == questions
        assert [m["role"] for m in conversation] == ["user", "assistant"] * len(questions)
        options = json.loads(row["regenerate"])
        assert options["turns"] == [2 * i + 1 for i in range(len(questions))] and "tools_from" not in options
    assert excluded_seen == 18  # BFCL holds out cp, mv or rm in 18 base records


def test_all_200_base_prompts_render_with_their_tools(
    tmp_path: Path, kimi_profile: ModelProfile, kimi_tokenizer: Any
) -> None:
    """The tokenize stage on the 200 prompts: each Kimi prompt opens with the tool_declare turn holding
    exactly its tools as Kimi's TypeScript text (rendered natively), then the first question."""
    counts, _ = _ingest(_spec(BASE, regenerate="all_turns"), tmp_path)
    prompts = pl.read_parquet(tmp_path / "accepted.parquet")
    renderer = PromptRenderer(kimi_profile, kimi_tokenizer)
    tokenized, rejects = tokenize_prompts(prompts, renderer, max_new_tokens=2048)
    assert rejects.height == 0, rejects.to_dicts()[:3]
    assert tokenized.height == counts.accepted == 200
    assert renderer.native_rows == 200 and renderer.jinja_rows == 0
    by_id = {r["prompt_id"]: r for r in prompts.iter_rows(named=True)}
    for r in tokenized.iter_rows(named=True):
        row = by_id[r["prompt_id"]]
        _, ts, fallback = compute_tools_ts_str(json.loads(row["tools"]))
        assert ts is not None and fallback is None
        text = kimi_tokenizer.decode(r["input_ids"], skip_special_tokens=False)
        assert text.startswith(f"<|im_system|>tool_declare<|im_middle|>{ts}<|im_end|>")
        first = json.loads(row["messages"])[0]["content"]
        assert text.endswith(f"{first}<|im_end|><|im_assistant|>assistant<|im_middle|><think>")
        for tool in json.loads(row["tools"]):
            assert f"type {tool['function']['name']} = (_:" in text


def test_a_missed_function_appears_from_the_turn_bfcl_adds_it(tmp_path: Path) -> None:
    records = _records(MISS_FUNC)
    counts, rows = _ingest(_spec(MISS_FUNC, regenerate="all_turns"), tmp_path)
    assert counts.reconciles() and (counts.accepted, counts.rejected) == (len(records), 0) == (4, 0)
    prompts = pl.read_parquet(tmp_path / "accepted.parquet")
    conversations = {c.conversation_id: c for c in conversations_from_prompts(prompts, _first_ids(prompts))}
    for row in rows:
        rec = records[row["source_row"] - 1]
        ((turn, missed),) = rec["missed_function"].items()
        assert rec["question"][int(turn)] == []  # BFCL's layout: the turn that adds functions asks nothing
        before = json.loads(row["tools"])
        assert before == normalize_tools(_expected_docs(rec))
        assert not {t["function"]["name"] for t in before} & set(missed)
        conversation = json.loads(row["conversation"])
        users = [i for i, m in enumerate(conversation) if m["role"] == "user"]
        # BFCL's user message at that turn, the held-back docs appended to the list from there on
        assert conversation[users[int(turn)]] == {"role": "user", "content": ADDITIONAL_FUNCTION_PROMPT}
        all_docs = [d for c in rec["involved_classes"] for d in _class_docs(c)]
        added = normalize_tools([next(d for d in all_docs if d["name"] == n) for n in missed])
        assert json.loads(row["regenerate"])["tools_from"] == [[users[int(turn)], before + added]]
        conv = conversations[row["prompt_id"]]
        for k, pos in enumerate(conv.turns):
            tools, tools_json = conv.tools_at(pos)
            names = {t["function"]["name"] for t in tools or []}
            assert (set(missed) <= names) == bool(set(missed) & names) == (k >= int(turn))
            assert tools_json == canonical_json(tools)
        for name in rec.get("excluded_function", []):
            assert all(name not in {t["function"]["name"] for t in conv.tools_at(p)[0] or []} for p in conv.turns)

    # final_turn: the first question with the tools it has at that turn (the missed ones held back)
    _, rows = _ingest(_spec(MISS_FUNC), tmp_path / "final")
    for row in rows:
        rec = records[row["source_row"] - 1]
        assert json.loads(row["tools"]) == normalize_tools(_expected_docs(rec))


def _first_ids(prompts: pl.DataFrame) -> pl.DataFrame:
    """Stand-in turn-1 ids (conversations_from_prompts only needs the rows to be tokenized)."""
    return pl.DataFrame({"prompt_id": prompts["prompt_id"], "input_ids": [[1, 2, 3]] * prompts.height})


def test_missing_class_docs_and_bad_names_are_rejected_naming_them(tmp_path: Path) -> None:
    records = _records(MISS_FUNC)
    docs = tmp_path / "docs"
    shutil.copytree(DOCS, docs)
    (docs / "posting_api.json").unlink()  # TwitterAPI's docs are missing from this checkout
    unknown = {**records[1], "id": "unknown_class", "involved_classes": ["TicketAPI", "TwitterAPIv2"]}
    bad_excluded = {**records[1], "id": "bad_excluded", "excluded_function": ["format_disk"]}
    bad_missed = {**records[3], "id": "bad_missed", "missed_function": {"4": ["send_fax"]}}
    both = {**records[3], "id": "both", "function": _class_docs("MathAPI")}
    lines = [*records, unknown, bad_excluded, bad_missed, both, records[1]]
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    spec = SourceSpec(name="mixed", path=str(path), format="bfcl", function_docs=str(docs), regenerate="all_turns")
    counts = ingest_source(spec, tmp_path / "out", n_shards=1)
    assert counts.reconciles()
    twitter = [r for r in records if "TwitterAPI" in r["involved_classes"]]
    assert len(twitter) == 2
    assert (counts.read, counts.accepted, counts.rejected, counts.duplicates) == (9, 2, 6, 1)
    assert counts.rejects_by_reason == {"missing_field": 2, "bad_field": 4}
    details = {r["source_row"]: r["detail"] for r in pq.read_table(tmp_path / "out" / "rejects.parquet").to_pylist()}
    for rec in twitter:
        row = records.index(rec) + 1
        assert rec["id"] in details[row] and str(docs / "posting_api.json") in details[row]
        assert f"involved_classes[{rec['involved_classes'].index('TwitterAPI')}] TwitterAPI" in details[row]
    assert "unknown_class" in details[5] and "involved_classes[1] 'TwitterAPIv2' is not a BFCL class" in details[5]
    assert "bad_excluded" in details[6] and "excluded_function format_disk" in details[6]
    assert "bad_missed" in details[7] and "missed_function[4] send_fax" in details[7]
    assert "both" in details[8] and "'function' and 'involved_classes'" in details[8]

    # the same rules one at a time: a bad missed turn, names that are not a list, a question turn that is no list
    for bad, message in [
        ({"missed_function": {"0": ["cp"]}}, "missed_function turn '0' is not a later turn"),
        ({"missed_function": {"2": ["cp"]}}, "question[2] holds messages"),
        ({"missed_function": {"4": "cp"}}, "missed_function[4] must be a list of function names"),
        ({"excluded_function": "rm"}, "field 'excluded_function' must be a list of function names"),
        ({"question": [*records[1]["question"][:5], {"role": "user", "content": "hi"}]}, "must be a list"),
    ]:
        one = tmp_path / "one.jsonl"
        one.write_text(json.dumps({**records[1], **bad}) + "\n")
        c = ingest_source(SourceSpec(name="one", path=str(one), function_docs=str(DOCS)), tmp_path / "one", n_shards=1)
        assert c.rejects_by_reason == {"bad_field": 1}, bad
        (detail,) = pq.read_table(tmp_path / "one" / "rejects.parquet").column("detail").to_pylist()
        assert records[1]["id"] in detail and message in detail, (bad, detail)


def test_a_bad_function_docs_path_is_an_error_naming_source_field_and_path(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(IngestFileError, match=r"source 'bfcl_mt': field 'function_docs': folder not found: .*nowhere"):
        ingest_source(
            SourceSpec(name="bfcl_mt", path=str(BASE), function_docs=str(tmp_path / "nowhere")), out, n_shards=1
        )
    with pytest.raises(IngestFileError, match=r"field 'function_docs': .*math_api.json is not a folder"):
        ingest_source(
            SourceSpec(name="bfcl_mt", path=str(BASE), function_docs=str(DOCS / "math_api.json")), out, n_shards=1
        )
    assert not out.exists()  # nothing written
    broken = tmp_path / "broken"
    shutil.copytree(DOCS, broken)
    (broken / "gorilla_file_system.json").write_text('{"name": "ls"}\n{"name": "cd", oops\n')
    with pytest.raises(IngestFileError, match=r"function docs .*gorilla_file_system.json line 2: invalid JSON"):
        ingest_source(SourceSpec(name="bfcl_mt", path=str(BASE), function_docs=str(broken)), out, n_shards=1)
    assert not (out / "accepted.parquet").exists()
    with pytest.raises(SourceSpecError, match=r"field 'function_docs': only applies with format bfcl"):
        SourceSpec(name="x", path=str(BASE), format="sharegpt", function_docs=str(DOCS))
    with pytest.raises(SourceSpecError, match=r"field 'function_docs': .* must be a local folder"):
        SourceSpec(name="x", path=str(BASE), function_docs="s3://bucket/multi_turn_func_doc")


def test_the_yaml_option_is_relative_to_the_yaml_folder(tmp_path: Path) -> None:
    sources = tmp_path / "sources"
    sources.mkdir()
    shutil.copytree(DOCS, tmp_path / "bfcl_docs")
    yaml = sources / "bfcl.yaml"
    yaml.write_text(f"path: {BASE}\nformat: bfcl\nfunction_docs: ../bfcl_docs\nregenerate: all_turns\n")
    spec = load_source_spec(yaml)
    assert spec.function_docs_folder() == sources.resolve() / ".." / "bfcl_docs"
    counts = ingest_source(spec, tmp_path / "out", n_shards=1)
    assert (counts.accepted, counts.rejected) == (200, 0)


def test_an_edited_function_doc_is_a_source_change_for_the_sensor(tmp_path: Path) -> None:
    """The prompt-source sensor's fingerprint covers the function_docs folder: new docs mean new prompts."""
    sources = tmp_path / "sources"
    sources.mkdir()
    docs = tmp_path / "bfcl_docs"
    shutil.copytree(DOCS, docs)
    (sources / "bfcl.yaml").write_text(f"path: {BASE}\nformat: bfcl\nfunction_docs: ../bfcl_docs\n")
    before = source_files_fingerprint(sources)
    assert source_files_fingerprint(sources) == before
    doc = docs / "math_api.json"
    doc.write_text(doc.read_text().replace("absolute value", "absolute value (|x|)", 1))
    assert source_files_fingerprint(sources) != before


def test_the_cli_takes_the_function_docs_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = [str(BASE), "--out", str(tmp_path / "out"), "--format", "bfcl", "--n-shards", "1"]
    assert eagle3(["ingest", *args, "--function-docs", str(DOCS)]) == 0
    counts = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (counts["read"], counts["accepted"], counts["rejected"]) == (200, 200, 0)
    assert eagle3(["ingest", *args]) == 1  # without the docs nothing is accepted, and the reason is named
    counts = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert counts["rejects_by_reason"] == {"missing_field": 200}
    assert eagle3(["ingest", *args, "--function-docs", str(tmp_path / "nowhere")]) == 2
    assert f"field 'function_docs': folder not found: {tmp_path / 'nowhere'}" in capsys.readouterr().err
