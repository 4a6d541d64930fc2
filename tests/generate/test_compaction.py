"""Compaction of a shard's generation chunks: triggers above K chunks, reads identically before and
after (every column, same winner row per sample_id, same order), is crash-safe between the write of
the compacted chunk and the deletes (SIGKILL), leaves nothing under a final name when its write fails,
is idempotent, and works on object storage (S3, no rename)."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from gen_helpers import Sim, make_config, make_prompts

from eagle3_dagster import schemas
from eagle3_dagster.generate import generate_shard, read_generations
from eagle3_dagster.generate.store import ShardStore, chunk_files, compacted_from, stored_sample_ids

N = 40


def _row(i: int, version: int) -> dict:
    return dict(
        sample_id=f"s{i:04d}",
        prompt_id=f"p{i}",
        source="unit",
        shard=0,
        rid=f"r{i}-{version}",
        output_ids=[i, version, 7],
        text=f"t{version}",
        finish_reason="stop",
        finish_matched=None,
        prompt_tokens=3,
        completion_tokens=3,
        cached_tokens=0,
        e2e_latency=0.01 * version,
        meta_info="{}",
        endpoint="http://e",
        model_revision="m",
        template_hash="h",
        sampling_hash="s",
        integrity_violations=[] if version % 2 else ["x"],
        generated_at=dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=version),
    )


def _fill(out, n_chunks: int = 10, lock_dir: Path | None = None) -> pl.DataFrame:
    """n_chunks chunks with overlapping sample_ids (as two racing writers would leave): returns what readers see."""
    st = ShardStore(out, lock_dir=lock_dir)
    st.open()
    try:
        for k in range(n_chunks):
            st.write_chunk([_row(i, k) for i in range(k * 3, k * 3 + 5)])  # 2 ids repeated from the previous chunk
    finally:
        st.close()
    df = read_generations(out)
    assert _raw(out).height > df.height  # there are duplicates
    return df


def _raw(out) -> pl.DataFrame:
    return pl.concat([pl.read_parquet(f.read_bytes()) for f in chunk_files(out)])


def test_compaction_keeps_the_readers_winner_rows(tmp_path: Path):
    out = tmp_path / "shard=0000"
    before = _fill(out)
    st = ShardStore(out)
    st.open()
    try:
        assert st.compact(10) == 0  # not more than K chunks: nothing to do
        assert st.compact(8) == 10
        assert st.compact(8) == 0  # idempotent
    finally:
        st.close()
    (f,) = chunk_files(out)
    assert f.name.endswith(".compacted.parquet") and len(compacted_from(f)) == 10
    after = read_generations(out)
    assert after.equals(before)  # every column, same rows, same order
    assert _raw(out).equals(before)  # and no duplicate left in the file
    assert after.schema == pl.from_arrow(schemas.GENERATIONS.empty_table()).schema


_CRASH = """
import os, signal, sys
from eagle3_dagster.generate.store import ShardStore
from eagle3_dagster.storage import DataPath
deletes_before_kill = int(sys.argv[2])
real = DataPath.unlink
n = {{"n": 0}}
def unlink(self, missing_ok=True):
    if self.name.startswith("part-"):
        if n["n"] == deletes_before_kill:
            os.kill(os.getpid(), signal.SIGKILL)  # the process dies between the compacted write and a delete
        n["n"] += 1
    return real(self, missing_ok)
