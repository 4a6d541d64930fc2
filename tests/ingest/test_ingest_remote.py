"""Prompt sources named by a URI (eagle3_dagster/ingest/remote.py).

On `memory://` (fsspec): every shared dataset and every file of the bad-input corpus, plain and
gzip-compressed, gives the same counts, accepted rows and reject rows as the same bytes read from
local disk (only `source_file` differs: it is the URI); globs (`*`, `[..]`, `**`, hidden names) pick
the same files in the same order as a local glob; a missing file and an empty glob fail like the
local case, naming the source and the pattern; URIs with credentials are refused at load; the
source sensor notices new/changed remote files. Against a real S3 server (moto_server): source
YAMLs pointing at s3:// files materialize through Dagster with the same counts and prompts as the
same files on local disk, and no endpoint option or secret reaches the run records.
"""

from __future__ import annotations

import gzip
import json
import shutil
import uuid
from pathlib import Path
from typing import Any

import dagster as dg
import fsspec
import pyarrow.parquet as pq
import pytest
from s3_moto import moto_s3_server, s3_uri, set_aws_env

from eagle3_dagster.config import PROJECT_ROOT, settings
from eagle3_dagster.ingest import IngestFileError, SourceSpec, SourceSpecError, ingest_source, load_source_specs
from eagle3_dagster.storage import DataPath

BAD_DIR = Path(__file__).resolve().parent.parent / "data" / "bad"
EXAMPLES = PROJECT_ROOT / "examples" / "shared-sources"
MEM = fsspec.filesystem("memory")


@pytest.fixture
def mem_root():
    """A fresh memory:// folder for one test; removed afterwards (the memory filesystem is process-wide)."""
    name = f"eagle3-test-{uuid.uuid4().hex[:12]}"
    yield name
    if MEM.exists(f"/{name}"):
        MEM.rm(f"/{name}", recursive=True)


def _put(root: str, rel: str, data: bytes) -> str:
    MEM.pipe(f"/{root}/{rel}", data)
    return f"memory://{root}/{rel}"


def _rows(path: Path) -> list[dict[str, Any]]:
    return pq.read_table(path).to_pylist()


def _assert_same_outputs(local_out: Path, remote_out: Path, file_map: dict[str, str]) -> None:
    """accepted/rejects/counts equal, with the remote source_file mapped to the local one."""
    for name in ("accepted.parquet", "rejects.parquet"):
        loc, rem = _rows(local_out / name), _rows(remote_out / name)
        assert len(loc) == len(rem), name
        for a, b in zip(loc, rem):
            assert b["source_file"] in file_map, b["source_file"]
            assert {**b, "source_file": file_map[b["source_file"]]} == a
    assert json.loads((local_out / "counts.json").read_text()) == json.loads((remote_out / "counts.json").read_text())


def _pair(tmp_path: Path, local_path: str, remote_path: str, **opts: Any) -> tuple[Any, Any]:
    tag = uuid.uuid4().hex[:8]
    local = ingest_source(SourceSpec(name="s", path=local_path, **opts), tmp_path / f"local-{tag}", n_shards=4)
    remote = ingest_source(SourceSpec(name="s", path=remote_path, **opts), tmp_path / f"remote-{tag}", n_shards=4)
    return (local, tmp_path / f"local-{tag}"), (remote, tmp_path / f"remote-{tag}")


# ------------------------------------------------------------------------------ every format, plain and gzip


@pytest.mark.parametrize("spec", load_source_specs(EXAMPLES), ids=lambda s: s.name)
def test_shared_dataset_reads_the_same_from_memory_uri_as_locally(
    spec: SourceSpec, mem_root: str, tmp_path: Path
) -> None:
    (local_file,) = spec.files()
    data = local_file.read_bytes()
    variants = {"plain": (str(local_file), data, local_file.name)}
    if not data.startswith(b"PAR1"):
        gz_local = tmp_path / f"{local_file.name}.gz"
        gz_local.write_bytes(gzip.compress(data))
        variants["gzip"] = (str(gz_local), gz_local.read_bytes(), gz_local.name)
    for kind, (local_path, payload, name) in variants.items():
        uri = _put(mem_root, f"{spec.name}/{name}", payload)
        opts = {"format": spec.format, "max_bytes": spec.max_bytes}
        (lc, lout), (rc, rout) = _pair(tmp_path, local_path, uri, **opts)
        assert rc.read > 0 and rc.read == rc.accepted + rc.rejected + rc.duplicates, (kind, rc)
        assert rc == lc, (kind, rc, lc)
        _assert_same_outputs(lout, rout, {uri: local_path})
        assert {r["source_file"] for r in _rows(rout / "accepted.parquet")} == {uri}


