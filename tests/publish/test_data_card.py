"""A snapshot folder is a Hugging Face dataset folder: its README.md card says true things about it.

The card of a real published snapshot (the graph on a real Dagster instance, the simulator over HTTP,
the real Kimi tokenizer, the project's demo source) is checked against the snapshot's own files: the
YAML header's licences against the source YAML, its configs against the Parquet files, the body's
figures against the tables; and the real `datasets` library loads the folder to exactly those rows.
In-process: a source without a licence is written `unknown` and named in a WARNING; licences and
names from user YAML cannot break the header or inject Markdown.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import dagster as dg
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from graph_helpers import graph_resources
from test_train_snapshot import _gates, _write_shard

from eagle3_dagster.config import PROJECT_ROOT
from eagle3_dagster.definitions import defs
from eagle3_dagster.ingest import load_source_specs
from eagle3_dagster.orchestration.run import GraphScope, materialize_graph
from eagle3_dagster.publish.export import EXPORTERS
from eagle3_dagster.publish.snapshot import PublishPolicy, SnapshotContent, build_snapshot, sha256_file
from eagle3_dagster.sim.process import start_simulator


def _header_and_body(card: str) -> tuple[dict, str]:
    """The YAML front matter (between the first two `---` lines) and the Markdown after it."""
    m = re.match(r"\A---\n(.*?)\n---\n(.*)\Z", card, re.DOTALL)
    assert m, card[:300]
    return yaml.safe_load(m.group(1)), m.group(2)


def _table(body: str, heading: str) -> list[dict[str, str]]:
    """The first Markdown table under `## heading`, as row dicts."""
    section = body.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    lines = [ln for ln in section.splitlines() if ln.startswith("|")]
    cells = [[c.strip() for c in re.split(r"(?<!\\)\|", ln)[1:-1]] for ln in lines]
    return [dict(zip(cells[0], row)) for row in cells[2:]]


@pytest.fixture(scope="module")
def published(tmp_path_factory, kimi_profile):
    """Two shards of the demo source generated, gated and published: the snapshot folder and its data dir."""
    data = tmp_path_factory.mktemp("card") / "data"
    with dg.instance_for_test() as instance, start_simulator() as sim:
        res = graph_resources(data, kimi_profile.tokenizer, sim.url, max_new_tokens=512)
        out = materialize_graph(
            defs,
            instance,
            scope=GraphScope(shards=["0000", "0001"], run_publish=True, allow_partial=True),
            resources=res,
        )
        assert out.success, out
    version = (data / "snapshots" / "LATEST").read_text().strip()
    return data, data / "snapshots" / version


@pytest.mark.integration
def test_card_header_and_figures_are_the_snapshots_own(published):
    data, snap = published
    manifest = json.loads((snap / "manifest.json").read_text())
    card = (snap / "README.md").read_text()
    assert manifest["card"] == {"file": "README.md", "sha256": sha256_file(snap / "README.md"), "warnings": []}
    header, body = _header_and_body(card)
    assert {"license", "license_name", "license_details", "size_categories", "task_categories", "tags"} <= set(header)
    assert {"configs", "pretty_name"} <= set(header)
    # the demo source's licence is free text (not a Hub id): `other`, its text under license_details
    (demo,) = [s for s in load_source_specs(PROJECT_ROOT / "assets" / "sources") if s.name == "demo"]
    assert header["license"] == "other" and header["license_details"] == f"demo: {demo.licence}"
    assert header["language"] == demo.language == ["en"]
    assert header["size_categories"] == ["n<1K"] and "text-generation" in header["task_categories"]
    assert {"eagle3", "speculative-decoding", "kimi-k2.5"} <= set(header["tags"])
    tables = sorted(p.relative_to(snap).as_posix() for p in (snap / "training_samples").glob("*.parquet"))
    assert len(tables) == 2
    assert header["configs"] == [
        {"config_name": "training_samples", "default": True, "data_files": [{"split": "train", "path": tables}]}
    ]
    rows = pl.concat([pl.read_parquet(snap / t) for t in tables])
    counts = {r["source"]: r for r in _table(body, "Counts")}
    ingest = json.loads((data / "sources" / "demo" / "counts.json").read_text())
    assert int(counts["demo"]["rows"]) == rows.height == manifest["rows"] > 0
    for key, label in (("read", "read"), ("rejected", "rejected at ingest"), ("duplicates", "duplicates")):
        assert int(counts["demo"][label]) == ingest[key], key
    assert int(counts["demo"]["accepted"]) == ingest["accepted"] == ingest["read"] - 1  # the demo's one duplicate
    prompts = pl.read_parquet(data / "prompts" / "prompts.parquet").filter(pl.col("shard").is_in([0, 1]))
    assert int(counts["demo"]["prompts in the snapshot's shards"]) == prompts.height
    assert f"Prompts in: read {ingest['read']} = " in body and f"; training rows {rows.height} (the snapshot's" in body
    # a card names no folder of the machine that made it: the tokenizer (a local folder here) and the source
    # file (a local path) by their names only
    for folder in (str(PROJECT_ROOT), str(PROJECT_ROOT.parent), str(data)):
        assert folder not in card and folder not in (snap / "manifest.json").read_text(), folder
    assert "| tokenizer | `kimi-k2.5 (local)`; fingerprints" in body
    assert _table(body, "Sources")[0]["from"] == r"demo\_prompts.jsonl \(local\)"
    for column in ("model_revision", "template_hash", "sampling_hash", "tokenizer_fingerprint"):
        for value, n in rows[column].value_counts().iter_rows():
            assert f"`{value}` ({n} rows)" in body, (column, value)
    assert f"`{manifest['config']['profile_fingerprint']}`" in body and "kimi-k2.5" in body
    # the simulator's release and its one server, on every row (copied from the generations) and in the card
    (release,) = rows["sglang_version"].unique().to_list()
    assert release and rows["worker"].n_unique() == 1 and rows["worker"].null_count() == 0
    assert manifest["served_by"] == {"sglang_versions": {release: rows.height}, "workers": 1, "rows_without_worker": 0}
    assert _server_row(body).startswith(f"release(s) `{release}` ({rows.height} rows); 1 worker(s); weight version(s)")
    assert "Mixed SGLang releases" not in body
    assert _served_row(body) == "model type `kimi_k25`; any other was refused"
    sampling = manifest["config"]["sampling"]  # the profile's, as the run sent them (max_new_tokens: the run's)
    assert sampling and f"max_new_tokens={manifest['config']['max_new_tokens']};" in body
    for key, value in sampling.items():
        assert (key == "max_new_tokens") != (f"{key.replace('_', chr(92) + '_')}={value}" in body), key
    gates = {r["gate"]: r for r in _table(body, "Gates passed")}
    assert [gates[g]["shards passed"] for g in ("prompts", "generations", "training_samples")] == ["2/2"] * 3
    tg = gates["training_samples"]
    assert int(tg["rows checked"]) - int(tg["rows quarantined"]) == rows.height
    assert gates["publish"]["shards passed"] == "snapshot passed when written"
    assert _table(body, "Sources")[0]["licence"] == demo.licence
    assert f'datasets.load_dataset("snapshots/{snap.name}")' in body


@pytest.mark.integration
def test_snapshot_folder_loads_with_datasets_as_its_tables(published, tmp_path, monkeypatch):
    _, snap = published
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
    ds = datasets.load_dataset(str(snap), cache_dir=str(tmp_path / "cache"))
    named = datasets.load_dataset(str(snap), "training_samples", cache_dir=str(tmp_path / "cache"))
    assert list(ds) == list(named) == ["train"] and named["train"].num_rows == ds["train"].num_rows
    expected = pa.concat_tables(pq.read_table(p) for p in sorted((snap / "training_samples").glob("*.parquet")))
    assert ds["train"].column_names == expected.column_names
    assert ds["train"].to_list() == expected.to_pylist()


def _served_row(body: str) -> str:
    """The value of the card's "served model" row (what every endpoint had to serve)."""
    (line,) = [ln for ln in body.splitlines() if ln.startswith("| served model (each endpoint's `/model_info`")]
    return line.split(" | ", 1)[1].removesuffix(" |")