DataPath.unlink = unlink
st = ShardStore(sys.argv[1])
st.open()
st.compact(8)
"""


@pytest.mark.integration
@pytest.mark.parametrize("deletes_before_kill", [0, 4])
def test_sigkill_between_compacted_write_and_deletes(tmp_path: Path, deletes_before_kill: int):
    out = tmp_path / "shard=0000"
    before = _fill(out)
    names_before = {f.name for f in chunk_files(out)}
    proc = subprocess.run(
        [sys.executable, "-c", _CRASH.format(), str(out), str(deletes_before_kill)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -9, proc.stderr
    files = chunk_files(out)
    compacted = [f for f in files if f.name not in names_before]
    assert len(compacted) == 1 and len(files) == 10 - deletes_before_kill + 1  # written, old ones partly deleted
    # the crash state reads identically: no loss, no duplicate per sample_id
    assert read_generations(out).equals(before)
    assert stored_sample_ids(out).sort().equals(before.get_column("sample_id").sort())
    # the next open of the store finishes the job
    st = ShardStore(out)
    st.open()
    st.close()
    assert st.compaction_leftovers_removed == 10 - deletes_before_kill
    assert [f.name for f in chunk_files(out)] == [compacted[0].name]
    assert read_generations(out).equals(before) and _raw(out).equals(before)


def test_failed_compacted_write_leaves_nothing_under_a_final_name(tmp_path: Path, monkeypatch):
    from eagle3_dagster.generate import store

    out = tmp_path / "shard=0000"
    before = _fill(out)
    names = [f.name for f in chunk_files(out)]
    real = store.ParquetSink

    class DiskFull(real):  # the compacted chunk is streamed: the disk fills up after its first part
        def write_table(self, table):
            super().write_table(table)
            (self.tmp.parent / f".{self.target.name}.half.tmp").write_bytes(b"PAR1 half")  # what a crash leaves
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(store, "ParquetSink", DiskFull)
    st = ShardStore(out, write_retries=1)
    st.open()
    try:
        with pytest.raises(store.StoreWriteError):
            st.compact(8)
    finally:
        st.close()
    assert [f.name for f in chunk_files(out)] == names
    assert read_generations(out).equals(before)
    monkeypatch.setattr(store, "ParquetSink", real)
    st.open()  # the next open removes the temp file; a later compaction succeeds
    try:
        assert not list(out.glob(".*.tmp"))
        assert st.compact(8) == 10
    finally:
        st.close()
    assert read_generations(out).equals(before)


@pytest.mark.integration
def test_compaction_on_object_storage(tmp_path: Path, monkeypatch):
    from s3_moto import moto_s3_server, s3_uri, set_aws_env

    from eagle3_dagster.storage import data_root

    secret = "compaction-moto-secret"
    with moto_s3_server(("gens",), secret) as (port, client):
        set_aws_env(monkeypatch, secret)
        out = data_root(s3_uri("gens", "data", port)) / "generations" / "shard=0000"
        lock_dir = tmp_path / "locks"
        before = _fill(out, lock_dir=lock_dir)
        st = ShardStore(out, lock_dir=lock_dir)
        st.open()
        try:
            assert st.compact(8) == 10
        finally:
            st.close()
        (f,) = chunk_files(out)
        assert f.name.endswith(".compacted.parquet")
        assert read_generations(out).equals(before) and _raw(out).equals(before)
        # more chunks, then a compaction that dies after the PUT of its object, before any delete
        for k in range(9):
            st = ShardStore(out, lock_dir=lock_dir)
            st.open()
            st.write_chunk([_row(i, 20 + k) for i in (0, 100 + k)])  # s0000 again: the old row must stay the winner
            st.close()
        before = read_generations(out)
        assert before.height == 32 + 9 and before.filter(pl.col("sample_id") == "s0000")["rid"].to_list() == ["r0-0"]

        class Crash(BaseException):
            pass

        def crash(self, files):
            raise Crash()

        monkeypatch.setattr(ShardStore, "_delete_chunks", crash)
        st = ShardStore(out, lock_dir=lock_dir)
        st.open()
        with pytest.raises(Crash):
            st.compact(8)
        st.close()
        monkeypatch.undo()
        set_aws_env(monkeypatch, secret)
        assert len(chunk_files(out)) == 11 and read_generations(out).equals(before)
        st = ShardStore(out, lock_dir=lock_dir)
        st.open()  # finishes the job
        st.close()
        assert st.compaction_leftovers_removed == 10 and len(chunk_files(out)) == 1
        assert read_generations(out).equals(before) and _raw(out).equals(before)
        # (pyarrow leaves an empty "shard=0000/" folder marker when it deletes the last object of a prefix)
        keys = [o["Key"] for o in client.list_objects_v2(Bucket="gens")["Contents"] if not o["Key"].endswith("/")]
        assert len(keys) == 1 and keys[0].endswith(".compacted.parquet")


# -- through generate_shard, against the simulator -------------------------------------------------


@pytest.fixture(scope="module")
def prompts() -> pl.DataFrame:
    return make_prompts(N, seed=33)


def test_generate_shard_compacts_and_reruns_idempotently(clean_sim: Sim, prompts, tmp_path: Path):
    out = tmp_path / "shard=0000"
    # ~20 chunks, no compaction yet: the reference, every column
    rep = generate_shard(
        prompts, out, make_config(clean_sim.url, flush_every_n=2, flush_every_s=60, compact_after_chunks=None)
    )
    assert rep.succeeded == N and rep.chunks_written == len(chunk_files(out)) >= 9 and rep.chunks_compacted == 0
    before = read_generations(out)
    # a rerun with compaction on: nothing to generate, the chunks are merged at the end
    requests = clean_sim.stats()["requests"]
    rep = generate_shard(prompts, out, make_config(clean_sim.url, compact_after_chunks=8))
    assert clean_sim.stats()["requests"] == requests
    assert rep.skipped_cached == N and rep.chunks_compacted >= 9 and rep.compaction_error is None
    assert rep.as_metadata()["chunks_compacted"] == rep.chunks_compacted
    assert len(chunk_files(out)) == 1
    assert read_generations(out).equals(before)
    # idempotent: once more, nothing generated, nothing compacted, same data
    rep = generate_shard(prompts, out, make_config(clean_sim.url, compact_after_chunks=8))
    assert (rep.skipped_cached, rep.succeeded, rep.chunks_compacted, rep.compaction_leftovers_removed) == (N, 0, 0, 0)
    assert read_generations(out).equals(before)
    # new prompts add chunks after the compacted one; the compacted rows still win
    more = pl.concat([prompts, make_prompts(12, seed=34)])
    rep = generate_shard(
        more, out, make_config(clean_sim.url, flush_every_n=4, max_in_flight=2, compact_after_chunks=8)
    )
    assert rep.succeeded == 12 and rep.chunks_compacted == 0 and len(chunk_files(out)) == 1 + rep.chunks_written > 2
    got = read_generations(out)
    assert got.head(N).equals(before) and got.height == N + 12


def test_generate_shard_reports_a_failed_compaction_and_keeps_the_data(
    clean_sim: Sim, prompts, tmp_path: Path, monkeypatch
):
    from eagle3_dagster.generate import store

    out = tmp_path / "shard=0000"
    real = store.ParquetSink

    class NoCompacted(real):  # the compacted chunk (streamed through a ParquetSink) finds the disk full
        def write_table(self, table):
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(store, "ParquetSink", NoCompacted)
    rep = generate_shard(prompts, out, make_config(clean_sim.url, flush_every_n=2, flush_every_s=60, write_retries=0))
    assert rep.succeeded == N and rep.chunks_compacted == 0
    assert rep.compaction_error and "No space left" in rep.compaction_error
    files = chunk_files(out)
    assert len(files) == rep.chunks_written and not any(".compacted." in f.name for f in files)
    before = read_generations(out)
    assert before.height == N
    monkeypatch.setattr(store, "ParquetSink", real)
    rep = generate_shard(prompts, out, make_config(clean_sim.url))
    assert rep.chunks_compacted == len(files) and rep.compaction_error is None
    assert read_generations(out).equals(before)


def test_sigkill_mid_compaction_then_generate_shard_finishes_it(clean_sim: Sim, prompts, tmp_path: Path):
    out = tmp_path / "shard=0000"
    generate_shard(
        prompts, out, make_config(clean_sim.url, flush_every_n=2, flush_every_s=60, compact_after_chunks=None)
    )
    before = read_generations(out)
    n_chunks = len(chunk_files(out))
    proc = subprocess.run(
        [sys.executable, "-c", _CRASH.format(), str(out), "2"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == -9, proc.stderr
    assert read_generations(out).equals(before)
    requests = clean_sim.stats()["requests"]
    rep = generate_shard(prompts, out, make_config(clean_sim.url))
    assert clean_sim.stats()["requests"] == requests and rep.skipped_cached == N  # no duplicate, no loss
    assert rep.compaction_leftovers_removed == n_chunks - 2 and rep.chunks_compacted == 0
    assert len(chunk_files(out)) == 1 and read_generations(out).equals(before)
    assert os.listdir(out).count(".lock") <= 1
