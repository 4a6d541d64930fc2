"""`eagle3 demo --samples N`: one big shard of N distinct prompts drawn from the shared datasets.

The prompts are the user turns found in ../shared/datasets (every file, every dataset), repeated as
often as needed with a variant number appended, so every prompt (and so every sample id) is distinct.
They are written as one openai-format JSONL source in a fresh assets folder (the project's model
profiles beside it), and the demo builds its definitions from a copy of the settings with that assets
folder and one shard (app/demo.py `big_shard_settings`): one shard holds all N samples, which is what the
memory measurement (bench/publish_memory.py) needs.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

_KEYS = ("content", "value", "instruction", "question", "prompt", "input", "problem")


def _records(path: Path) -> Iterator[Any]:
    if path.suffix == ".parquet":
        yield from pq.read_table(path).to_pylist()
        return
    text = path.read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        yield from json.loads(text)
    else:
        for line in text.splitlines():
            if line.strip():
                yield json.loads(line)


def _texts(v: Any, out: list[str]) -> None:
    """Prompt-like strings: values of the usual prompt keys, anywhere in a record."""
    if isinstance(v, dict):
        for k, x in v.items():
            if k in _KEYS and isinstance(x, str) and 20 <= len(x.strip()) <= 4000:
                out.append(x.strip())
            else:
                _texts(x, out)
    elif isinstance(v, list):
        for x in v:
            _texts(x, out)


def dataset_prompts(datasets_dir: Path) -> list[str]:
    texts: list[str] = []
    for f in sorted(datasets_dir.glob("*/*")):
        if f.suffix in (".json", ".jsonl", ".parquet"):
            for r in _records(f):
                _texts(r, texts)
    texts = list(dict.fromkeys(texts))
    if not texts:
        raise ValueError(f"no prompts found in {datasets_dir}")
    return texts


def prepare_big_shard(n: int, folder: Path, datasets_dir: Path, project_assets: Path) -> Path:
    """An assets folder (returned) whose only source holds `n` distinct prompts; the model profiles copied."""
    if n < 1:
        raise ValueError(f"--samples must be >= 1, got {n}")
    texts = dataset_prompts(datasets_dir)
    assets = folder / "assets"
    if assets.exists():
        shutil.rmtree(assets)
    shutil.copytree(project_assets / "models", assets / "models")
    src = assets / "sources"
    (src / "data").mkdir(parents=True)
    with open(src / "data" / "big_shard.jsonl", "w", encoding="utf-8") as f:
        for i in range(n):
            t = texts[i % len(texts)]
            content = t if i < len(texts) else f"{t}\n\n(variant {i // len(texts)})"
            f.write(json.dumps({"messages": [{"role": "user", "content": content}]}, ensure_ascii=False) + "\n")
    (src / "big_shard.yaml").write_text(
        'path: data/big_shard.jsonl\nformat: openai\nlicence: "derived from ../shared/datasets (see their SOURCE.txt)"\n'
        "prompt_rule: last_user_or_tool\n"
    )
    return assets
