"""The whole graph with its data in S3: a real moto S3 server over HTTP, configured by environment only.

EAGLE3_DATA_DIR=s3://bucket/prefix?endpoint_override=127.0.0.1:<port>&scheme=http&region=us-east-1 and the
standard AWS_* variables; no code path is told it is a test. Ingest -> prompts -> one shard's
tokenized_prompts/generations/training_samples -> training_dataset snapshot + exports, through Dagster,
against the simulator. Then: the objects are in the bucket with the local layout, hold the same rows
and output_ids as a local run, no temporary objects or unfinished uploads remain, every manifest
sha256 matches the bytes in the bucket, no local table folder was created, the AWS secret is nowhere
in the run records, a rerun sends no request (resume works from the bucket listing), and
`eagle3 inspect` reads the shard from S3.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import time
from pathlib import Path

import dagster as dg
import httpx
import polars as pl
import pytest
from graph_helpers import graph_resources, shard_with_most_prompts
from s3_moto import moto_s3_server, set_aws_env

from eagle3_dagster.config import PROJECT_ROOT, settings
from eagle3_dagster.definitions import defs
from eagle3_dagster.orchestration.resources import SGLangFleet, pipeline_resource
from eagle3_dagster.orchestration.run import GraphScope, materialize_graph
from eagle3_dagster.sim.process import start_simulator

pytestmark = pytest.mark.integration

BUCKET, PREFIX = "eagle3-data", "team/run1"
SECRET = "eagle3-moto-secret-7f3c9a"  # moto accepts any credentials; this one must never be recorded
TIMESTAMPS = ("generated_at", "created_at", "tokenized_at")
TOOL_CACHES = {".pytest_cache", ".mypy_cache"}  # written by `make test` around the tests


@pytest.fixture(scope="module")
def moto_s3():
    """A moto S3 server subprocess on 127.0.0.1 (a free port), with one bucket; stopped at the end."""
    with moto_s3_server((BUCKET,), SECRET) as (port, client):
        yield port, client


def _keys(client, prefix: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        for o in page.get("Contents", []):
            out[o["Key"][len(prefix) :]] = o["Size"]
    return out


def _get(client, key: str) -> bytes:
    return client.get_object(Bucket=BUCKET, Key=f"{PREFIX}/{key}")["Body"].read()


def _normalize(rel: str) -> str:
    """Names that hold a time or a random id in both layouts: chunk files, gate rejects, snapshot version."""
    rel = re.sub(r"part-\d{20}-[0-9a-f]{8}\.parquet", "part-<chunk>.parquet", rel)
    rel = re.sub(r"\.[0-9a-f]{12}\.rejects\.parquet$", ".<id>.rejects.parquet", rel)
    return re.sub(r"^snapshots/[0-9a-f]{16}/", "snapshots/<version>/", rel)


def _frame(data: bytes | Path | list) -> pl.DataFrame:
    if isinstance(data, list):
        return pl.concat([_frame(d) for d in data]) if data else pl.DataFrame()
    return pl.read_parquet(io.BytesIO(data) if isinstance(data, bytes) else data)


def _comparable(df: pl.DataFrame, key: str) -> pl.DataFrame:
    return df.drop([c for c in df.columns if c in TIMESTAMPS]).sort(key)


def _requests(url: str) -> int:
    return httpx.get(f"{url}/_sim/stats", timeout=10).json()["requests"]


@pytest.mark.full  # the whole graph on S3, another deployment: `make test-full`
def test_whole_graph_on_s3_matches_a_local_run(moto_s3, tmp_path, kimi_profile, monkeypatch, capsys):
    port, client = moto_s3
    uri = f"s3://{BUCKET}/{PREFIX}?endpoint_override=127.0.0.1:{port}&scheme=http&region=us-east-1"
    set_aws_env(monkeypatch, SECRET)
    local = tmp_path / "local_data"
    work = tmp_path / "work"
    cwd_before = set(os.listdir(Path.cwd()))
    root_before = set(os.listdir(PROJECT_ROOT))

    with start_simulator() as sim:
        # 1. the reference: the same graph with a local data dir (the default kind)
        res_local = graph_resources(local, kimi_profile.tokenizer, sim.url)
        with dg.instance_for_test() as instance:
            assert materialize_graph(defs, instance, scope=GraphScope(shards=[]), resources=res_local).ingest_success
            shard = shard_with_most_prompts(local)
            out = materialize_graph(
                defs,
                instance,
                scope=GraphScope(shards=[shard], run_ingest=False, run_publish=True, allow_partial=True),
                resources=res_local,
            )
            assert out.success, out
        sent_local = _requests(sim.url)

        # 2. the same graph with the data dir set by environment alone (EAGLE3_DATA_DIR / EAGLE3_WORK_DIR)
        monkeypatch.setenv("EAGLE3_DATA_DIR", uri)
        monkeypatch.setenv("EAGLE3_WORK_DIR", str(work))
        res_s3 = {
            "pipeline": pipeline_resource(settings(), tokenizer=kimi_profile.tokenizer, max_new_tokens=2048),
            "sglang": SGLangFleet(urls=sim.url),
        }
        with dg.instance_for_test() as instance:
            t0 = time.monotonic()
            assert materialize_graph(defs, instance, scope=GraphScope(shards=[]), resources=res_s3).ingest_success
            s3 = materialize_graph(
                defs,
                instance,
                scope=GraphScope(shards=[shard], run_ingest=False, run_publish=True, allow_partial=True),
                resources=res_s3,
            )
            elapsed = time.monotonic() - t0
            assert s3.success, s3
            sh = s3.shards[0]
            assert (
                sh.checks["tokenized_prompts:thinking_token_ends_prompt"] and sh.checks["generations:think_end_present"]
            )
            assert sh.materialized == ["generations", "tokenized_prompts", "training_samples"]
            sent_s3 = _requests(sim.url) - sent_local
            assert sent_s3 == sent_local > 0  # the S3 run generated every sample itself

            # metadata shows where the data is, without the endpoint query or any credential
            meta = instance.get_latest_materialization_event(dg.AssetKey("generations")).asset_materialization.metadata
            assert meta["path"].value == f"s3://{BUCKET}/{PREFIX}/generations/shard={shard}"
            records = json.dumps(
                [
                    str(r.event_log_entry)
                    for r in instance.get_event_records(
                        dg.EventRecordsFilter(event_type=dg.DagsterEventType.ASSET_MATERIALIZATION)
                    )
                ]
                + [str(r) for r in instance.get_runs()]
            )
            assert SECRET not in records and "endpoint_override" not in records

            # 3. a rerun of the shard resumes from the bucket: nothing is regenerated
            again = materialize_graph(
                defs, instance, scope=GraphScope(shards=[shard], run_ingest=False), resources=res_s3
            )
            assert again.success and _requests(sim.url) - sent_local == sent_s3

    # ---- the bucket holds the local layout, object for object
    all_keys = _keys(client, f"{PREFIX}/")
    # Arrow's S3 filesystem re-creates a zero-byte "folder/" marker when it deletes an object (here: a
    # superseded gate-rejects file); markers are not data and every reader skips them.
    markers = {k for k in all_keys if k.endswith("/")}
    assert all(all_keys[k] == 0 for k in markers) and markers <= {
        "gates/prompts/",
        "gates/generations/",
        "gates/training_samples/",
    }
    s3_keys = {k: v for k, v in all_keys.items() if k not in markers}
    local_files = {str(f.relative_to(local)) for f in local.rglob("*") if f.is_file()}
    # gx/ and reports/ (the offline quality report) belong to the work dir, which is the data dir when local;
    # so do the lock files (shard .lock, snapshots/.publish.lock): on object storage they are local files
    local_tables = {k for k in local_files if not k.startswith(("gx/", "reports/")) and not k.endswith(".lock")}
    assert {_normalize(k) for k in s3_keys} == {_normalize(k) for k in local_tables}, sorted(
        set(map(_normalize, s3_keys)) ^ set(map(_normalize, local_tables))
    )
    # nothing temporary, no staging, no lock, no GX context, no unfinished multipart upload
    assert not [k for k in s3_keys if k.endswith(".tmp") or "staging" in k or "/." in f"/{k}" or k.startswith("gx/")]
    assert not client.list_multipart_uploads(Bucket=BUCKET).get("Uploads")
    assert all(size > 0 for size in s3_keys.values()), "no empty objects"

    # ---- same rows and output ids as the local run
    g = f"generations/shard={shard}"
    s3_gens = _frame([_get(client, k) for k in sorted(s3_keys) if k.startswith(f"{g}/part-")])
    loc_gens = _frame(sorted((local / g).glob("part-*.parquet")))
    assert s3_gens.height == loc_gens.height > 0
    assert dict(zip(s3_gens["sample_id"], s3_gens["output_ids"].to_list())) == dict(
        zip(loc_gens["sample_id"], loc_gens["output_ids"].to_list())
    )
    for rel, key in [
        ("prompts/prompts.parquet", "prompt_id"),
        (f"tokenized_prompts/shard={shard}/part-0000.parquet", "prompt_id"),
        (f"training_samples/shard={shard}/part-0000.parquet", "sample_id"),
    ]:
        a, b = _frame(_get(client, rel)), _frame(local / rel)
        assert a.height == b.height > 0
        assert _comparable(a, key).equals(_comparable(b, key)), rel
    train = _frame(_get(client, f"training_samples/shard={shard}/part-0000.parquet"))
    assert train.height == s3_gens.height

    # ---- the snapshot: manifest sha256 of every file matches the bytes in the bucket; LATEST names it
    version = _get(client, "snapshots/LATEST").decode().strip()
    assert version == s3.snapshot_version
    manifest = json.loads(_get(client, f"snapshots/{version}/manifest.json"))
    local_manifest = json.loads((local / "snapshots" / out.snapshot_version / "manifest.json").read_text())
    assert manifest["rows"] == local_manifest["rows"] == train.height
    checked = 0
    for rel, info in {**manifest["files"], **manifest["exports"]}.items():
        assert hashlib.sha256(_get(client, f"snapshots/{version}/{rel}")).hexdigest() == info["sha256"], rel
        checked += 1
    assert checked == len(manifest["files"]) + 3  # specforge_prompts, specforge_preformatted, conversations
    assert (
        manifest["exports"]["exports/specforge_preformatted.jsonl"]["rows"]
        == local_manifest["exports"]["exports/specforge_preformatted.jsonl"]["rows"]
        > 0
    )
    lines = _get(client, f"snapshots/{version}/exports/specforge_prompts.jsonl").decode().splitlines()
    assert len(lines) == train.height and json.loads(lines[0]).keys() == {"id", "input_ids", "loss_mask"}
    assert (
        lines
        == (local / "snapshots" / out.snapshot_version / "exports" / "specforge_prompts.jsonl").read_text().splitlines()
    )

    # ---- no local data folder for the tables: the work dir holds only the GX context, the shard lock and
    # the offline quality report, which names the bucket without the endpoint query or any credential
    assert set(os.listdir(work)) <= {"gx", "locks", "reports"}
    report = (work / "reports" / "index.html").read_text()
    assert f"s3://{BUCKET}/{PREFIX}" in report and SECRET not in report and "endpoint_override" not in report
    assert f'id="shard-{shard}"' in report and "all gates passed" in report
    assert not [f for f in work.rglob("*") if f.suffix in (".parquet", ".jsonl") or f.name in ("counts.json", "LATEST")]
    # (the tool caches are not ours: `make test` writes them into the same folder meanwhile, pytest's when the
    # other lane's session ends and mypy's from beside the lanes)
    new_in_cwd = set(os.listdir(Path.cwd())) - cwd_before - TOOL_CACHES
    assert new_in_cwd <= {".eagle3_work"} and "s3:" not in os.listdir(Path.cwd())
    assert set(os.listdir(PROJECT_ROOT)) - root_before - TOOL_CACHES == set()

    # ---- `eagle3 inspect` reads the shard straight from S3 (EAGLE3_DATA_DIR is still the URI)
    from eagle3_dagster.app.cli import main as eagle3

    capsys.readouterr()
    assert eagle3(["inspect", "--shard", str(int(shard)), "-n", "1"]) == 0
    printed = capsys.readouterr().out
    assert "163607" in printed and "Stored gate result" in printed and SECRET not in printed
    print(
        f"\n[object storage] {len(s3_keys)} objects under s3://{BUCKET}/{PREFIX}/, {s3_gens.height} generations and "
        f"{train.height} training rows identical to the local run, {checked} manifest sha256 verified, "
        f"{sent_s3} requests, S3 graph {elapsed:.1f}s"
    )