def _bad_opts(name: str) -> dict[str, Any]:
    from test_ingest_bad_inputs import SPEC_OPTIONS

    return SPEC_OPTIONS.get(name, {})


def test_bad_input_corpus_gives_the_same_rejects_from_memory_uri(mem_root: str, tmp_path: Path) -> None:
    """Every reject reason of the corpus, plain and gzip: identical rows, reasons, details and excerpts."""
    files = sorted(
        p
        for p in BAD_DIR.iterdir()
        if p.suffix in (".json", ".jsonl", ".parquet") and p.name != "parquet_corrupt.parquet"
    )
    assert len(files) >= 40
    reasons: set[str] = set()
    compared = 0
    for f in files:
        data = f.read_bytes()
        variants = [(str(f), data, f.name)]
        if f.suffix != ".parquet":
            gz = tmp_path / "gz" / f"{f.name}.gz"
            gz.parent.mkdir(exist_ok=True)
            gz.write_bytes(gzip.compress(data))
            variants.append((str(gz), gz.read_bytes(), gz.name))
        for local_path, payload, name in variants:
            uri = _put(mem_root, f"bad/{name}", payload)
            (lc, lout), (rc, rout) = _pair(tmp_path, local_path, uri, **_bad_opts(f.name))
            assert rc == lc and rc.reconciles(), (name, rc, lc)
            _assert_same_outputs(lout, rout, {uri: local_path})
            reasons.update(rc.rejects_by_reason)
            compared += 1
    assert compared >= 80 and len(reasons) >= 15, (compared, sorted(reasons))


def test_corrupt_remote_parquet_is_a_file_level_error_naming_the_uri(mem_root: str, tmp_path: Path) -> None:
    uri = _put(mem_root, "x/parquet_corrupt.parquet", (BAD_DIR / "parquet_corrupt.parquet").read_bytes())
    with pytest.raises(IngestFileError, match=rf"^{uri}: not a readable Parquet file"):
        ingest_source(SourceSpec(name="bad", path=uri), tmp_path / "out", n_shards=2)
    assert not (tmp_path / "out" / "accepted.parquet").exists()


def test_remote_jsonl_is_streamed_not_downloaded(mem_root: str, tmp_path: Path, monkeypatch) -> None:
    """A 10 MB JSON Lines file (plain and gzip) is read in bounded chunks, each byte about once."""
    from eagle3_dagster.ingest import remote

    sizes: list[int] = []
    real = remote._ArrowRaw.readinto

    def counting(self, b):
        n = real(self, b)
        sizes.append(n)
        return n

    monkeypatch.setattr(remote._ArrowRaw, "readinto", counting)
    body = b"".join(json.dumps({"question": f"{i}: " + "x" * 2000}).encode() + b"\n" for i in range(5000))
    for name, payload in (("big.jsonl", body), ("big.jsonl.gz", gzip.compress(body, compresslevel=1))):
        sizes.clear()
        uri = _put(mem_root, f"big/{name}", payload)
        counts = ingest_source(SourceSpec(name="big", path=uri, format="question"), tmp_path / name, n_shards=2)
        assert counts.accepted == 5000
        assert max(sizes) <= remote._REMOTE_BUFFER < len(body)
        # the sniff reads one buffer, the records pass reads the file once
        assert sum(sizes) <= len(payload) + remote._REMOTE_BUFFER, (name, sum(sizes), len(payload))


@pytest.mark.parametrize("name", ["plain.jsonl.gz", "plain.jsonl.bz2", "plain.jsonl.zst", "gzipped.txt"])
def test_content_not_the_file_name_decides_compression(name: str, mem_root: str, tmp_path: Path) -> None:
    """As locally: gzip is detected by its magic bytes; an extension alone changes nothing."""
    body = b'{"question": "one"}\n{"question": "two"}\n'
    payload = gzip.compress(body) if name == "gzipped.txt" else body
    local = tmp_path / name
    local.write_bytes(payload)
    uri = _put(mem_root, f"names/{name}", payload)
    (lc, lout), (rc, rout) = _pair(tmp_path, str(local), uri, format="question")
    assert rc == lc and rc.accepted == 2
    _assert_same_outputs(lout, rout, {uri: str(local)})