def test_the_card_states_a_served_model_pin(tmp_path):
    """EAGLE3_SERVED_MODEL (a local copy, a fine-tune): the card says which model path was pinned and that the
    profile's model type was not required of it; a snapshot that does not record the check says so."""
    _write_shard(tmp_path, 0, 3)
    pinned = {"model_types": ["kimi_k25"], "model_path": None, "pinned_path": "/models/k25-ft"}
    snap = build_snapshot(
        tmp_path, [0], _gates(), SnapshotContent(config={"profile": "kimi-k2.5", "served_model": pinned})
    )
    _, body = _header_and_body((Path(snap.path) / "README.md").read_text())
    assert _served_row(body) == (
        "model path `/models/k25-ft`, pinned by EAGLE3_SERVED_MODEL: endpoints serving it were used whatever their "
        "model type (the profile expects model type `kimi_k25`), any other model was refused"
    )
    (Path(snap.path) / "manifest.json").unlink()
    bare = build_snapshot(tmp_path, [0], _gates(), SnapshotContent(config={}))
    assert _served_row(_header_and_body((Path(bare.path) / "README.md").read_text())[1]) == "not recorded"


def test_a_source_without_a_licence_is_unknown_and_named_in_a_warning(tmp_path, caplog):
    _write_shard(tmp_path, 0, 3)
    sources = [{"name": "demo", "licence": "", "origin": "data/x.jsonl", "description": "", "role": "train"}]
    with caplog.at_level(logging.WARNING, logger="eagle3_dagster.publish.card"):
        snap = build_snapshot(
            tmp_path, [0], _gates(), SnapshotContent(config={"sources": sources}, exporters=EXPORTERS)
        )
    warned = [r for r in caplog.records if r.levelno == logging.WARNING and "'demo'" in r.getMessage()]
    assert warned and "states no licence" in warned[0].getMessage() and "unknown" in warned[0].getMessage()
    header, body = _header_and_body((Path(snap.path) / "README.md").read_text())
    assert header["license"] == "unknown" and "license_details" not in header and "language" not in header
    assert _table(body, "Sources")[0]["licence"] == "unknown"
    assert "**Warning:** source 'demo' states no licence" in body
    assert snap.manifest["card"]["warnings"] == [warned[0].getMessage().split(": ", 1)[1]]


