"""Real texts from every shared dataset, for tests that compare two tokenizer paths on them."""

from __future__ import annotations

import json
from pathlib import Path


def dataset_strings(datasets_dir: Path, per_file: int = 40) -> list[str]:
    """Up to `per_file` distinct non-empty strings from every shared dataset file (all of their fields)."""
    import pyarrow.parquet as pq

    def walk(v, out: list[str]) -> None:
        if isinstance(v, str) and v.strip():
            out.append(v)
        elif isinstance(v, dict):
            for x in v.values():
                walk(x, out)
        elif isinstance(v, list):
            for x in v:
                walk(x, out)

    texts: list[str] = []
    files = sorted(f for f in datasets_dir.glob("*/*") if f.suffix in (".json", ".jsonl", ".parquet"))
    assert len(files) >= 11, files
    for f in files:
        if f.suffix == ".parquet":
            records = pq.read_table(f).slice(0, 200).to_pylist()
        else:
            raw = f.read_text(encoding="utf-8")
            records = (
                json.loads(raw)
                if raw.lstrip().startswith("[")
                else [json.loads(x) for x in raw.splitlines()[:200] if x.strip()]
            )
        found: list[str] = []
        for r in records[:200]:
            walk(r, found)
        texts += list(dict.fromkeys(found))[:per_file]
    return texts