# ------------------------------------------------------------------------------ globs


def _layout() -> dict[str, bytes]:
    row = lambda text: json.dumps({"messages": [{"role": "user", "content": text}]}).encode() + b"\n"
    pretty = json.dumps({"messages": [{"role": "user", "content": "pretty document"}]}, indent=2).encode()
    return {
        "p/part-1.jsonl": row("one") + row("two"),
        "p/part-2.jsonl.gz": gzip.compress(row("three") + row("one")),
        "p/part-x.jsonl": row("x"),
        "p/.hidden.jsonl": row("hidden"),
        "p/doc.json": pretty,
        "p/sub/part-3.jsonl": row("four"),
        "p/sub/deeper/part-4.jsonl": row("five"),
        "p/.cache/part-5.jsonl": row("in a hidden folder"),
        "q/part-6.jsonl": row("six"),
    }


@pytest.mark.parametrize(
    "pattern",
    [
        "p/*.jsonl*",
        "p/part-[0-9].jsonl*",
        "p/**/*.jsonl",
        "p/**",
        "*/part-*.jsonl",
        "p/sub/*/*.jsonl",
        "p/.hidden.jsonl",
        "p/.*.jsonl",
        "p/*.json",
        "**/part-[2-6]*",
    ],
)
def test_remote_glob_matches_the_local_glob(pattern: str, mem_root: str, tmp_path: Path) -> None:
    local_root = tmp_path / "src"
    for rel, data in _layout().items():
        (local_root / rel).parent.mkdir(parents=True, exist_ok=True)
        (local_root / rel).write_bytes(data)
        _put(mem_root, rel, data)
    local = SourceSpec(name="g", path=f"{local_root}/{pattern}").files()
    remote = SourceSpec(name="g", path=f"memory://{mem_root}/{pattern}").files()
    assert local, pattern
    assert all(isinstance(f, DataPath) for f in remote)
    assert [str(f) for f in remote] == [f"memory://{mem_root}/{p.relative_to(local_root).as_posix()}" for p in local]
    (lc, lout), (rc, rout) = _pair(
        tmp_path, f"{local_root}/{pattern}", f"memory://{mem_root}/{pattern}", format="openai"
    )
    assert rc == lc and rc.read == rc.accepted + rc.rejected + rc.duplicates
    _assert_same_outputs(lout, rout, {str(r): str(lf) for r, lf in zip(remote, local)})


def test_remote_glob_is_sorted_and_file_uri_reads_locally(mem_root: str, tmp_path: Path) -> None:
    for i in (10, 2, 1, 33):
        _put(mem_root, f"s/{i:02d}.jsonl", b'{"question": "q%d"}\n' % i)
    files = SourceSpec(name="s", path=f"memory://{mem_root}/s/*.jsonl").files()
    assert [f.name for f in files] == ["01.jsonl", "02.jsonl", "10.jsonl", "33.jsonl"]
    local = tmp_path / "a b"
    local.mkdir()
    (local / "x.jsonl").write_text('{"question": "q"}\n')
    (f,) = SourceSpec(name="s", path=f"file://{local.as_posix().replace(' ', '%20')}/*.jsonl").files()
    assert f == local / "x.jsonl"  # a file:// URI is the local path, read as before


