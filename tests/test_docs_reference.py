"""The docs tell the truth about the code: the generated reference pages are current and refuse to be written
when the code has something they cannot describe; troubleshooting names every reason code the code emits;
the README stays a short front door whose example source YAML really ingests and whose links resolve."""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from pathlib import Path

import pytest

from eagle3_dagster.config import PROJECT_ROOT, setting_fields
from eagle3_dagster.devtools import docs_gen
from eagle3_dagster.generate.answer_checks import REFUSALS as ANSWER_REFUSALS
from eagle3_dagster.generate.inputs import PROMPT_TOO_LONG_FOR_SERVER
from eagle3_dagster.ingest import spec as spec_module
from eagle3_dagster.ingest.errors import REJECT_REASONS
from eagle3_dagster.ingest.pipeline import ingest_source
from eagle3_dagster.ingest.spec import SourceSpec, load_source_spec
from eagle3_dagster.tokenize.cli import INVALID_REQUEST
from eagle3_dagster.tokenize.control_text import CONTROL_TOKEN_IN_CONTENT
from eagle3_dagster.tokenize.pipeline import INVALID_JSON, PROMPT_TOO_LONG
from eagle3_dagster.tokenize.render import GENERATION_PROMPT_MISMATCH, ID_OUT_OF_VOCAB, RENDER_ERROR

DOCS = PROJECT_ROOT / "docs"
README = PROJECT_ROOT / "README.md"


def test_the_committed_reference_pages_are_what_the_code_says() -> None:
    stale = docs_gen.stale_pages()
    assert not stale, (
        f"stale generated pages {stale}: run `.venv/bin/python -m eagle3_dagster.devtools.docs_gen` and commit"
    )


def test_check_mode_fails_on_an_edited_page_and_writing_repairs_it(tmp_path, capsys) -> None:
    docs_gen.write_pages(tmp_path)
    assert docs_gen.stale_pages(tmp_path) == []
    page = tmp_path / "configuration.md"
    page.write_text(page.read_text().replace("`EAGLE3_N_SHARDS`", "`EAGLE3_SHARDS`"))
    (tmp_path / "gates.md").unlink()
    assert sorted(Path(p).name for p in docs_gen.stale_pages(tmp_path)) == ["configuration.md", "gates.md"]
    docs_gen.write_pages(tmp_path)
    assert docs_gen.stale_pages(tmp_path) == []


def _with_spec(var: str, **changes: object) -> list:
    """The declared settings with the declaration of `var` changed."""
    return [
        dataclasses.replace(d, spec=dataclasses.replace(d.spec, **changes)) if d.spec.env == var else d
        for d in setting_fields()
    ]


def test_an_undocumented_setting_stops_the_page(monkeypatch) -> None:
    monkeypatch.setattr(docs_gen, "setting_fields", lambda: _with_spec("EAGLE3_STALL_TIMEOUT_S", meaning=" "))
    with pytest.raises(docs_gen.DocsError) as e:
        docs_gen.configuration_page()
    assert "EAGLE3_STALL_TIMEOUT_S (Settings.fleet.stall_timeout_s) has no description" in str(e.value)


def test_a_setting_declared_twice_or_a_field_without_a_variable_stops_the_page(monkeypatch) -> None:
    declared = [d for d in _with_spec("EAGLE3_STREAM", env="EAGLE3_STALL_TIMEOUT_S") if d.path != "model.name"]
    monkeypatch.setattr(docs_gen, "setting_fields", lambda: declared)
    with pytest.raises(docs_gen.DocsError) as e:
        docs_gen.configuration_page()
    assert "EAGLE3_STALL_TIMEOUT_S is declared by two settings" in str(e.value)
    assert "Settings.model.name is not read from a variable" in str(e.value)


