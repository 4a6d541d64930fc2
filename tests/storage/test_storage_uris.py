"""The storage layer on an fsspec filesystem (memory://) and locally: round trips, listing, atomicity,
path traversal and credential handling. The S3 end-to-end run is tests/reliability/test_object_storage.py."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import uuid
from pathlib import Path
from types import SimpleNamespace

import polars as pl
import pyarrow as pa
import pytest

from eagle3_dagster import schemas
from eagle3_dagster.config import PROJECT_ROOT, settings
from eagle3_dagster.generate.store import ShardStore, lock_path_for, read_generations
from eagle3_dagster.ingest import SourceSpec, combine_sources, ingest_source
from eagle3_dagster.orchestration.resources import PipelineSettings, pipeline_resource
from eagle3_dagster.publish.export import CONVERSATIONS_FILE, EXPORTERS, SPECFORGE_FILE
from eagle3_dagster.publish.snapshot import PublishPolicy, SnapshotContent, build_snapshot, list_snapshots
from eagle3_dagster.quality.gate import GateResult, read_gate_result, write_gate_result
from eagle3_dagster.storage import (
    DataPath,
    ParquetSink,
    StorageError,
    TextSink,
    data_root,
    read_parquet,
    read_parquet_dir,
    redact_uri,
    sha256_of,
    shard_dir,
    write_frame_atomic,
    write_table_atomic,
)


@pytest.fixture
def mem() -> DataPath:
    """A fresh memory:// data root (fsspec's memory store is process-wide: a unique bucket per test)."""
    root = data_root(f"memory://eagle3-test-{uuid.uuid4().hex[:10]}/data")
    yield root
    import fsspec

    try:
        fsspec.filesystem("memory").rm(root.path.rsplit("/", 1)[0], recursive=True)
    except FileNotFoundError:
        pass  # nothing was written


def _table(n: int = 5) -> pa.Table:
    return pa.table(
        {"id": [f"r{i}" for i in range(n)], "ids": pa.array([[i, i + 1] for i in range(n)], pa.list_(pa.int32()))}
    )


# --------------------------------------------------------------------------------------- memory://
def test_parquet_json_text_round_trips(mem):
    p = mem / "generations" / "shard=0001" / "part-0000.parquet"
    assert write_table_atomic(_table(), p) == p
    back = read_parquet(p)
    assert back.height == 5 and back["ids"].to_list()[2] == [2, 3] and back.schema["ids"] == pl.List(pl.Int32)
    assert read_parquet(p, columns=["id"], n_rows=2).to_dict(as_series=False) == {"id": ["r0", "r1"]}
    (mem / "gates" / "x.json").write_json({"a": 1})
    assert (mem / "gates" / "x.json").read_json() == {"a": 1}
    (mem / "LATEST").write_text("v1\n")
    assert (mem / "LATEST").read_text() == "v1\n"
    assert sha256_of(p) == hashlib.sha256(p.read_bytes()).hexdigest()
    # empty frame with a schema -> an empty, typed table
    e = write_frame_atomic(pl.DataFrame(), mem / "empty.parquet", schema=schemas.GENERATION_ERRORS)
    assert read_parquet(e).columns == schemas.GENERATION_ERRORS.names
    assert str(p) == f"{mem}/generations/shard=0001/part-0000.parquet" and str(mem).startswith("memory://")


def test_listing_exists_delete_copy(mem):
    d = mem / "generations" / "shard=0002"
    assert not d.exists() and d.iterdir() == [] and d.glob("part-*.parquet") == []
    assert read_parquet_dir(d, schema=schemas.GENERATIONS).columns == schemas.GENERATIONS.names
    for name in ("part-2.parquet", "part-1.parquet", "errors.parquet"):
        write_table_atomic(_table(2), d / name)
    assert d.exists() and d.is_dir() and (d / "errors.parquet").is_file()
    assert [p.name for p in d.glob("part-*.parquet")] == ["part-1.parquet", "part-2.parquet"]
    assert [p.name for p in d.iterdir()] == ["errors.parquet", "part-1.parquet", "part-2.parquet"]
    assert [str(p.relative_to(mem)) for p in mem.glob("*/shard=*")] == ["generations/shard=0002"]
    assert read_parquet_dir(d).height == 4
    dst = (d / "part-1.parquet").copy_to(mem / "snapshots" / "v" / "x.parquet")
    assert dst.read_bytes() == (d / "part-1.parquet").read_bytes()
    (d / "part-2.parquet").unlink()
    (d / "part-2.parquet").unlink(missing_ok=True)
    with pytest.raises(FileNotFoundError):
        (d / "part-2.parquet").unlink(missing_ok=False)
    (mem / "snapshots").rmtree()
    assert not (mem / "snapshots").exists() and (d / "part-1.parquet").exists()