def test_licences_from_user_yaml_cannot_break_the_header_or_the_body(tmp_path):
    _write_shard(tmp_path, 0, 2, source="a")
    _write_shard(tmp_path, 1, 3, source="b")
    evil = 'MIT\n---\nlicense: apache-2.0 # "x" | <script>alert(1)</script> [l](http://e)'
    sources = [
        {"name": "a", "licence": "Apache-2.0", "origin": "a.jsonl", "language": ["en"], "role": "train"},
        {"name": "b", "licence": evil, "origin": "s3://bucket/b.jsonl", "description": "*x*", "language": ["zh", "en"]},
    ]
    snap = build_snapshot(tmp_path, [0, 1], _gates(), SnapshotContent(config={"profile": "p", "sources": sources}))
    card = (Path(snap.path) / "README.md").read_text()
    assert card.count("\n---\n") == 1 and card.startswith("---\n")
    header, body = _header_and_body(card)
    assert header["license"] == ["apache-2.0", "other"] and header["language"] == ["en", "zh"]
    assert header["license_name"] == "b-licence"
    assert header["license_details"] == "b: " + " ".join(evil.split())
    assert "<script>" not in body and "[l](http" not in body
    by_source = {r["source"]: r for r in _table(body, "Sources")}
    assert by_source["a"]["licence"] == "Apache-2.0" and by_source["b"]["description"] == r"\*x\*"
    assert [int(r["rows"]) for r in _table(body, "Counts")] == [2, 3]


