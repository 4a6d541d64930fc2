"""Loud failures (issue 13): nothing reports SUCCESS while losing or emptying data.

Through the real CLI (`eagle3 demo`, `eagle3 check`, `eagle3 report`) and real Dagster runs on a
real instance: sources that yield nothing fail their asset naming the source and its reject counts;
`allow_empty` and reject rates warn (non-blocking check, report); bad settings, source YAMLs and
shard keys fail before any work with one readable line each; a fresh instance is safe to create
from several processes at once.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import dagster as dg
import polars as pl
import pytest
from graph_helpers import graph_resources

from eagle3_dagster.config import MAX_N_SHARDS, PROJECT_ROOT, PartitionKeyError, Settings, SettingsError, settings
from eagle3_dagster.orchestration.run import GraphScope, materialize_graph

pytestmark = pytest.mark.integration

DEMO_PROMPTS = PROJECT_ROOT / "assets" / "sources" / "data" / "demo_prompts.jsonl"
UNUSED_URL = "http://127.0.0.1:9"  # nothing may be contacted when ingest fails


def _assets(tmp_path: Path, sources: dict[str, tuple[str, bytes | None]]) -> Path:
    """An assets dir with the real model profiles and the given sources: name -> (yaml body, data file bytes)."""
    assets = tmp_path / "assets"
    (assets / "sources").mkdir(parents=True)
    (assets / "models").symlink_to(PROJECT_ROOT / "assets" / "models")
    for name, (body, data) in sources.items():
        if data is not None:
            (assets / "sources" / f"{name}.jsonl").write_bytes(data)
        (assets / "sources" / f"{name}.yaml").write_text(textwrap.dedent(body))
    return assets


def _env(tmp_path: Path, assets: Path | None = None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EAGLE3_") or k == "EAGLE3_TOKENIZER"}
    env.update(DAGSTER_HOME=str(tmp_path / "home"), EAGLE3_DATA_DIR=str(tmp_path / "data"), HF_HUB_OFFLINE="1")
    if assets is not None:
        env["EAGLE3_ASSETS_DIR"] = str(assets)
    env.update(extra)
    return env


def _eagle3(args: list[str], env: dict[str, str], timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "eagle3_dagster.app.cli", *args],
        env=env,
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _good_line(content: str = "hello") -> bytes:
    return ('{"messages": [{"role": "user", "content": "%s"}]}\n' % content).encode()


# ------------------------------------------------------------------------------- sources that yield nothing


def test_demo_fails_naming_each_source_that_yields_nothing(tmp_path):
    binary = random.Random(0).randbytes(30_000)
    assets = _assets(
        tmp_path,
        {
            "good": (f"path: {DEMO_PROMPTS}\nformat: openai\n", None),
            "empty": ("path: empty.jsonl\n", b""),
            "binary": ("path: binary.jsonl\n", binary),
            "oversized": ("path: oversized.jsonl\nmax_bytes: 200\n", _good_line("x" * 500)),
        },
    )
    r = _eagle3(["demo"], _env(tmp_path, assets, EAGLE3_SGLANG_URL=UNUSED_URL))
    out = r.stdout
    assert r.returncode == 1, (out, r.stderr[-3000:])
    assert out.rstrip().splitlines()[-1] == "result:     FAILED"
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert any(
        "source 'empty' yielded no accepted prompt (read 0: accepted 0, rejected 0, duplicates 0)" in e for e in errors
    ), errors
    [binary_err] = [e for e in errors if "source 'binary'" in e]
    n_read = int(binary_err.split("(read ")[1].split(":")[0])
    assert n_read > 10 and f"rejected {n_read} (" in binary_err and "invalid_utf8" in binary_err
    assert any(
        "source 'oversized' yielded no accepted prompt (read 1: accepted 0, rejected 1 (too_large 1)" in e
        for e in errors
    ), errors
    assert len(errors) == 3, errors  # the good source is not blamed
    assert any(line.startswith("next:") and "allow_empty: true" in line for line in out.splitlines())

    data = tmp_path / "data"
    # nothing written downstream, and nothing for the failed sources; the good one is ingested
    assert not (data / "prompts").exists()
    assert not [f for n in ("empty", "binary", "oversized") for f in (data / "sources" / n).rglob("*") if f.is_file()]
    assert pl.read_parquet(data / "sources" / "good" / "accepted.parquet").height > 0
    with dg.DagsterInstance.from_config(str(tmp_path / "home")) as instance:
        report, run = instance.get_runs()  # the failed ingest, then (always last) the report
        assert (run.job_name, run.status) == ("ingest", dg.DagsterRunStatus.FAILURE) and report.job_name == "report"
        assert instance.get_latest_materialization_event(dg.AssetKey("source__good")) is not None
        for name in ("empty", "binary", "oversized", "prompts"):
            assert (
                instance.get_latest_materialization_event(dg.AssetKey(f"source__{name}" if name != "prompts" else name))
                is None
            )


def test_allow_empty_and_high_reject_rate_warn_in_checks_and_report(tmp_path, monkeypatch, kimi_profile):
    noisy = _good_line("one") + _good_line("two") + b"not json\n" * 3  # 3 of 5 rejected: 60%
    assets = _assets(
        tmp_path,
        {
            "empty_ok": ("path: empty_ok.jsonl\nallow_empty: true\n", b""),
            "noisy": ("path: noisy.jsonl\n", noisy),
            "tolerant": ("path: noisy.jsonl\nmax_reject_rate: 0.75\n", None),
        },
    )
    monkeypatch.setenv("EAGLE3_ASSETS_DIR", str(assets))
    from eagle3_dagster.defs.ingest import build_ingest_assets

    defs = dg.Definitions(assets=build_ingest_assets(settings()))
    data = tmp_path / "data"
    res = graph_resources(data, kimi_profile.tokenizer, UNUSED_URL)
    with dg.instance_for_test() as instance:
        out = materialize_graph(defs, instance, scope=GraphScope(shards=[]), resources=res)
        assert out.ingest_success and out.success, out
        # non-blocking WARN checks: the sources still feed `prompts`
        assert out.ingest_failed_checks == {
            "source__empty_ok:source_yield": "WARN",
            "source__noisy:source_yield": "WARN",
        }
        # the WARN checks first, then every warning the steps logged, each naming its source and cause
        assert out.warnings[:2] == ["source__empty_ok:source_yield", "source__noisy:source_yield"]
        logged = out.warnings[2:]
        assert any("'empty_ok' yielded no accepted prompt" in w for w in logged), logged
        assert any("noisy" in w and "reject" in w for w in logged), logged
        meta = instance.get_latest_materialization_event(dg.AssetKey("source__noisy")).asset_materialization.metadata
        assert meta["reject_rate"].value == 0.6
    # counts reconcile: 2 accepted by each of noisy/tolerant, the same prompts -> 2 unique
    assert pl.read_parquet(data / "prompts" / "prompts.parquet").height == 2
    assert pl.read_parquet(data / "prompts" / "prompt_rejects.parquet").height == 6

    from eagle3_dagster.app.cli import main as eagle3

    report = tmp_path / "report.html"
    assert eagle3(["report", "--data-dir", str(data), "--out", str(report)]) == 0
    html = report.read_text()
    section = html.split("<h2>Prompt sources</h2>")[1].split("<h2>")[0]
    rows = {r.split("</code>")[0]: r for r in section.split("<tr><td><code>")[1:]}
    assert "no accepted prompt" in rows["empty_ok"] and "badge WARN" in rows["empty_ok"]
    assert "reject rate above threshold" in rows["noisy"] and "60.0%" in rows["noisy"] and "not_json 3" in rows["noisy"]
    assert "badge PASS" in rows["tolerant"] and "75.0%" in rows["tolerant"]


# ------------------------------------------------------------------------------- settings, YAMLs, shard keys

BAD_SETTINGS = {
    "EAGLE3_CONTEXT_OVERFLOW": ("trim", "EAGLE3_CONTEXT_OVERFLOW must be one of fit, skip, got 'trim'"),
    "EAGLE3_N_SHARDS": ("abc", "EAGLE3_N_SHARDS must be an integer >= 1, got 'abc'"),
    "EAGLE3_GX_KEEP_VALIDATIONS": ("-1", "EAGLE3_GX_KEEP_VALIDATIONS must be an integer >= 0 (0 = keep all), got '-1'"),
    "EAGLE3_GENERATION_COMPACT_AFTER_CHUNKS": (
        "lots",
        "EAGLE3_GENERATION_COMPACT_AFTER_CHUNKS must be an integer >= 0 (0 = never compact), got 'lots'",
    ),
    "EAGLE3_SNAPSHOT_RETENTION": ("0", "EAGLE3_SNAPSHOT_RETENTION must be an integer >= 1, got '0'"),
    "EAGLE3_EXECUTOR": ("celery", "EAGLE3_EXECUTOR must be one of multiprocess, in_process, k8s, got 'celery'"),
    "EAGLE3_NIGHTLY_CRON": (
        "at two",
        "EAGLE3_NIGHTLY_CRON must be a 5-field cron expression such as '0 2 * * *', got 'at two'",
    ),
    "EAGLE3_NIGHTLY_TZ": (
        "Mars/Olympus",
        "EAGLE3_NIGHTLY_TZ must be an IANA time zone such as 'UTC' or 'Europe/Paris', got 'Mars/Olympus'",
    ),
    "EAGLE3_SGLANG_URL": (
        "ftp://h:1",
        "EAGLE3_SGLANG_URL must be comma-separated http(s)://host:port URLs, got 'ftp://h:1'",
    ),
    "EAGLE3_ASSETS_DIR": (
        "/nonexistent/assets",
        "EAGLE3_ASSETS_DIR must be an existing directory, got '/nonexistent/assets'",
    ),
    "EAGLE3_EXPECTATIONS_DIR": (
        "/nonexistent/exp",
        "EAGLE3_EXPECTATIONS_DIR must be an existing directory, got '/nonexistent/exp'",
    ),
    "EAGLE3_TOKENIZER": (
        "/nonexistent/tok",
        "EAGLE3_TOKENIZER must be a tokenizer folder or a hub repo id (org/name), got '/nonexistent/tok'",
    ),
    "EAGLE3_DATA_DIR": ("s3://user:secret@bucket/x", "EAGLE3_DATA_DIR must be a local path or a storage URI"),
}


def test_every_setting_is_validated_naming_variable_value_and_allowed():
    s = Settings.from_env(
        {"EAGLE3_N_SHARDS": "8", "EAGLE3_EXECUTOR": "in-process", "EAGLE3_SGLANG_URL": "http://a:1/, http://b:2"}
    )
    assert (s.shards.n_shards, s.dagster.executor, s.fleet.urls, s.urls_configured) == (
        8,
        "in_process",
        ("http://a:1", "http://b:2"),
        True,
    )
    for var, (bad, message) in BAD_SETTINGS.items():
        with pytest.raises(SettingsError) as e:
            Settings.from_env({var: bad})
        assert e.value.problems[0].startswith(message), (var, e.value.problems)
    # all problems at once, one line each; a credential in a URI is never echoed
    with pytest.raises(SettingsError) as e:
        Settings.from_env({var: bad for var, (bad, _) in BAD_SETTINGS.items()})
    assert len(e.value.problems) == len(BAD_SETTINGS) and "secret" not in str(e.value)


def test_n_shards_has_an_upper_bound_named_in_the_error(tmp_path):
    assert Settings.from_env({"EAGLE3_N_SHARDS": str(MAX_N_SHARDS)}).shards.n_shards == MAX_N_SHARDS == 4096
    with pytest.raises(SettingsError) as e:
        Settings.from_env({"EAGLE3_N_SHARDS": "100000"})
    (problem,) = e.value.problems
    assert problem.startswith("EAGLE3_N_SHARDS must be at most 4096 (") and problem.endswith(", got '100000'")
    # the ingest CLI's own --n-shards has the same bound, before any work
    from eagle3_dagster.app.cli import main as eagle3

    data = tmp_path / "p.jsonl"
    data.write_text('{"question": "q"}\n')
    assert eagle3(["ingest", str(data), "--out", str(tmp_path / "o"), "--n-shards", "5000"]) == 2
    assert not (tmp_path / "o").exists()


def test_cli_rejects_bad_settings_before_any_work_in_one_line_each(tmp_path):
    env = _env(tmp_path, EAGLE3_N_SHARDS="abc", EAGLE3_NIGHTLY_TZ="Mars/Olympus")
    r = _eagle3(["demo"], env)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.splitlines() == [
        "eagle3 demo: error: EAGLE3_N_SHARDS must be an integer >= 1, got 'abc'",
        "eagle3 demo: error: EAGLE3_NIGHTLY_TZ must be an IANA time zone such as 'UTC' or 'Europe/Paris', got 'Mars/Olympus'",
    ]
    # `make instance` (before demo/ui/backfill/check-defs) runs `eagle3 check`: same lines
    assert r.stdout.rstrip().splitlines()[-1] == "result:     FAILED" and "eagle3 check" in r.stdout
    r = _eagle3(["check"], _env(tmp_path, EAGLE3_N_SHARDS="0"))
    assert (r.returncode, r.stderr.strip()) == (
        2,
        "eagle3 check: error: EAGLE3_N_SHARDS must be an integer >= 1, got '0'",
    )
    assert not (tmp_path / "home").exists() and not (tmp_path / "data").exists()  # nothing created
    # (the code location refusing to load on a bad setting: tests/reliability/test_executors.py)


def test_source_yaml_errors_are_one_line_per_problem(tmp_path):
    assets = _assets(
        tmp_path,
        {
            "typo": ("path: typo.jsonl\nfromat: openai\n", _good_line()),
            "badrate": ("path: typo.jsonl\nmax_reject_rate: 2\n", None),
            "broken": ("path: [unclosed\n", None),
        },
    )
    r = _eagle3(["demo"], _env(tmp_path, assets, EAGLE3_SGLANG_URL=UNUSED_URL))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.splitlines()
    src = assets / "sources"
    assert (
        lines[0]
        == f"eagle3 demo: error: {src / 'badrate.yaml'}: source 'badrate': max_reject_rate must be a number in [0, 1], got 2"
    )
    assert lines[1].startswith(f"eagle3 demo: error: {src / 'broken.yaml'}: not valid YAML: ")
    assert lines[2].startswith(
        f"eagle3 demo: error: {src / 'typo.yaml'}: unknown field(s) fromat (did you mean 'format'?); known: "
    )
    assert len(lines) == 3
    assert not (tmp_path / "data").exists() and not (tmp_path / "home").exists()


def test_unknown_shard_key_fails_before_anything_is_written(tmp_path, kimi_profile):
    r = _eagle3(["demo", "--shards", "0001,0042"], _env(tmp_path, EAGLE3_SGLANG_URL=UNUSED_URL))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip() == (
        "eagle3 demo: error: unknown shard key(s) '0042'; valid keys (4, from EAGLE3_N_SHARDS): 0000, 0001, 0002, 0003"
    )
    assert not (tmp_path / "data").exists() and not (tmp_path / "home").exists()
    # the same from Python (tests, scripts): no run is started, no ingest output written
    from eagle3_dagster.definitions import defs

    res = graph_resources(tmp_path / "data2", kimi_profile.tokenizer, UNUSED_URL)
    with dg.instance_for_test() as instance:
        with pytest.raises(PartitionKeyError, match=r"unknown shard key\(s\) '7'; valid keys .*0000, 0001, 0002, 0003"):
            materialize_graph(defs, instance, scope=GraphScope(shards=["7"]), resources=res)
        assert instance.get_runs() == []
    assert not (tmp_path / "data2").exists()


# ------------------------------------------------------------------------------- fresh instance, concurrently

_FIRST_USE = """
import sys, time
from pathlib import Path
import dagster as dg
from eagle3_dagster.app.instance import ensure_dagster_home
from eagle3_dagster.config import settings

