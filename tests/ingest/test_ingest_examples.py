"""examples/shared-sources: one source YAML per shared dataset; all load, ingest and combine."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from eagle3_dagster.config import PROJECT_ROOT
from eagle3_dagster.ingest import combine_sources, ingest_source, load_source_specs

EXAMPLES = PROJECT_ROOT / "examples" / "shared-sources"


def test_every_shared_dataset_has_an_example_source(datasets_dir: Path) -> None:
    specs = load_source_specs(EXAMPLES)
    dataset_folders = sorted(p.name for p in datasets_dir.iterdir() if p.is_dir())
    assert sorted(s.name for s in specs) == dataset_folders
    for spec in specs:
        (data_file,) = spec.files()
        assert data_file.resolve().parent == (datasets_dir / spec.name).resolve()
        assert spec.licence, f"{spec.name}: licence note missing"
        assert spec.format != "auto", f"{spec.name}: examples name their format explicitly"


def test_every_example_source_ingests_and_combines(datasets_dir: Path, tmp_path: Path) -> None:
    specs = load_source_specs(EXAMPLES)
    dirs = []
    total_accepted = 0
    for spec in specs:
        counts = ingest_source(spec, tmp_path / spec.name, n_shards=4)
        assert counts.read > 0 and counts.rejected == 0, (spec.name, counts)
        assert counts.read == counts.accepted + counts.rejected + counts.duplicates
        total_accepted += counts.accepted
        dirs.append(tmp_path / spec.name)
    combined = combine_sources(dirs, tmp_path / "prompts", n_shards=4)
    assert combined.input_accepted == total_accepted == combined.prompts + combined.cross_source_duplicates
    assert (
        combined.read
        == combined.prompts + combined.cross_source_duplicates + combined.rejects + combined.source_duplicates
    )
    table = pq.read_table(tmp_path / "prompts" / "prompts.parquet")
    assert table.num_rows == combined.prompts
    assert len(set(table.column("prompt_id").to_pylist())) == table.num_rows
    assert set(table.column("source").to_pylist()) == {s.name for s in specs}