def test_the_same_snapshot_built_again_has_the_same_card(tmp_path):
    """No timestamp in the card: rebuilding identical content (another day) gives identical bytes."""
    import datetime as dt

    _write_shard(tmp_path, 0, 3)
    sources = [{"name": "demo", "licence": "CC0-1.0", "origin": "d.jsonl", "description": "", "role": "train"}]
    first = build_snapshot(tmp_path, [0], _gates(), SnapshotContent(config={"sources": sources}))
    card = (Path(first.path) / "README.md").read_bytes()
    (Path(first.path) / "manifest.json").unlink()  # force a rebuild of the same content
    again = build_snapshot(
        tmp_path,
        [0],
        _gates(),
        SnapshotContent(config={"sources": sources}, now=dt.datetime(2030, 1, 1, tzinfo=dt.UTC)),
    )
    assert again.created and again.version == first.version
    assert (Path(again.path) / "README.md").read_bytes() == card
    assert _header_and_body(card.decode())[0]["license"] == "cc0-1.0"


def test_a_held_back_snapshot_published_later_keeps_a_true_card(tmp_path):
    """The drift policy holds a snapshot back, a later publish of the same content publishes it: the card
    written the first time must not still say it was held back (it leaves that to the manifest)."""
    from eagle3_dagster.publish.snapshot_gates import DriftVerdict, GateVerdict, SnapshotVerdict

    _write_shard(tmp_path, 0, 3)

    def judge(publish: bool):
        gate = GateVerdict(success=True, suite_sha256="s1", created_at="", outcomes=(), values={})
        drift = DriftVerdict(
            gate, status="ok" if publish else "warned", policy="hold", against=None, failed=(), before={}
        )
        reasons = [] if publish else ["drifted against the previous snapshot: reasoning_len p50 -80%"]
        return lambda facts: SnapshotVerdict(publish=publish, reasons=reasons, publish_gate=gate, drift=drift)

    held = build_snapshot(tmp_path, [0], _gates(), SnapshotContent(config={}), policy=PublishPolicy(judge=judge(False)))
    card = (Path(held.path) / "README.md").read_bytes()
    assert not held.published and held.manifest["published"] is False
    later = build_snapshot(tmp_path, [0], _gates(), SnapshotContent(config={}), policy=PublishPolicy(judge=judge(True)))
    assert later.published and not later.created and later.manifest["published"] is True
    assert (Path(later.path) / "README.md").read_bytes() == card
    text = card.decode()
    assert "drifted against" not in text and "Not published" not in text
    assert "| publish | `s1` | snapshot passed when written |" in text


def test_a_source_language_must_be_iso_codes(tmp_path):
    from eagle3_dagster.ingest.errors import SourceSpecError
    from eagle3_dagster.ingest.spec import spec_from_dict

    ok = spec_from_dict({"path": "x.jsonl", "language": "pt-BR"}, source="s.yaml", default_name="s", base_dir=tmp_path)
    assert ok.language == ["pt-BR"]
    with pytest.raises(SourceSpecError, match="s.yaml: .*field 'language': must be an ISO 639 code"):
        spec_from_dict(
            {"path": "x.jsonl", "language": ["English"]}, source="s.yaml", default_name="s", base_dir=tmp_path
        )