def test_cli_takes_a_source_uri(mem_root: str, datasets_dir: Path, tmp_path: Path, capsys) -> None:
    from eagle3_dagster.app.cli import main

    data = (datasets_dir / "gsm8k_test" / "test.jsonl").read_bytes()
    uri = _put(mem_root, "cli/gsm8k.jsonl.gz", gzip.compress(data))
    assert (
        main(
            [
                "ingest",
                f"memory://{mem_root}/cli/*.jsonl.gz",
                "--format",
                "question",
                "--name",
                "gsm8k",
                "--out",
                str(tmp_path),
                "--n-shards",
                "2",
            ]
        )
        == 0
    )
    counts = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert counts["read"] == 1319 == counts["accepted"] + counts["rejected"] + counts["duplicates"]
    rows = _rows(tmp_path / "accepted.parquet")
    assert {(r["source"], r["source_file"]) for r in rows} == {("gsm8k", uri)}
    # without --name the name comes from the file name of the URI (no query)
    assert (
        main(
            ["ingest", f"memory://{mem_root}/cli/gsm8k.jsonl.gz", "--format", "question", "--out", str(tmp_path / "n")]
        )
        == 0
    )
    assert {r["source"] for r in _rows(tmp_path / "n" / "accepted.parquet")} == {"gsm8k"}
    assert main(["ingest", f"memory://{mem_root}/cli/*.parquet", "--name", "p", "--out", str(tmp_path / "x")]) == 2
    assert "no file matches" in capsys.readouterr().err


# ------------------------------------------------------------------------------ errors


def test_missing_remote_file_and_empty_glob_fail_like_local(mem_root: str, tmp_path: Path) -> None:
    _put(mem_root, "d/one.jsonl", b'{"question": "q"}\n')
    cases = [
        (f"memory://{mem_root}/d/nope.jsonl", rf"^source 'src': file not found: memory://{mem_root}/d/nope\.jsonl$"),
        (
            f"memory://{mem_root}/d/*.parquet",
            rf"^source 'src': no file matches 'memory://{mem_root}/d/\*\.parquet' \(pattern memory://{mem_root}/d/\*\.parquet\)$",
        ),
        (f"memory://{mem_root}/missing-folder/**/*.jsonl", r"^source 'src': no file matches .*missing-folder"),
        (f"memory://{mem_root}/d", rf"^source 'src': memory://{mem_root}/d is a directory; give a file or a glob$"),
    ]
    for uri, message in cases:
        with pytest.raises(IngestFileError, match=message):
            ingest_source(SourceSpec(name="src", path=uri), tmp_path / "out", n_shards=2)
    assert not (tmp_path / "out").exists()
    # the local messages have the same shape
    with pytest.raises(IngestFileError, match=r"^source 'src': file not found: .*nope\.jsonl$"):
        SourceSpec(name="src", path=str(tmp_path / "nope.jsonl")).files()
    with pytest.raises(
        IngestFileError, match=r"^source 'src': no file matches '.*\*\.parquet' \(pattern .*\*\.parquet\)$"
    ):
        SourceSpec(name="src", path=str(tmp_path / "*.parquet")).files()


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("s3://user:pw@bucket/x.jsonl", r"credentials in the data URI are refused"),
        (
            "s3://bucket/x.jsonl?region=us-east-1&secret_access_key=abc",
            r"query parameter 'secret_access_key' looks like a credential",
        ),
        ("s3://bucket/x.jsonl?session_token=abc", r"looks like a credential"),
        ("s3://bucket/../x.jsonl", r"'\.\.'"),
        ("s3://bucket-*/x.jsonl", r"a glob in the bucket or host name"),
        ("s3://bucket", r"names a bucket or host, not a file"),
        ("file://otherhost/x.jsonl", r"file:// URIs must be local"),
        ("nosuchscheme://b/x.jsonl", r"unknown URI scheme 'nosuchscheme'"),
    ],
)
def test_bad_source_uris_are_refused_when_the_yaml_loads(path: str, message: str, tmp_path: Path) -> None:
    (tmp_path / "src.yaml").write_text(f"path: '{path}'\n")
    with pytest.raises(SourceSpecError, match=message) as e:
        load_source_specs(tmp_path)
    assert "abc" not in str(e.value) and "pw" not in str(e.value)


# ------------------------------------------------------------------------------ the source sensor