def test_streamed_sinks_appear_only_on_commit(mem):
    target = mem / "prompts" / "prompts.parquet"
    sink = ParquetSink(target, _table().schema)
    sink.write_table(_table(3))
    assert not target.exists()
    sink.commit()
    assert read_parquet(target).height == 3 and not sink.tmp.exists()
    aborted = ParquetSink(mem / "prompts" / "other.parquet", _table().schema)
    aborted.write_table(_table(3))
    aborted.abort()
    assert not (mem / "prompts" / "other.parquet").exists() and not aborted.tmp.exists()
    t = TextSink(mem / "exports" / "a.jsonl")
    t.write('{"x":1}\n')
    assert not (mem / "exports" / "a.jsonl").exists()
    t.commit()
    assert (mem / "exports" / "a.jsonl").read_text() == '{"x":1}\n'
    assert [p.name for p in mem.glob("*/*")] == ["a.jsonl", "prompts.parquet"]  # no temp objects anywhere


def test_ingest_gates_store_and_snapshot_on_memory(mem, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(json.dumps({"messages": [{"role": "user", "content": f"q{i}"}]}) for i in range(6)) + "\n")
    counts = ingest_source(SourceSpec(name="s", path=str(src)), mem / "sources" / "s", n_shards=2)
    assert counts.accepted == 6
    combined = combine_sources([mem / "sources" / "s"], mem / "prompts", n_shards=2)
    assert combined.prompts == 6 and read_parquet(mem / "prompts" / "prompts.parquet").height == 6
    assert (mem / "sources" / "s" / "counts.json").read_json()["read"] == 6

    res = GateResult(
        gate="generations",
        success=False,
        outcomes=[],
        n_rows=3,
        row_failures=pl.DataFrame({"row_id": ["a"], "reasons": [["x"]]}),
    )
    p = write_gate_result(mem, "generations", 1, res)
    assert isinstance(p, DataPath) and str(p).endswith("gates/generations/shard=0001.json")
    write_gate_result(mem, "generations", 1, res)  # rewritten: one rejects object remains
    assert len((mem / "gates" / "generations").glob("shard=0001.*.rejects.parquet")) == 1
    back = read_gate_result(mem, "generations", 1)
    assert back is not None and not back.success and back.row_failures["row_id"].to_list() == ["a"]

    store = ShardStore(shard_dir(mem, "generations", 1), lock_dir=tmp_path / "locks")
    assert store.lock_path.parent == tmp_path / "locks"  # the lock is local, never an object
    store.open()
    try:
        row = {f.name: None for f in schemas.GENERATIONS}
        row.update(sample_id="s1", prompt_id="p1", output_ids=[1, 2], input_ids=[3])
        store.write_chunk([row])
        store.write_chunk([dict(row, sample_id="s2")])
    finally:
        store.close()
    assert sorted(read_generations(shard_dir(mem, "generations", 1))["sample_id"].to_list()) == ["s1", "s2"]

    now = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
    samples = pl.DataFrame(
        [
            {
                "sample_id": "s1",
                "prompt_id": "p1",
                "source": "s",
                "input_ids": [1, 2],
                "loss_mask": [0, 1],
                "prompt_len": 1,
                "output_len": 1,
                "total_len": 2,
                "model_revision": "m",
                "template_hash": "t",
                "tokenizer_fingerprint": "f",
                "sampling_hash": "h",
                "endpoint": "e",
                "finish_reason": "stop",
                "generated_at": now,
                "conversation": json.dumps([{"role": "user", "content": "q"}]),
                "tools": None,
            }
        ],
        schema=pl.from_arrow(schemas.TRAINING_SAMPLES.empty_table()).schema,
    )
    write_frame_atomic(
        samples, shard_dir(mem, "training_samples", 0) / "part-0000.parquet", schema=schemas.TRAINING_SAMPLES
    )
    ok = lambda g, k: SimpleNamespace(success=True)
    snap = build_snapshot(mem, [0], ok, SnapshotContent(config={"c": 1}, exporters=EXPORTERS, now=now))
    assert isinstance(snap.path, DataPath) and snap.created and snap.rows == 1
    m = (snap.path / "manifest.json").read_json()
    for rel, info in {**m["files"], **m["exports"]}.items():
        assert sha256_of(snap.path / rel) == info["sha256"]
    assert set(m["exports"]) == {SPECFORGE_FILE, CONVERSATIONS_FILE}
    assert (mem / "snapshots" / "LATEST").read_text().strip() == snap.version
    again = build_snapshot(mem, [0], ok, SnapshotContent(config={"c": 1}, exporters=EXPORTERS, now=now))
    assert (again.version, again.created) == (snap.version, False)
    # a version folder without a manifest (a crash mid-way) is not a snapshot, and is rebuilt
    (snap.path / "manifest.json").unlink()
    assert list_snapshots(mem / "snapshots") == []
    rebuilt = build_snapshot(mem, [0], ok, SnapshotContent(config={"c": 1}, exporters=EXPORTERS, now=now))
    assert rebuilt.created and (rebuilt.path / "manifest.json").exists()
    # retention deletes whole prefixes
    # (the version is the content a trainer consumes, so each night gets different tokens)
    for i in range(3):
        night = samples.with_columns(pl.Series("input_ids", [[1, 2 + 10 + i]], dtype=samples["input_ids"].dtype))
        write_frame_atomic(
            night, shard_dir(mem, "training_samples", 0) / "part-0000.parquet", schema=schemas.TRAINING_SAMPLES
        )
        build_snapshot(
            mem,
            [0],
            ok,
            SnapshotContent(config={"c": 1}, now=now + dt.timedelta(days=i + 1)),
            policy=PublishPolicy(keep=2),
        )
    assert len(list_snapshots(mem / "snapshots")) == 2 and len((mem / "snapshots").glob("*/manifest.json")) == 2