def test_tables_with_other_columns_get_a_config_each_that_datasets_loads(tmp_path, monkeypatch):
    """A multi-turn shard's table has two more columns (conversation_id, turn_index): `datasets` cannot
    read it in one split with a final-turn table, so each column set is its own config, with a warning."""
    _write_shard(tmp_path, 0, 2)
    _write_shard(tmp_path, 1, 3)
    f = tmp_path / "training_samples" / "shard=0001" / "part-0000.parquet"
    t = pq.read_table(f)
    t = t.append_column("conversation_id", pa.array(["c"] * 3)).append_column(
        "turn_index", pa.array([1, 2, 3], pa.int32())
    )
    pq.write_table(t, f)
    snap = build_snapshot(tmp_path, [0, 1], _gates(), SnapshotContent(config={}))
    header, body = _header_and_body((Path(snap.path) / "README.md").read_text())
    assert [(c["config_name"], c["data_files"][0]["path"]) for c in header["configs"]] == [
        ("training_samples", ["training_samples/shard=0000.parquet"]),
        ("training_samples_2", ["training_samples/shard=0001.parquet"]),
    ]
    assert any("conversation_id, turn_index" in w for w in snap.manifest["card"]["warnings"])
    assert f'datasets.load_dataset("snapshots/{snap.version}", "training_samples_2")' in body
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
    cache = str(tmp_path / "cache")
    first = datasets.load_dataset(str(snap.path), cache_dir=cache)["train"]
    second = datasets.load_dataset(str(snap.path), "training_samples_2", cache_dir=cache)["train"]
    assert (first.num_rows, second.num_rows) == (2, 3) and second.column_names[-2:] == ["conversation_id", "turn_index"]


def test_every_count_of_the_card_reconciles_probes_and_quarantined_prompts_included(tmp_path):
    """read = rejected + duplicates + overlaps + other shards + probe prompts + quarantined or failed + trained,
    per source and in total, over a data dir holding each case once; the card states that equation."""
    from eagle3_dagster.publish.card_facts import reconciliation, source_counts
    from eagle3_dagster.storage import data_root

    data = tmp_path
    for name, counts in {"demo": (12, 9, 1, 2), "probe": (2, 2, 0, 0)}.items():
        (data / "sources" / name).mkdir(parents=True)
        read, accepted, rejected, duplicates = counts
        (data / "sources" / name / "counts.json").write_text(
            json.dumps({"read": read, "accepted": accepted, "rejected": rejected, "duplicates": duplicates})
        )
    # demo: 9 accepted = 1 quarantined as probe overlap + 6 in shard 0 + 2 in shard 1; probe: 2 in shard 0
    (data / "prompts").mkdir()
    (data / "prompts" / "decontamination.json").write_text(
        json.dumps({"probe_overlap_by_training_source": {"demo": 1}})
    )
    prompts = [(f"p0-{i}", "demo", 0) for i in range(6)] + [("p1-0", "demo", 1), ("p1-1", "demo", 1)]
    prompts += [("q0", "probe", 0), ("q1", "probe", 0)]
    pl.DataFrame(prompts, schema=["prompt_id", "source", "shard"], orient="row").write_parquet(
        data / "prompts" / "prompts.parquet"
    )
    # shard 0: p0-0..p0-3 trained (p0-3 a two-turn conversation: two rows), p0-4 quarantined at tokenize,
    # p0-5's request failed for good
    _write_shard(data, 0, 4)
    table = data / "training_samples" / "shard=0000" / "part-0000.parquet"
    rows = pl.read_parquet(table)
    pl.concat([rows, rows.tail(1).with_columns(pl.lit("s0-3b").alias("sample_id"))]).write_parquet(table)
    tok = data / "tokenized_prompts" / "shard=0000"
    tok.mkdir(parents=True)
    pl.DataFrame({"prompt_id": ["p0-4"], "source": ["demo"]}).write_parquet(tok / "rejects.parquet")
    gen = data / "generations" / "shard=0000"
    gen.mkdir(parents=True)
    pl.DataFrame({"prompt_id": ["p0-5"], "reason": ["http_400"]}).write_parquet(gen / "errors.parquet")

    counts = source_counts(data_root(data), ["demo", "probe"], [0], [data_root(table)], ["probe"])
    demo, probe = counts["demo"], counts["probe"]
    assert (demo.other_shards, demo.probe_overlap, demo.no_row, demo.trained, demo.rows) == (2, 1, 2, 4, 5)
    assert (demo.tokenize_rejected, demo.generation_failed, demo.cross_source_duplicates) == (1, 1, 0)
    assert (probe.probe_prompts, probe.trained, probe.rows) == (2, 0, 0)
    assert demo.reconciles() and probe.reconciles()
    assert reconciliation(counts) == (
        "read 14 = rejected at ingest 1 + duplicates 2 + probe overlap 1 + in other shards 2 + probe prompts 2 + "
        "quarantined or failed 2 + trained 4; training rows 5, 1 of them further turns of multi-turn conversations"
    )