@dg.asset
def first_use(): return 1

barrier = Path(sys.argv[1])
Path(sys.argv[2]).touch()  # imports done
while not barrier.exists():  # start together: the race is in the first second
    time.sleep(0.01)
ensure_dagster_home(settings().dagster.home)  # what `eagle3 demo` and `make instance` (eagle3 check) do first
sys.exit(0 if dg.materialize([first_use], instance=dg.DagsterInstance.get()).success else 3)
"""


def test_two_first_uses_of_a_fresh_instance_both_succeed(tmp_path):
    env = _env(tmp_path)
    barrier = tmp_path / "go"
    ready = [tmp_path / f"ready{i}" for i in range(2)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _FIRST_USE, str(barrier), str(r)],
            env=env,
            cwd=PROJECT_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in ready
    ]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not all(r.exists() for r in ready):
        time.sleep(0.05)
    barrier.touch()  # release both together, imports done
    results = [(p.wait(timeout=180), *p.communicate()) for p in procs]
    for code, _, err in results:
        assert code == 0 and "already exists" not in err, err[-3000:]
    with dg.DagsterInstance.from_config(str(tmp_path / "home")) as instance:
        runs = instance.get_runs()
        assert len(runs) == 2 and all(r.status == dg.DagsterRunStatus.SUCCESS for r in runs)


def test_failed_publish_step_makes_the_demo_outcome_failed(tmp_path, kimi_profile):
    """A training_dataset run that fails (here: `gates` is a file, not a folder, so the publish attempt cannot be
    recorded) is FAILED, named, with a next step. (With nothing to publish the publish gate refuses anyway:
    tests/pipeline/test_publish_gates.py; this is about an unexpected error in the step.)"""
    from eagle3_dagster.app.demo import problem_lines
    from eagle3_dagster.config import settings
    from eagle3_dagster.definitions import defs

    data = tmp_path / "data"
    data.mkdir()
    (data / "gates").write_text("not a folder")
    res = graph_resources(data, kimi_profile.tokenizer, UNUSED_URL)
    with dg.instance_for_test() as instance:
        out = materialize_graph(
            defs, instance, scope=GraphScope(shards=[], run_publish=True, allow_partial=True), resources=res
        )
    assert out.ingest_success and out.publish_success is False and not out.success
    [err] = out.publish_errors
    assert err.startswith("training_dataset: ") and "gates" in err
    lines = problem_lines(out, settings(), tmp_path / "report.html")
    assert f"error:      publish {err}" in lines
    assert any(line.startswith("next:") and "snapshot was not published" in line for line in lines)
