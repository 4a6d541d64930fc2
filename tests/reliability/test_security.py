"""Security properties a user relies on, checked against the real parts.

- A tokenizer folder that asks for remote code (`auto_map`) is loaded without running that code.
- The SGLang API key (SGLANG_API_KEY) reaches the server but never the Dagster event log,
  materialization/check metadata, run config, captured compute logs, console or data files.
- The simulator and the Dagster UI (`eagle3 ui`, i.e. `make ui`) listen on 127.0.0.1 only.
- Partition keys, table names and source names cannot reach outside the data directory.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import textwrap
import uuid
from pathlib import Path

import dagster as dg
import httpx
import polars as pl
import pytest
from dagster import serialize_value
from rel_helpers import PYTHON, VENV_BIN, child_env, listening_addresses, process_tree, wait_http

from eagle3_dagster.config import settings
from eagle3_dagster.definitions import build_definitions, defs
from eagle3_dagster.ingest import load_source_specs
from eagle3_dagster.ingest.errors import SourceSpecError
from eagle3_dagster.ingest.spec import SourceSpec
from eagle3_dagster.orchestration.resources import SGLangFleet, pipeline_resource
from eagle3_dagster.orchestration.run import GraphScope, materialize_graph
from eagle3_dagster.sim.process import free_port, start_simulator
from eagle3_dagster.storage import StorageError, parse_shard_key, safe_join, shard_dir
from eagle3_dagster.tokenize import PromptRenderer, load_tokenizer

KIMI_THINK_START = 163606


# --------------------------------------------------------------------------- remote code
def _remote_code_trap(kimi_dir: Path, folder: Path, marker: Path) -> Path:
    """A Kimi tokenizer folder whose config points AutoTokenizer at a python file that, if it is
    ever imported, writes `marker` (as a hostile tokenizer repo could run anything)."""
    folder.mkdir(parents=True)
    for name in ("tokenizer.json", "chat_template.jinja"):
        shutil.copyfile(kimi_dir / name, folder / name)
    config = json.loads((kimi_dir / "tokenizer_config.json").read_text())
    config["auto_map"] = {"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]}
    config["tokenizer_class"] = "EvilTokenizer"
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "tokenization_evil.py").write_text(
        textwrap.dedent(f"""
        from pathlib import Path
        Path({str(marker)!r}).write_text("remote code ran")
        from transformers import PreTrainedTokenizerFast
        class EvilTokenizer(PreTrainedTokenizerFast):
            pass
    """)
    )
    return folder


@pytest.mark.integration
def test_tokenizer_remote_code_is_never_executed(tmp_path, kimi_profile, kimi_tokenizer, monkeypatch):
    marker = tmp_path / "PWNED"
    trap = _remote_code_trap(Path(kimi_profile.tokenizer), tmp_path / "evil-tok", marker)
    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "hf-modules"))

    # the loader the pipeline uses, directly ...
    tok = load_tokenizer(str(trap))
    assert not marker.exists(), "load_tokenizer executed the folder's auto_map code"
    assert type(tok).__name__ != "EvilTokenizer"
    text = "Hello <think> world"
    assert tok.encode(text, add_special_tokens=False) == kimi_tokenizer.encode(text, add_special_tokens=False)

    # ... and through the renderer the tokenize asset builds from a profile (trust_remote_code unset)
    profile = kimi_profile.with_tokenizer(str(trap))
    assert profile.trust_remote_code is False
    rendered = PromptRenderer(profile).render([{"role": "user", "content": "What is 2+2?"}])
    assert rendered.ok and rendered.input_ids[-1] == KIMI_THINK_START
    assert not marker.exists(), "rendering with the trap tokenizer executed its code"

    # control: the trap is real — transformers *does* run it once remote code is trusted.
    control = subprocess.run(
        [
            PYTHON,
            "-c",
            "import sys; from transformers import AutoTokenizer; "
            "AutoTokenizer.from_pretrained(sys.argv[1], trust_remote_code=True)",
            str(trap),
        ],
        env=child_env(HF_MODULES_CACHE=str(tmp_path / "hf-modules-control")),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert marker.exists(), f"control failed: trust_remote_code=True did not run the trap\n{control.stderr[-2000:]}"


# --------------------------------------------------------------------------- API key
def _scan_parquet(path: Path) -> str:
    df = pl.read_parquet(path)
    return "\n".join(str(row) for row in df.iter_rows())


@pytest.mark.integration
def test_api_key_never_leaks(tmp_path, kimi_profile, monkeypatch, capfd):
    key = f"sk-e3test-{uuid.uuid4().hex}"
    monkeypatch.setenv("SGLANG_API_KEY", key)
    defs = build_definitions(settings())  # the key reaches the steps through the definitions built with it
    home, data = tmp_path / "dagster_home", tmp_path / "data"
    home.mkdir()
    res = {
        "pipeline": pipeline_resource(
            settings(), data_dir=str(data), tokenizer=kimi_profile.tokenizer, max_new_tokens=512
        ),
        "sglang": SGLangFleet(urls=None),
    }
    with start_simulator(
        extra_args=["--api-key-env", "E3_TEST_SIM_KEY"], env={"E3_TEST_SIM_KEY": key}, log_dir=tmp_path
    ) as sim:
        # the server really demands the key
        assert httpx.get(f"{sim.url}/model_info", timeout=10).status_code == 401
        auth = {"Authorization": f"Bearer {key}"}
        assert httpx.get(f"{sim.url}/model_info", headers=auth, timeout=10).status_code == 200
        res["sglang"] = SGLangFleet(urls=sim.url)
        with dg.instance_for_test(temp_dir=str(home)) as instance:
            assert materialize_graph(defs, instance, scope=GraphScope(shards=[]), resources=res).ingest_success
            out = materialize_graph(defs, instance, scope=GraphScope(shards=["0000"], run_ingest=False), resources=res)
            assert out.shards[0].success, out.shards[0]
            assert out.shards[0].checks["generations:think_end_present"] is True

            runs = instance.get_runs()
            event_log, run_records, metadata = [], [], []
            for run in runs:
                run_records.append(serialize_value(run))  # run config, tags, op selection ...
                run_records.append(json.dumps(run.run_config, default=str))
                for rec in instance.all_logs(run.run_id):
                    event_log.append(serialize_value(rec))
                    ev = rec.dagster_event
                    if ev is not None and ev.is_step_materialization:
                        metadata.append(str(ev.step_materialization_data.materialization.metadata))
                    if ev is not None and ev.event_type_value == "ASSET_CHECK_EVALUATION":
                        metadata.append(str(ev.event_specific_data.metadata))
        stats = httpx.get(f"{sim.url}/_sim/stats", headers=auth, timeout=10).json()
    console = capfd.readouterr()

    compute_logs = [p for p in home.rglob("*") if p.is_file() and p.suffix in (".out", ".err", ".log")]
    instance_files = {p: p.read_bytes() for p in home.rglob("*") if p.is_file()}
    data_text = {
        p: (_scan_parquet(p) if p.suffix == ".parquet" else p.read_text(errors="replace"))
        for p in data.rglob("*")
        if p.is_file()
    }

    # the scans are not vacuous: each one sees what the run wrote there
    # ingest, the shard, the quality report (its own run)
    assert sorted(r.job_name for r in runs) == ["ingest", "report", "shard_pipeline"] and stats["requests"] > 0
    assert any("think_end_present" in e for e in event_log)
    assert any("stored_samples" in m for m in metadata) and any("pass_rate" in m for m in metadata)
    assert compute_logs and any(b"shard 0" in instance_files[p] for p in compute_logs)
    assert "shard 0" in console.err + console.out
    assert any("163607" in t or "</think>" in t for p, t in data_text.items() if "generations" in p.parts)

    # the key itself is nowhere
    assert not [e for e in event_log if key in e], "API key in the Dagster event log"
    assert not [m for m in metadata if key in m], "API key in materialization/check metadata"
    assert not [r for r in run_records if key in r], "API key in run config or tags"
    assert not [p for p, b in instance_files.items() if key.encode() in b], "API key in instance storage/compute logs"
    assert key not in console.out and key not in console.err, "API key printed to the console"
    assert not [p for p, t in data_text.items() if key in t], "API key in a data file"
    # and every request of the run carried it: the only 401 is the test's own probe above
    assert stats["errors"].get("401", 0) == 1, stats["errors"]


# --------------------------------------------------------------------------- listening addresses
@pytest.mark.integration
def test_simulator_binds_loopback_by_default(tmp_path):
    port = free_port()
    log = tmp_path / "sim.log"
    with open(log, "wb") as f:  # the console script with no --host, as in the README
        proc = subprocess.Popen(
            [str(VENV_BIN / "eagle3-sim"), "--port", str(port)],
            env=child_env(),
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_http(f"http://127.0.0.1:{port}/health", timeout=90, proc=proc, log=log)
        listening = listening_addresses(process_tree(proc.pid))
        assert listening == {proc.pid: {("127.0.0.1", port)}}, listening
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_ui_binds_loopback_by_default(eagle3_ui):
    """`eagle3 ui` (what `make ui` runs): the webserver, and everything else it starts, on loopback."""
    listening = listening_addresses(eagle3_ui.pids())
    addrs = {a for s in listening.values() for a in s}
    assert ("127.0.0.1", eagle3_ui.port) in addrs, listening
    assert len(listening) >= 2, listening  # the webserver and the simulator it started
    assert all(ip in ("127.0.0.1", "::1") for ip, _ in addrs), listening


# --------------------------------------------------------------------------- paths
@pytest.mark.parametrize(
    "key", ["../0000", "0000/../../x", "..", "/etc", "", "00000", "000", "0x01", "0000\n", "٠٠٠١", "0001 "]
)
def test_bad_partition_keys_are_refused(key):
    with pytest.raises(StorageError, match="invalid shard partition key"):
        parse_shard_key(key)


def test_paths_cannot_escape_the_data_dir(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "link").symlink_to("/etc")
    assert shard_dir(data, "generations", 3) == data.resolve() / "generations" / "shard=0003"
    for parts in (("..", "x"), ("/etc/passwd",), ("sources", "..", "..", "x"), ("link", "passwd")):
        with pytest.raises(StorageError, match="escapes the data directory"):
            safe_join(data, *parts)
    with pytest.raises(StorageError):
        shard_dir(data, "../generations", 0)


def test_dagster_refuses_unknown_partition_key(tmp_path):
    (tmp_path / "home").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp_path / "home")) as instance:
        with pytest.raises(dg.DagsterError, match="Could not find a partition with key `../0000`"):
            dg.materialize(
                list(defs.assets),
                selection=["tokenized_prompts"],
                partition_key="../0000",
                instance=instance,
                resources={
                    **defs.resources,
                    "pipeline": pipeline_resource(settings(), data_dir=str(tmp_path / "data")),
                },
            )
    assert not (tmp_path / "tokenized_prompts").exists() and not (tmp_path / "data").exists()


@pytest.mark.parametrize("name", ["../x", "../../etc", "a/b", "..", ".hidden", "/abs", "x\\..\\y"])
def test_source_names_cannot_escape(tmp_path, name):
    """A source's name becomes data/sources/<name>: a name that could leave that folder is refused."""
    sources = tmp_path / "sources"
    sources.mkdir()
    (sources / "bad.yaml").write_text(f"name: {json.dumps(name)}\npath: data.jsonl\n")
    with pytest.raises(SourceSpecError, match="name must be"):
        load_source_specs(sources)
    with pytest.raises(SourceSpecError, match="name must be"):
        SourceSpec(name=name, path="data.jsonl")