def _server_row(body: str) -> str:
    """The value of the card's "server (SGLang)" row."""
    (line,) = [ln for ln in body.splitlines() if ln.startswith("| server (SGLang) | ")]
    return line.removeprefix("| server (SGLang) | ").removesuffix(" |")


def test_the_card_and_manifest_count_rows_per_sglang_release_and_say_a_mix_plainly(tmp_path):
    """Rows of two releases (0.5.9 sorts before 0.5.12) and a shard table built before training rows recorded the
    release (its rows `unknown`, and naming no worker): the manifest counts them, the card names each release with
    its rows in one line of its own."""
    _write_shard(tmp_path, 0, 3, worker="http://w1:30000", sglang_version="0.5.12")
    _write_shard(tmp_path, 1, 2, worker="http://w2:30000", sglang_version="0.5.9")
    _write_shard(tmp_path, 2, 1)
    old = tmp_path / "training_samples" / "shard=0002" / "part-0000.parquet"
    pq.write_table(pq.read_table(old).drop_columns(["worker", "sglang_version"]), old)
    snap = build_snapshot(tmp_path, range(3), _gates(), SnapshotContent(config={}))
    served = {"sglang_versions": {"0.5.12": 3, "0.5.9": 2, "unknown": 1}, "workers": 2, "rows_without_worker": 1}
    assert snap.manifest["served_by"] == served
    assert json.loads((Path(snap.path) / "manifest.json").read_text())["served_by"] == served
    _, body = _header_and_body((Path(snap.path) / "README.md").read_text())
    mixed = [ln for ln in body.splitlines() if ln.startswith("**Mixed SGLang releases:**")]
    assert mixed == [
        "**Mixed SGLang releases:** the rows were served by `0.5.9` (2 rows), `0.5.12` (3 rows), `unknown` (1 rows); "
        "each row's `sglang_version` says which (`unknown`: the row does not record it)."
    ]
    assert _server_row(body) == (
        "release(s) `0.5.9` (2 rows), `0.5.12` (3 rows), `unknown` (1 rows); 2 worker(s) (1 rows do not name "
        "theirs); weight version(s) not recorded"
    )


def test_a_snapshot_of_one_release_names_it_without_a_mix_line(tmp_path):
    _write_shard(tmp_path, 0, 2, worker="http://w1:30000", sglang_version="0.5.18")
    _write_shard(tmp_path, 1, 1, worker="http://w2:30000", sglang_version="0.5.18")
    snap = build_snapshot(tmp_path, [0, 1], _gates(), SnapshotContent(config={}))
    assert snap.manifest["served_by"] == {"sglang_versions": {"0.5.18": 3}, "workers": 2, "rows_without_worker": 0}
    _, body = _header_and_body((Path(snap.path) / "README.md").read_text())
    assert "Mixed SGLang releases" not in body
    assert _server_row(body) == "release(s) `0.5.18` (3 rows); 2 worker(s); weight version(s) not recorded"
