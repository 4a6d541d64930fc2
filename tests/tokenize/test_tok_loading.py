"""Tokenizer loading without remote code: local tokenizer.json, official tiktoken layout, Hub id."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from fnmatch import fnmatch
from pathlib import Path

import pytest

from eagle3_dagster.config import PROJECT_ROOT
from eagle3_dagster.tokenize import PromptRenderer, TokenizerLoadError, load_tokenizer, tokenizer_fingerprint
from eagle3_dagster.tokenize.loading import TOKENIZER_FILE_PATTERNS, read_tiktoken_ranks

_GOLDEN = PROJECT_ROOT.parent / "shared" / "tokenizers" / "kimi-k2.5" / "golden"
CHAT = json.loads((_GOLDEN / "chat_renders.json").read_text(encoding="utf-8"))
TOOLS_TS = json.loads((_GOLDEN / "tools_ts_cases.json").read_text(encoding="utf-8"))

# Importing this module would prove remote code ran: it writes a marker file and fails.
_TRAP_CODE = """
import pathlib
pathlib.Path(__file__).with_name("REMOTE_CODE_RAN").write_text("yes")
raise RuntimeError("remote code must never run")
"""


def _official_layout(shared_dir: Path, dest: Path) -> Path:
    """The official release layout: tiktoken.model + remote-code config (auto_map) + template + code."""
    src = shared_dir / "tokenizers" / "kimi-k2.5"
    dest.mkdir()
    shutil.copyfile(src / "tiktoken.model", dest / "tiktoken.model")
    shutil.copyfile(src / "chat_template.jinja", dest / "chat_template.jinja")
    shutil.copyfile(src / "original" / "tokenizer_config.json", dest / "tokenizer_config.json")
    (dest / "tokenization_kimi.py").write_text(_TRAP_CODE)
    return dest


@pytest.fixture(scope="module")
def converted(shared_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("kimi_official")
    folder = _official_layout(shared_dir, root / "release")
    cache = root / "cache"
    return folder, cache, load_tokenizer(str(folder), cache_dir=cache)


def test_local_folder_with_tokenizer_json(kimi_tok, qwen_renderer, tmp_path: Path) -> None:
    assert len(kimi_tok) == 163840
    assert kimi_tok.convert_tokens_to_ids(["<think>", "</think>"]) == [163606, 163607]
    # a saved Qwen tokenizer.json folder loads and encodes like the vocab.json + merges.txt original
    qwen = qwen_renderer.tokenizer
    qwen.save_pretrained(str(tmp_path))
    assert (tmp_path / "tokenizer.json").exists()
    reloaded = load_tokenizer(str(tmp_path))
    text = "Hello <think>world</think> 你好 🌍 <|im_end|>\n\n  x=1"
    assert reloaded.encode(text, add_special_tokens=False) == qwen.encode(text, add_special_tokens=False)
    assert reloaded.chat_template == qwen.chat_template


def test_official_layout_is_converted_with_identical_ids(
    converted, kimi_renderer: PromptRenderer, kimi_profile
) -> None:
    folder, _cache, tok = converted
    assert not (folder / "REMOTE_CODE_RAN").exists()
    assert len(tok) == 163840 and tok.convert_tokens_to_ids("<|im_end|>") == 163586
    # identical ids to the shared tokenizer.json on every golden case and sample
    renderer = PromptRenderer(kimi_profile, tok)
    for case in CHAT["cases"] + TOOLS_TS["cases"]:
        result = renderer.render(
            case["messages"],
            case["tools"],
            add_generation_prompt=case["add_generation_prompt"],
            template_kwargs=case["template_kwargs"],
        )
        assert result.input_ids == case["input_ids"], case["name"]
    for sample in CHAT["encode_samples"]:
        assert tok.encode(sample["text"], add_special_tokens=False) == sample["ids"]
    # same content -> same lineage fingerprint as the shared tokenizer.json
    assert renderer.tokenizer_fingerprint == kimi_renderer.tokenizer_fingerprint
    assert renderer.template_hash == kimi_renderer.template_hash


def test_conversion_is_cached_and_cache_is_plain(converted) -> None:
    folder, cache, tok = converted
    [entry] = [p for p in cache.iterdir() if not p.name.startswith(".")]
    config = json.loads((entry / "tokenizer_config.json").read_text())
    assert "auto_map" not in config and config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert not list(entry.glob("*.py"))
    stamp = (entry / "tokenizer.json").stat().st_mtime_ns
    again = load_tokenizer(str(folder), cache_dir=cache)
    assert (entry / "tokenizer.json").stat().st_mtime_ns == stamp  # reused, not rebuilt
    assert [p for p in cache.iterdir() if not p.name.startswith(".")] == [entry]
    assert tokenizer_fingerprint(again) == tokenizer_fingerprint(tok)


def test_auto_map_folder_with_tokenizer_json_never_runs_remote_code(shared_dir: Path, tmp_path: Path) -> None:
    src = shared_dir / "tokenizers" / "kimi-k2.5"
    folder = tmp_path / "release"
    folder.mkdir()
    shutil.copyfile(src / "tokenizer.json", folder / "tokenizer.json")
    shutil.copyfile(src / "chat_template.jinja", folder / "chat_template.jinja")
    shutil.copyfile(src / "original" / "tokenizer_config.json", folder / "tokenizer_config.json")
    (folder / "tokenization_kimi.py").write_text(_TRAP_CODE)
    tok = load_tokenizer(str(folder), cache_dir=tmp_path / "cache")
    assert not (folder / "REMOTE_CODE_RAN").exists()
    sample = CHAT["encode_samples"][-1]
    assert tok.encode(sample["text"], add_special_tokens=False) == sample["ids"]


def test_tiktoken_rank_file_reader_names_the_bad_line(tmp_path: Path) -> None:
    good = tmp_path / "ok.model"
    good.write_text("IQ== 0\nIg== 1\n")
    assert read_tiktoken_ranks(good) == {b"!": 0, b'"': 1}
    bad = tmp_path / "bad.model"
    bad.write_text("IQ== 0\nnot-base64-and-no-rank\n")
    with pytest.raises(TokenizerLoadError, match=r"bad\.model:2"):
        read_tiktoken_ranks(bad)


@pytest.mark.integration
def test_hub_id_offline_error_names_id_and_says_offline(tmp_path: Path) -> None:
    # A fresh process, so huggingface_hub reads HF_HUB_OFFLINE and an empty cache at import time.
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    code = (
        "from eagle3_dagster.tokenize import load_tokenizer, TokenizerLoadError\n"
        "try:\n    load_tokenizer('moonshotai/Kimi-K2.5')\n"
        "except TokenizerLoadError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "moonshotai/Kimi-K2.5" in out.stdout and "offline" in out.stdout.lower()


def test_hub_downloads_are_restricted_to_tokenizer_files() -> None:
    def allowed(name: str) -> bool:
        return any(fnmatch(name, p) for p in TOKENIZER_FILE_PATTERNS)

    assert allowed("tiktoken.model") and allowed("tokenizer_config.json") and allowed("chat_template.jinja")
    for forbidden in ("tokenization_kimi.py", "model-00001-of-00064.safetensors", "pytorch_model.bin"):
        assert not allowed(forbidden)


def test_bad_locations_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(TokenizerLoadError, match="neither an existing folder"):
        load_tokenizer(str(tmp_path / "missing" / "dir"))
    (tmp_path / "file.json").write_text("{}")
    with pytest.raises(TokenizerLoadError, match="is a file"):
        load_tokenizer(str(tmp_path / "file.json"))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(TokenizerLoadError, match=str(empty)):
        load_tokenizer(str(empty))


def test_broken_rank_file_is_a_clear_error_and_leaves_no_cache(tmp_path: Path) -> None:
    folder = tmp_path / "release"
    folder.mkdir()
    (folder / "tiktoken.model").write_text("IQ== 0\nIg== 5\n")  # rank 1 missing
    (folder / "tokenizer_config.json").write_text(json.dumps({"auto_map": {"AutoTokenizer": ["t.T", None]}}))
    with pytest.raises(TokenizerLoadError, match=r"tiktoken\.model: ranks are not a dense"):
        load_tokenizer(str(folder), cache_dir=tmp_path / "cache")
    assert not any((tmp_path / "cache").iterdir())


@pytest.mark.integration
def test_a_tokenizer_json_folder_loads_without_importing_torch(shared_dir: Path) -> None:
    # Every step, CLI and simulator process loads the tokenizer; AutoTokenizer's registry would import torch
    # (installed for the SpecForge lane) in each of them, for nothing a tokenizer.json needs.
    code = (
        "import sys\n"
        "from eagle3_dagster.tokenize import load_tokenizer\n"
        "tok = load_tokenizer(sys.argv[1])\n"
        "print(len(tok), tok.convert_tokens_to_ids('</think>'), 'torch' in sys.modules)\n"
    )
    folder = shared_dir / "tokenizers" / "kimi-k2.5"
    out = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["163840", "163607", "False"]