# --------------------------------------------------------------------------------------- traversal
@pytest.mark.parametrize("part", ["..", "../x", "a/../../b", "a/..", "/etc/passwd", "a\\..\\b", "x\x00y", ""])
def test_keys_cannot_escape_the_root(mem, part):
    with pytest.raises(StorageError):
        mem.joinpath(part)
    with pytest.raises(StorageError):
        shard_dir(mem, part or "..", 0)


@pytest.mark.parametrize(
    "uri",
    [
        "memory://bucket/../etc",
        "memory://bucket/a/../../b",
        "s3://bucket/prefix/..?region=us-east-1",
        "s3://bucket/%2e%2e/x",
        "file:///tmp/../etc",
        "gs://b/a\\..\\x",
    ],
)
def test_uris_with_dotdot_are_refused(uri):
    with pytest.raises(StorageError, match=r"\.\."):
        data_root(uri)


def test_root_has_no_parent_and_cannot_be_deleted(mem):
    with pytest.raises(StorageError):
        _ = mem.parent
    with pytest.raises(StorageError):
        mem.rmtree()
    with pytest.raises(StorageError):
        mem.glob("../*")


# --------------------------------------------------------------------------------------- credentials
@pytest.mark.parametrize(
    "uri",
    [
        "s3://AKIAEXAMPLE:SuperSecret123@bucket/prefix",
        "s3://bucket/prefix?secret_key=SuperSecret123&region=us-east-1",
        "s3://bucket/prefix?access_key=AKIAEXAMPLE&region=us-east-1",
        "s3://bucket/prefix?session_token=SuperSecret123",
        "abfs://container/x?sas_token=SuperSecret123",
    ],
)
def test_credentials_in_the_uri_are_refused_without_echoing_them(uri):
    with pytest.raises(StorageError, match="credential") as e:
        data_root(uri)
    assert "SuperSecret123" not in str(e.value) and "AKIAEXAMPLE" not in str(e.value)


def test_display_strips_query_and_credentials():
    uri = "s3://bucket/prefix?endpoint_override=127.0.0.1:9000&scheme=http&region=us-east-1"
    root = data_root(uri)  # no connection is made until the data is touched
    assert str(root / "generations" / "shard=0000") == "s3://bucket/prefix/generations/shard=0000"
    assert redact_uri("s3://AK:SECRET@bucket/p?region=x&secret_key=SECRET") == "s3://bucket/p?region=x"
    assert "SECRET" not in redact_uri("gs://u:SECRET@b/p?token=SECRET")


