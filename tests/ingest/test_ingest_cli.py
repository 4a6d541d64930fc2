"""`eagle3 ingest FILE --out DIR`, in-process and through the installed console script."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from eagle3_dagster.app.cli import main

BAD_DIR = Path(__file__).resolve().parent.parent / "data" / "bad"


def test_cli_ingests_a_real_dataset_and_prints_counts_last(
    datasets_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = datasets_dir / "glaive_toolcall_sharegpt_en" / "glaive_toolcall_en_demo.json"
    rc = main(
        ["ingest", str(data), "--format", "sharegpt", "--name", "glaive", "--out", str(tmp_path), "--n-shards", "3"]
    )
    assert rc == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    counts = json.loads(last)
    assert set(counts) == {"read", "accepted", "rejected", "duplicates", "rejects_by_reason"}
    assert counts["read"] == 300 == counts["accepted"] + counts["rejected"] + counts["duplicates"]
    rows = pq.read_table(tmp_path / "accepted.parquet").to_pylist()
    assert len(rows) == counts["accepted"] and {r["source"] for r in rows} == {"glaive"}
    assert {r["shard"] for r in rows} == {0, 1, 2}


def test_cli_reports_rejects_by_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ingest", str(BAD_DIR / "orphan_tool_result.jsonl"), "--out", str(tmp_path)]) == 0
    counts = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert counts["rejects_by_reason"] == {"orphan_tool_result": 1} and counts["accepted"] == 2
    # without --name the source is named after the file
    assert pq.read_table(tmp_path / "rejects.parquet").column("source").to_pylist() == ["orphan_tool_result"]


def test_cli_missing_file_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ingest", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "o")]) == 2
    assert "nope.jsonl" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.integration
def test_eagle3_ingest_console_entry_point(datasets_dir: Path, tmp_path: Path) -> None:
    data = datasets_dir / "bfcl_live_simple" / "BFCL_v4_live_simple.json"
    proc = subprocess.run(
        [sys.executable, "-m", "eagle3_dagster.app.cli", "ingest", str(data), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    counts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert counts["read"] == 258 and counts["accepted"] == 258


@pytest.mark.integration
def test_cli_exits_non_zero_naming_the_counts_when_nothing_is_accepted(tmp_path: Path) -> None:
    """From a plain shell, as a user runs it: a file of garbage is an error, not a silent 0."""
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_bytes(b'hello world\n\x00\xff\xfe binary\n{"messages": 3}\n')
    out = tmp_path / "out"
    proc = subprocess.run(
        ["/bin/sh", "-c", f'"{sys.executable}" -m eagle3_dagster.app.cli ingest "{garbage}" --out "{out}"'],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    (line,) = proc.stderr.strip().splitlines()
    assert "no prompt accepted" in line and str(garbage) in line
    assert "read 3: accepted 0, rejected 3" in line and "duplicates 0" in line
    counts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (counts["read"], counts["accepted"], counts["rejected"], counts["duplicates"]) == (3, 0, 3, 0)
    # the rejects are still written, so the user can see why
    assert pq.read_table(out / "rejects.parquet").num_rows == 3


def test_cli_allow_empty_exits_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_text("not json at all\n")
    assert main(["ingest", str(garbage), "--out", str(tmp_path / "o")]) == 1
    assert "no prompt accepted" in capsys.readouterr().err
    assert main(["ingest", str(garbage), "--out", str(tmp_path / "o"), "--allow-empty"]) == 0


def test_a_quoted_glob_without_name_is_named_after_its_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    chats = tmp_path / "my-chats"
    chats.mkdir()
    for i, text in enumerate(("Hi", "Yo")):
        (chats / f"part-{i}.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": text}]}) + "\n")
    (chats / "logs-1.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "Hey"}]}) + "\n")
    assert main(["ingest", str(chats / "*.jsonl"), "--out", str(tmp_path / "a")]) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["accepted"] == 3
    assert set(pq.read_table(tmp_path / "a" / "accepted.parquet").column("source").to_pylist()) == {"my-chats"}
    # a wildcard inside the file name: the part before it
    assert main(["ingest", str(chats / "part-*.jsonl"), "--out", str(tmp_path / "b")]) == 0
    assert set(pq.read_table(tmp_path / "b" / "accepted.parquet").column("source").to_pylist()) == {"part"}