def test_a_documented_default_that_is_not_the_codes_stops_the_page(monkeypatch) -> None:
    wrong = [*_with_spec("EAGLE3_N_SHARDS", default_doc="`8`")]
    wrong = [
        dataclasses.replace(d, spec=dataclasses.replace(d.spec, default_doc="`8`"))
        if d.spec.env == "EAGLE3_ENDPOINT_WAIT_S"
        else d
        for d in wrong
    ]
    monkeypatch.setattr(docs_gen, "setting_fields", lambda: wrong)
    with pytest.raises(docs_gen.DocsError) as e:
        docs_gen.configuration_page()
    # every default is the declared one (4 shards, a 600 s endpoint wait), and the page must say it
    assert "EAGLE3_N_SHARDS: the documented default '`8`' does not say the code's default '4'" in str(e.value)
    assert "EAGLE3_ENDPOINT_WAIT_S: the documented default '`8`' does not say the code's default '600'" in str(e.value)


def test_a_none_default_must_say_what_none_means(monkeypatch) -> None:
    monkeypatch.setattr(docs_gen, "setting_fields", lambda: _with_spec("EAGLE3_SERVED_MODEL", default_doc=None))
    with pytest.raises(docs_gen.DocsError) as e:
        docs_gen.configuration_page()
    assert "EAGLE3_SERVED_MODEL (Settings.model.served_model) defaults to None without saying what None means" in str(
        e.value
    )


def test_the_source_page_lists_every_key_with_its_type_default_and_allowed_values() -> None:
    page = (DOCS / "reference" / "source-yaml.md").read_text()
    rows = {ln.split("|")[1].strip(): ln for ln in page.splitlines() if ln.startswith("| `")}
    keys = [f.name for f in dataclasses.fields(SourceSpec) if f.name != "base_dir"]
    assert sorted(k.strip("`") for k in rows) == sorted(keys)
    assert "`final_turn`, `all_turns`" in rows["`regenerate`"] and '`"final_turn"`' in rows["`regenerate`"]
    assert "`reject`, `as_text`, `as_served`" in rows["`control_text`"]
    assert "`ultrachat` = `openai`" in rows["`format`"] and "`bfcl`" in rows["`format`"]
    assert "| `int` | `200000` |" in rows["`max_bytes`"]
    assert "required" in rows["`path`"]


def test_a_source_key_without_a_description_stops_the_page(monkeypatch) -> None:
    doc = "\n".join(ln for ln in (spec_module.__doc__ or "").splitlines() if not ln.startswith("    max_bytes:"))
    monkeypatch.setattr(spec_module, "__doc__", doc)
    with pytest.raises(docs_gen.DocsError, match=r"SourceSpec\.max_bytes has no line"):
        docs_gen.source_yaml_page()


def test_the_gates_page_lists_every_expectation_and_whether_it_blocks() -> None:
    page = (DOCS / "reference" / "gates.md").read_text()
    rows = {ln.split("|")[1].strip(): ln for ln in page.splitlines() if ln.startswith("| `")}
    for path in sorted((PROJECT_ROOT / "expectations").glob("*.json")):
        assert f"## `{path.stem}`" in page
        if path.stem == "drafter_promotion":  # the drafter promotion rule, not a suite: each field with its value
            for field, value in json.loads(path.read_text())["rule"].items():
                assert f"| `rule.{field}` | `{json.dumps(value)}` |" in page, field
            continue
        for e in json.loads(path.read_text())["expectations"]:
            row = rows[f"`{e['meta']['key']}`"]
            blocks = e["meta"]["severity"] == "critical" and e["meta"].get("enabled", True)
            assert ("**blocks**" in row) == blocks, row
    assert "failing rows quarantined" in rows["`think_end_present`"]
    assert "failing rows quarantined" not in rows["`duplicate_rate`"]  # table level: never quarantines


def test_a_suite_without_an_asset_stops_the_gates_page(tmp_path) -> None:
    for p in (PROJECT_ROOT / "expectations").glob("*.json"):
        (tmp_path / p.name).write_text(p.read_text())
    (tmp_path / "toxicity.json").write_text('{"name": "toxicity", "expectations": []}')
    with pytest.raises(docs_gen.DocsError, match=r"expectations/toxicity\.json has no asset"):
        docs_gen.gates_page(tmp_path)