# --------------------------------------------------------------------------------------- local, unchanged
def test_local_writes_are_atomic_and_paths_stay_paths(tmp_path):
    out = tmp_path / "data" / "generations" / "shard=0000" / "part-0000.parquet"
    ret = write_table_atomic(_table(), out)
    assert isinstance(ret, Path) and ret == out and pl.read_parquet(out).height == 5
    assert [p.name for p in out.parent.iterdir()] == ["part-0000.parquet"]  # no temp file left
    root = data_root(tmp_path / "data")
    assert root.is_local and str(root) == str((tmp_path / "data").resolve())
    assert root.joinpath("generations", "shard=0000").local_path == out.parent
    assert shard_dir(tmp_path / "data", "generations", 0) == out.parent.resolve()
    assert read_parquet_dir(root / "generations" / "shard=0000", "part-*.parquet").height == 5
    assert data_root(f"file://{tmp_path}/data") == data_root(f"file://{tmp_path}/data")
    assert data_root(f"file://{tmp_path}/data").local_path == tmp_path / "data"


def test_settings_and_resource_data_and_work_dirs(monkeypatch, tmp_path):
    monkeypatch.delenv("EAGLE3_DATA_DIR", raising=False)
    monkeypatch.delenv("EAGLE3_WORK_DIR", raising=False)
    s = settings()
    assert (
        s.storage.data_dir.is_local
        and s.storage.data_dir.local_path == PROJECT_ROOT / "data"
        and s.storage.work_dir == PROJECT_ROOT / "data"
    )
    monkeypatch.setenv("EAGLE3_DATA_DIR", str(tmp_path / "d"))
    assert settings().storage.work_dir == tmp_path / "d"
    assert pipeline_resource(settings()).gx_context_dir == tmp_path / "d" / "gx"  # GX stays where it was
    # a resource's data dir without a work dir: the work dir follows the data dir (no environment read)
    assert PipelineSettings(data_dir=str(tmp_path / "e")).gx_context_dir == tmp_path / "e" / "gx"
    monkeypatch.setenv("EAGLE3_DATA_DIR", "s3://bucket/prefix?region=us-east-1")
    assert not settings().storage.data_dir.is_local and settings().storage.work_dir == PROJECT_ROOT / ".eagle3_work"
    monkeypatch.setenv("EAGLE3_WORK_DIR", str(tmp_path / "w"))
    assert settings().storage.work_dir == tmp_path / "w"
    p = PipelineSettings(data_dir="memory://b/x", work_dir=str(tmp_path / "w2"))
    assert str(p.data_path) == "memory://b/x" and p.gx_context_dir == tmp_path / "w2" / "gx"
    # the shard lock of object-storage data is a local file under the work dir
    lock = lock_path_for(p.data_path / "generations" / "shard=0003", tmp_path / "locks")
    assert lock.parent == tmp_path / "locks" and lock.name.startswith("generations-shard=0003-")


def test_failures_leave_no_object_under_a_final_name(mem, tmp_path, monkeypatch):
    """A write that fails while serializing, or a source that fails half-way, leaves nothing behind."""
    import tempfile

    from eagle3_dagster.ingest import pipeline

    bad = pa.table({"id": ["x"], "ids": pa.array([["not-an-int"]], pa.list_(pa.string()))})
    with pytest.raises(pa.ArrowException):
        write_table_atomic(bad, mem / "t" / "part-0000.parquet", schema=_table().schema)
    assert not (mem / "t").exists()

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "spool"))
    (tmp_path / "spool").mkdir()
    src = tmp_path / "in.jsonl"
    src.write_text(
        "\n".join(json.dumps({"messages": [{"role": "user", "content": f"q{i}"}]}) for i in range(20)) + "\n"
    )
    real, calls = pipeline.build_prompt, {"n": 0}

    def dies_half_way(*a, **kw):
        calls["n"] += 1
        if calls["n"] > 10:
            raise RuntimeError("killed half-way")
        return real(*a, **kw)

    monkeypatch.setattr(pipeline, "build_prompt", dies_half_way)
    with pytest.raises(RuntimeError):
        ingest_source(SourceSpec(name="s", path=str(src)), mem / "sources" / "s", n_shards=2)
    assert not (mem / "sources").exists()  # no accepted/rejects/counts object, not even a partial one
    assert list((tmp_path / "spool").iterdir()) == []  # and the local spool files are gone