def test_source_sensor_notices_new_and_changed_remote_files(mem_root: str, tmp_path: Path, monkeypatch) -> None:
    from eagle3_dagster.defs import automation
    from eagle3_dagster.ingest import remote

    assets = tmp_path / "assets"
    shutil.copytree(PROJECT_ROOT / "assets", assets)
    monkeypatch.setenv("EAGLE3_ASSETS_DIR", str(assets))
    _put(mem_root, "r/a.jsonl", b'{"question": "a"}\n')
    (assets / "sources" / "remote.yaml").write_text(f"path: memory://{mem_root}/r/*.jsonl\nformat: question\n")

    def tick(cursor):
        ctx = dg.build_sensor_context(cursor=cursor)
        sensor = automation.build_prompt_source_sensor(
            settings().storage.sources_dir, settings().shards.sensor_interval_s
        )
        return sensor(ctx), ctx.cursor

    first, cur = tick(None)
    assert isinstance(first, dg.RunRequest)
    assert isinstance(tick(cur)[0], dg.SkipReason)
    _put(mem_root, "r/b.jsonl", b'{"question": "b"}\n')  # a new remote file
    second, cur = tick(cur)
    assert isinstance(second, dg.RunRequest) and second.run_key != first.run_key
    assert isinstance(tick(cur)[0], dg.SkipReason)
    _put(mem_root, "r/b.jsonl", b'{"question": "c"}\n')  # rewritten, same size: the store's version changed
    third, cur = tick(cur)
    assert isinstance(third, dg.RunRequest)
    _put(mem_root, "r/ignored.txt", b"not matched")  # outside the glob: no change
    assert isinstance(tick(cur)[0], dg.SkipReason)

    def unreachable(*a, **k):
        raise OSError("connection refused")

    monkeypatch.setattr(remote, "list_remote", unreachable)
    skipped, after = tick(cur)
    assert isinstance(skipped, dg.SkipReason) and "will retry" in skipped.skip_message and after == cur


# ------------------------------------------------------------------------------ a real S3 server, through Dagster

BUCKET = "eagle3-prompts"
SECRET = "eagle3-moto-prompts-secret-41d2"
DATASETS = {  # key under prompts/ -> (shared file, gzip it)
    "sharegpt/numina.jsonl.gz": ("numina_cot_sharegpt/numina_cot_sharegpt_data_1k.jsonl", True),
    "sharegpt/dummy.json": ("sharegpt_fastchat_dummy/dummy_conversation.json", False),
    "sharegpt/v3.json.gz": ("sharegpt_v3_test/sharegpt_test.json", True),
    "parquet/no_robots.parquet": ("no_robots_test_parquet/test_sft-00000-of-00001.parquet", False),
    "tools/2026/bfcl.json": ("bfcl_live_simple/BFCL_v4_live_simple.json", False),
}
SOURCES = {  # source name -> (path under prompts/, format)
    "sharegpt": ("sharegpt/*", "sharegpt"),
    "no_robots": ("parquet/no_robots.parquet", "openai"),
    "bfcl": ("**/bfcl.json", "bfcl"),
}


@pytest.fixture(scope="module")
def moto_prompts():
    with moto_s3_server((BUCKET,), SECRET) as (port, client):
        yield port, client


def _ingest_through_dagster(assets: Path, data: Path, monkeypatch) -> tuple[dict[str, dict], Any]:
    from eagle3_dagster.defs.automation import ingest_job
    from eagle3_dagster.defs.ingest import build_ingest_assets
    from eagle3_dagster.orchestration.resources import pipeline_resource

    monkeypatch.setenv("EAGLE3_ASSETS_DIR", str(assets))
    defs = dg.Definitions(
        assets=build_ingest_assets(settings()),
        jobs=[ingest_job],
        resources={"pipeline": pipeline_resource(settings(), data_dir=str(data))},
    )
    instance = dg.DagsterInstance.ephemeral()
    result = defs.resolve_job_def("ingest").execute_in_process(instance=instance)
    assert result.success
    meta = {}
    for name in [*SOURCES, "prompts"]:
        key = dg.AssetKey("prompts" if name == "prompts" else f"source__{name}")
        m = instance.get_latest_materialization_event(key).asset_materialization.metadata
        meta[name] = {k: v.value if hasattr(v, "value") else v for k, v in m.items()}
    # every event of the run (materializations, logs, step events) and the run records
    records = json.dumps([str(e) for e in instance.all_logs(result.run_id)] + [str(r) for r in instance.get_runs()])
    return meta, records