def test_the_gates_page_lists_every_asset_check_of_the_definitions_and_refuses_an_unknown_one(tmp_path) -> None:
    snapshot = json.loads(docs_gen.DEFS_SNAPSHOT.read_text())
    page = (DOCS / "reference" / "gates.md").read_text()
    for asset, a in snapshot["assets"].items():
        for check, spec in a["checks"].items():
            shown = "source__<name>" if asset.startswith("source__") else asset
            row = next(ln for ln in page.splitlines() if ln.startswith(f"| `{shown}` | `{check}` |"))
            assert ("**yes**" in row) == spec["blocking"], row
    snapshot["assets"]["generations"]["checks"]["toxicity"] = {"blocking": True}
    (tmp_path / "defs_snapshot.json").write_text(json.dumps(snapshot))
    with pytest.raises(docs_gen.DocsError, match="asset check generations:toxicity has no description"):
        docs_gen.asset_check_rows(tmp_path / "defs_snapshot.json")


def _literal_reasons(module: Path) -> set[str]:
    """String literals the module emits as reason codes: `reason="..."`, `RetryableFailure/FinalFailure("...")`,
    `problems.append("...")` and `RowReject("...")`."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(module.read_text())):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        args = node.args[:1] if name in ("RetryableFailure", "FinalFailure", "append", "RowReject") else []
        values = [*args, *(kw.value for kw in node.keywords if kw.arg == "reason")]
        found |= {v.value for v in values if isinstance(v, ast.Constant) and isinstance(v.value, str)}
    return found


def test_troubleshooting_names_every_reason_code() -> None:
    page = (DOCS / "troubleshooting.md").read_text()
    pkg = PROJECT_ROOT / "eagle3_dagster"
    codes = set(REJECT_REASONS) | {
        RENDER_ERROR,
        ID_OUT_OF_VOCAB,
        GENERATION_PROMPT_MISMATCH,
        PROMPT_TOO_LONG,
        INVALID_JSON,
        CONTROL_TOKEN_IN_CONTENT,
        INVALID_REQUEST,
        PROMPT_TOO_LONG_FOR_SERVER,
        "empty_input_ids",
        "input_id_out_of_vocab",
    }
    for module in (
        "generate/client.py",
        "generate/sse.py",
        "generate/engine.py",
        "tokenize/parse.py",
        "ingest/normalize.py",
    ):
        codes |= _literal_reasons(pkg / module)
    codes |= ANSWER_REFUSALS
    codes -= {""}
    assert len(codes) > 45, sorted(codes)  # the scan found them
    missing = sorted(c for c in codes if f"`{c}`" not in page)
    assert not missing, f"reason codes the code emits that docs/troubleshooting.md does not explain: {missing}"


def test_the_readme_is_a_front_door() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    assert "## Configuration" not in text  # the variables live in the generated reference
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    assert len(links) >= 10
    for link in links:
        if "://" in link:
            continue
        target = PROJECT_ROOT / link
        assert target.exists(), f"README links to {link}, which does not exist"
        if target.suffix == ".png":
            assert target.stat().st_size < 200_000, f"{link} is {target.stat().st_size:,} bytes"


def test_the_readme_source_example_ingests(tmp_path) -> None:
    text = README.read_text()
    section = text.split("## Use your own prompts", 1)[1].split("\n## ", 1)[0]
    yaml_text = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)  # type: ignore[union-attr]
    sources = tmp_path / "sources"
    path = re.search(r"^path: (\S+)", yaml_text, re.M).group(1)  # type: ignore[union-attr]
    data = sources / path
    data.parent.mkdir(parents=True)
    rows = [
        {"messages": [{"role": "user", "content": "What is the capital of France?"}]},
        {
            "messages": [
                {"role": "system", "content": "Be terse."},
                {"role": "user", "content": "Explain TCP slow start."},
            ]
        },
        {
            "messages": [
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello!"},
                {"role": "user", "content": "A haiku about rain?"},
            ]
        },
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows) + "not json\n")
    (sources / "my_chats.yaml").write_text(yaml_text)
    spec = load_source_spec(sources / "my_chats.yaml")
    assert spec.name == "my_chats" and spec.format == "openai"
    counts = ingest_source(spec, tmp_path / "out", n_shards=4, require_accepted=True)
    assert (counts.read, counts.accepted, counts.rejected, counts.duplicates) == (4, 3, 1, 0)
    assert counts.rejects_by_reason == {"not_json": 1}
