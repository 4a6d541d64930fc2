"""A real S3 endpoint for tests: `moto_server` (moto[server], the test extra) as a subprocess on 127.0.0.1.

Shared by tests/reliability/test_object_storage.py (the whole graph on S3) and
tests/ingest/test_ingest_remote.py (prompt sources in S3). Importable from any test folder: pytest
puts tests/ (the folder of the root conftest.py) on sys.path.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from eagle3_dagster.sim.process import free_port

VENV_BIN = Path(sys.executable).parent
ACCESS_KEY_ID = "eagle3test"


@contextmanager
def moto_s3_server(buckets: tuple[str, ...], secret: str) -> Iterator[tuple[int, Any]]:
    """Start moto_server on a free port, create `buckets`; yield (port, boto3 client); stop it at the end."""
    server = VENV_BIN / "moto_server"
    if not server.exists():
        raise RuntimeError(f"{server} not found: install the test extra (`make install`, or pip install -e '.[test]')")
    port = free_port()
    proc = subprocess.Popen(
        [str(server), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"{endpoint}/moto-api/", timeout=2)
                break
            except httpx.HTTPError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("moto_server did not start") from None
                time.sleep(0.2)
        import boto3

        client = boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id=ACCESS_KEY_ID,
            aws_secret_access_key=secret,
        )
        for bucket in buckets:
            client.create_bucket(Bucket=bucket)
        yield port, client
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def set_aws_env(monkeypatch: pytest.MonkeyPatch, secret: str) -> None:
    """Credentials by environment only (what a deployment does); nothing else that could redirect S3."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(var, raising=False)


def s3_uri(bucket: str, key: str, port: int) -> str:
    """s3://bucket/key with the moto endpoint as pyarrow URI options (no credentials)."""
    return f"s3://{bucket}/{key}?endpoint_override=127.0.0.1:{port}&scheme=http&region=us-east-1"
