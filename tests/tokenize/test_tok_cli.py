"""`eagle3 render`: JSONL in, the pipeline's exact text + ids out, one line per input line."""

from __future__ import annotations

import json
from pathlib import Path

from eagle3_dagster.app.cli import build_parser, main
from eagle3_dagster.config import PROJECT_ROOT
from eagle3_dagster.tokenize import PromptRenderer
from eagle3_dagster.tokenize.cli import run as render

_GOLDEN = PROJECT_ROOT.parent / "shared" / "tokenizers" / "kimi-k2.5" / "golden"
CASES = (
    json.loads((_GOLDEN / "chat_renders.json").read_text())["cases"]
    + json.loads((_GOLDEN / "tools_ts_cases.json").read_text())["cases"]
)


def _write_jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_render_kimi_goldens_and_bad_lines(tmp_path: Path, shared_dir: Path, kimi_tok, capsys) -> None:
    lines = []
    for case in CASES:
        record = {"messages": case["messages"], "tools": case["tools"], "template_kwargs": case["template_kwargs"]}
        if not case["add_generation_prompt"]:
            record["add_generation_prompt"] = False  # default is true
        lines.append(json.dumps(record, ensure_ascii=False))
    lines += [
        "{broken json",
        json.dumps({"messages": "not a list"}),
        "",  # blank lines are not rows
        json.dumps({"messages": [{"content": "no role"}], "id": 7}),
    ]
    src = _write_jsonl(tmp_path / "in.jsonl", lines)
    out = tmp_path / "out" / "rendered.jsonl"
    seen_profiles = []

    def reuse_session_tokenizer(profile):  # the CLI resolves the profile; we skip a second 19 MB load
        seen_profiles.append(profile)
        return PromptRenderer(profile, kimi_tok)

    argv = ["--model", "kimi-k2.5", "--tokenizer", str(shared_dir / "tokenizers" / "kimi-k2.5"), str(src), str(out)]
    code = render(build_parser().parse_args(["render", *argv]), make_renderer=reuse_session_tokenizer)
    assert [p.name for p in seen_profiles] == ["kimi-k2.5"]
    assert seen_profiles[0].tokenizer == str(shared_dir / "tokenizers" / "kimi-k2.5")
    assert code == 1  # some lines carry errors
    rows = _read_jsonl(out)
    assert len(rows) == len(CASES) + 3
    for case, row in zip(CASES, rows):
        assert row["text"] == case["text"] and row["input_ids"] == case["input_ids"], case["name"]
        assert row["messages"] == case["messages"] and "error" not in row
    assert rows[len(CASES)]["error"]["reason"] == "invalid_json"
    assert rows[len(CASES) + 1]["error"] == {
        "reason": "invalid_request",
        "detail": f"line {len(CASES) + 2}: messages: required, a non-empty list",
    }
    assert rows[-1]["error"]["reason"] == "render_error" and rows[-1]["id"] == 7
    assert "messages[0].role" in rows[-1]["error"]["detail"]
    printed = capsys.readouterr().out
    assert f"rendered {len(CASES)}/{len(CASES) + 3}" in printed and "invalid_json=1" in printed


def test_render_profile_from_assets_dir_and_yaml_path(tmp_path: Path, shared_dir: Path, monkeypatch) -> None:
    models = tmp_path / "assets" / "models"
    models.mkdir(parents=True)
    profile_text = (PROJECT_ROOT / "assets" / "models" / "qwen3.yaml").read_text()
    (models / "myqwen.yaml").write_text(profile_text.replace("name: qwen3", "name: myqwen"))
    monkeypatch.setenv("EAGLE3_ASSETS_DIR", str(tmp_path / "assets"))
    monkeypatch.setenv("EAGLE3_TOKENIZER", str(shared_dir / "tokenizers" / "qwen3"))
    src = _write_jsonl(tmp_path / "in.jsonl", [json.dumps({"messages": [{"role": "user", "content": "hi"}]})])
    assert main(["render", "--model", "myqwen", str(src), str(tmp_path / "a.jsonl")]) == 0
    [row] = _read_jsonl(tmp_path / "a.jsonl")
    assert row["text"].endswith("<|im_start|>assistant\n") and row["prompt_len"] == len(row["input_ids"])
    # a YAML path works the same
    assert main(["render", "--model", str(models / "myqwen.yaml"), str(src), str(tmp_path / "b.jsonl")]) == 0
    assert _read_jsonl(tmp_path / "b.jsonl") == [row]


def test_render_flags_prompts_the_pipeline_would_quarantine(tmp_path: Path, shared_dir: Path) -> None:
    src = _write_jsonl(tmp_path / "in.jsonl", [json.dumps({"messages": [{"role": "user", "content": "hi"}]})])
    code = main(
        [
            "render",
            "--model",
            "qwen3",
            "--tokenizer",
            str(shared_dir / "tokenizers" / "qwen3"),
            "--max-new-tokens",
            "131070",
            str(src),
            str(tmp_path / "o.jsonl"),
        ]
    )
    assert code == 1
    [row] = _read_jsonl(tmp_path / "o.jsonl")
    assert row["error"]["reason"] == "prompt_too_long" and row["input_ids"]


def test_render_unknown_profile_or_missing_input(tmp_path: Path, capsys) -> None:
    assert main(["render", "--model", "kimi-k2.5", str(tmp_path / "missing.jsonl"), str(tmp_path / "o.jsonl")]) == 2
    assert "missing.jsonl" in capsys.readouterr().err
    src = _write_jsonl(tmp_path / "in.jsonl", ["{}"])
    assert main(["render", "--model", "no-such-model", str(src), str(tmp_path / "o.jsonl")]) == 2
    assert "no-such-model" in capsys.readouterr().err
    assert not (tmp_path / "o.jsonl").exists()
    assert main(["render", "in.jsonl"]) == 2  # --model is required: argparse's usage line