@pytest.mark.integration
def test_s3_prompt_sources_materialize_like_local_files(
    moto_prompts, datasets_dir: Path, tmp_path: Path, monkeypatch
) -> None:
    port, client = moto_prompts
    set_aws_env(monkeypatch, SECRET)
    local_src = tmp_path / "local_src"
    for key, (shared, gz) in DATASETS.items():
        data = (datasets_dir / shared).read_bytes()
        data = gzip.compress(data, mtime=0) if gz else data
        client.put_object(Bucket=BUCKET, Key=f"prompts/{key}", Body=data)
        (local_src / key).parent.mkdir(parents=True, exist_ok=True)
        (local_src / key).write_bytes(data)
    client.put_object(Bucket=BUCKET, Key="prompts/parquet/", Body=b"")  # a folder marker: not a file
    s3_assets, local_assets = tmp_path / "s3_assets", tmp_path / "local_assets"
    for assets, path_of in (
        (s3_assets, lambda rel: s3_uri(BUCKET, f"prompts/{rel}", port)),
        (local_assets, lambda rel: str(local_src / rel)),
    ):
        (assets / "sources").mkdir(parents=True)
        for name, (rel, fmt) in SOURCES.items():
            (assets / "sources" / f"{name}.yaml").write_text(f"path: '{path_of(rel)}'\nformat: {fmt}\nlicence: test\n")

    local_meta, _ = _ingest_through_dagster(local_assets, tmp_path / "local_data", monkeypatch)
    s3_meta, records = _ingest_through_dagster(s3_assets, tmp_path / "s3_data", monkeypatch)

    count_keys = ("read", "accepted", "rejected", "duplicates", "rejects_by_reason")
    for name in SOURCES:
        lm, sm = local_meta[name], s3_meta[name]
        assert {k: sm[k] for k in count_keys} == {k: lm[k] for k in count_keys}, name
        assert sm["read"] == sm["accepted"] + sm["rejected"] + sm["duplicates"] > 0
        assert sm["source_path"] == f"s3://{BUCKET}/prompts/{SOURCES[name][0]}"
    assert s3_meta["sharegpt"]["read"] == 1000 + 500 + 8
    for k in ("read", "prompts", "cross_source_duplicates", "rejects", "source_duplicates"):
        assert s3_meta["prompts"][k] == local_meta["prompts"][k], k

    # the same prompts, with the URI (no query) as lineage
    s3_rows = _rows(tmp_path / "s3_data" / "prompts" / "prompts.parquet")
    local_rows = _rows(tmp_path / "local_data" / "prompts" / "prompts.parquet")
    assert len(s3_rows) == len(local_rows) == s3_meta["prompts"]["prompts"] > 0
    to_local = {f"s3://{BUCKET}/prompts/{key}": str(local_src / key) for key in DATASETS}
    assert {r["source_file"] for r in s3_rows} == set(to_local)
    assert [{**r, "source_file": to_local[r["source_file"]]} for r in s3_rows] == local_rows

    # nothing of the endpoint options or the secret in the run records
    assert SECRET not in records and "endpoint_override" not in records and f"127.0.0.1:{port}" not in records

    print(
        "\n[s3 prompt sources] "
        + "; ".join(
            f"{n}: read {s3_meta[n]['read']} = accepted {s3_meta[n]['accepted']} + rejected {s3_meta[n]['rejected']} + "
            f"duplicates {s3_meta[n]['duplicates']}"
            for n in SOURCES
        )
        + f"; prompts {s3_meta['prompts']['prompts']} "
        f"(cross-source duplicates {s3_meta['prompts']['cross_source_duplicates']}), identical to the local ingest"
    )

    # the source sensor on S3: size + LastModified from the listing
    from eagle3_dagster.defs.automation import build_prompt_source_sensor

    monkeypatch.setenv("EAGLE3_ASSETS_DIR", str(s3_assets))
    prompt_source_sensor = build_prompt_source_sensor(
        settings().storage.sources_dir, settings().shards.sensor_interval_s
    )
    ctx = dg.build_sensor_context(cursor=None)
    assert isinstance(prompt_source_sensor(ctx), dg.RunRequest)
    cur = ctx.cursor
    assert isinstance(prompt_source_sensor(dg.build_sensor_context(cursor=cur)), dg.SkipReason)
    client.put_object(Bucket=BUCKET, Key="prompts/sharegpt/extra.jsonl", Body=b'{"conversations": []}\n')
    changed = dg.build_sensor_context(cursor=cur)
    assert isinstance(prompt_source_sensor(changed), dg.RunRequest) and changed.cursor != cur
