"""A server that quotes our request back (a gateway's 400, a 200 {"error": ...}, a stream's error or
abort chunk, all listing the headers with `Authorization: Bearer <key>`) never gets the key stored or
printed: not on the console, not in errors.parquet, the gate JSON, the HTML report, compute logs or the
Dagster event log. Nor does the password of an endpoint URL's `user:password@`. Real simulator, real
generate steps through Dagster.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import dagster as dg
import polars as pl
import pytest
from dagster import serialize_value
from graph_helpers import graph_resources
from proc_helpers import EAGLE3, command_env
from sim_ctl import KIMI_TOKENIZER_DIR, Sim

from eagle3_dagster.config import Settings, settings
from eagle3_dagster.definitions import build_definitions
from eagle3_dagster.orchestration.resources import resources_from_settings
from eagle3_dagster.orchestration.run import GraphScope, materialize_graph

pytestmark = pytest.mark.integration

SHAPES = ["http_400", "error_body", "abort"]


def _file_texts(root: Path) -> dict[Path, bytes]:
    """Every file under `root` as bytes; Parquet (compressed) also as its decoded rows."""
    out: dict[Path, bytes] = {}
    for p in root.rglob("*"):
        if not p.is_file():
            continue
        raw = p.read_bytes()
        if p.suffix == ".parquet":
            raw += "\n".join(str(r) for r in pl.read_parquet(p).iter_rows()).encode()
        out[p] = raw
    return out


def test_request_quoting_errors_never_store_or_print_the_key(tmp_path, monkeypatch, capfd):
    key = f"e3quoted-{uuid.uuid4().hex}"
    monkeypatch.setenv("SGLANG_API_KEY", key)
    defs = build_definitions(settings())  # the key reaches the steps through the definitions built with it
    home, data = tmp_path / "dagster_home", tmp_path / "data"
    home.mkdir()
    sim = Sim(extra_args=("--api-key-env", "SIM_TEST_KEY"), env={"SIM_TEST_KEY": key}, log_path=tmp_path / "sim.log")
    try:
        with dg.instance_for_test(temp_dir=str(home)) as instance:
            res = graph_resources(data, str(KIMI_TOKENIZER_DIR), sim.url, max_new_tokens=256, max_failed_rate=0.5)
            assert materialize_graph(defs, instance, scope=GraphScope(shards=[]), resources=res).ingest_success
            outcomes = []
            for shard, stream in (("0000", True), ("0001", False)):
                sim.faults(quote_headers=len(SHAPES), quote_headers_as=SHAPES)
                res = graph_resources(
                    data, str(KIMI_TOKENIZER_DIR), sim.url, max_new_tokens=256, max_failed_rate=0.5, stream=stream
                )
                outcomes += materialize_graph(
                    defs, instance, scope=GraphScope(shards=[shard], run_ingest=False), resources=res
                ).shards
            event_log = [serialize_value(rec) for run in instance.get_runs() for rec in instance.all_logs(run.run_id)]
        injected = sim.stats()
    finally:
        sim.sp.stop()
    console = capfd.readouterr()

    # the scans are not vacuous: both shards ran (their checks may fail: 3 of ~8 requests were refused), each
    # met every quoting shape, and the server's words were kept
    assert [o.shard for o in outcomes] == ["0000", "0001"], outcomes
    assert injected["requests"] > 2 * len(SHAPES)
    errors = pl.concat([pl.read_parquet(p) for p in data.glob("generations/shard=*/errors.parquet")])
    by_reason = dict(errors.group_by("reason").len().iter_rows())
    assert by_reason == {"http_400": 3, "server_error_body": 2, "abort_400": 1}, by_reason
    assert all("headers=" in d and "[redacted]" in d for d in errors["detail"]), errors["detail"].to_list()
    gate_files = list(data.glob("gates/generations/*.json"))
    reports = list(tmp_path.rglob("*.html"))
    assert gate_files and any("http_400" in p.read_text() for p in gate_files)
    assert reports and any("http_400" in p.read_text(errors="replace") for p in reports)
    assert any("http_400" in e for e in event_log)

    # the key itself is nowhere
    secret = key.encode()
    assert key not in console.out and key not in console.err, "API key printed"
    assert not [e for e in event_log if key in e], "API key in the Dagster event log"
    leaked = [str(p) for p, b in _file_texts(tmp_path).items() if secret in b]
    assert not leaked, f"API key stored in {leaked}"
    assert not [d for d in errors["detail"] if key in d]
    assert not [p for p in gate_files if key in json.dumps(json.loads(p.read_text()))]


def test_url_credentials_never_reach_the_run_records_or_files(tmp_path, monkeypatch, capfd):
    password = f"pw-{uuid.uuid4().hex}"
    home, data = tmp_path / "dagster_home", tmp_path / "data"
    home.mkdir()
    sim = Sim(log_path=tmp_path / "sim.log")  # no key: the URL's user info is the only credential
    try:
        url = sim.url.replace("http://", f"http://bob:{password}@")
        monkeypatch.setenv("EAGLE3_SGLANG_URL", url)
        defs = build_definitions(settings())  # a URL with user info is handed to the steps, never run config
        sim.faults(quote_headers=1)  # one 400 quoting the headers, the Basic credentials among them
        res = {
            "pipeline": graph_resources(data, str(KIMI_TOKENIZER_DIR), url, max_new_tokens=256)["pipeline"],
            "sglang": resources_from_settings(Settings.from_env({"EAGLE3_SGLANG_URL": url}))["sglang"],
        }
        with dg.instance_for_test(temp_dir=str(home)) as instance:
            assert materialize_graph(defs, instance, scope=GraphScope(shards=[]), resources=res).ingest_success
            out = materialize_graph(defs, instance, scope=GraphScope(shards=["0000"], run_ingest=False), resources=res)
            runs = instance.get_runs()
            records = [serialize_value(r) for r in runs] + [
                serialize_value(rec) for run in runs for rec in instance.all_logs(run.run_id)
            ]
            # job snapshots are stored compressed: read them back (resource config defaults live there)
            records += [serialize_value(instance.get_job_snapshot(r.job_snapshot_id)) for r in runs]
        served = sim.requests()
    finally:
        sim.sp.stop()
    console = capfd.readouterr()

    assert out.shards[0].shard == "0000" and served > 1  # the run went through the URL with credentials
    assert any(sim.url.removeprefix("http://") in r for r in records)  # the endpoint is named, without user info
    assert password not in console.out + console.err, "URL password printed"
    assert not [r for r in records if password in r], "URL password in run config or the event log"
    assert not [str(p) for p, b in _file_texts(tmp_path).items() if password.encode() in b]


def test_eagle3_check_refuses_url_credentials_next_to_the_api_key(tmp_path):
    env = command_env(tmp_path)
    env.update(EAGLE3_SGLANG_URL="http://bob:hunter2-check@127.0.0.1:9", SGLANG_API_KEY="e3-check-key-77")
    r = subprocess.run([EAGLE3, "check"], env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 2, r.stdout + r.stderr
    line = r.stderr.strip()
    assert line.startswith("eagle3 check: error: EAGLE3_SGLANG_URL carries credentials"), line
    assert "SGLANG_API_KEY is set" in line and "http://127.0.0.1:9" in line
    assert "hunter2-check" not in r.stdout + r.stderr and "e3-check-key-77" not in r.stdout + r.stderr
