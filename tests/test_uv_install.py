"""`make install` installs through uv (scripts/uv_install.py): uv must look where pip is configured to look, or a
machine whose torch lies on local disk (find-links) would fetch a multi-GB CUDA build instead."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from eagle3_dagster.config import PROJECT_ROOT

SCRIPT = PROJECT_ROOT / "scripts" / "uv_install.py"


def _uv_install():
    spec = importlib.util.spec_from_file_location("uv_install", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_configured_location_becomes_a_uv_flag():
    flags = _uv_install().uv_flags(
        {
            "index-url": "https://mirror.example/simple",
            "extra-index-url": "file:///opt/a/simple file:///opt/b/simple",
            "find-links": "/opt/wheels",
            "constraint": "/etc/caps.txt",
            "no-index": "true",
            "cert": "/etc/ssl/certs/ca.pem",
            "default-timeout": "180",
        }
    )
    assert flags == [
        "--index-url",
        "https://mirror.example/simple",
        "--extra-index-url",
        "file:///opt/a/simple",
        "--extra-index-url",
        "file:///opt/b/simple",
        "--find-links",
        "/opt/wheels",
        "--constraint",
        "/etc/caps.txt",
        "--no-index",
        "--native-tls",
    ]
    assert _uv_install().uv_flags({}) == []


@pytest.mark.integration
def test_pip_config_files_and_variables_are_read_as_pip_ranks_them(tmp_path: Path):
    conf = tmp_path / "pip.conf"
    conf.write_text(
        "[install]\nindex-url = https://install.example/simple\n"
        "[global]\nfind-links = /from/file\nextra-index-url = file:///file/simple\n"
        "index-url = https://global.example/simple\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=str(conf), PIP_FIND_LINKS="/from/env")
    code = (
        "import importlib.util, json, sys; s = importlib.util.spec_from_file_location('u', sys.argv[1]); "
        "m = importlib.util.module_from_spec(s); s.loader.exec_module(m); print(json.dumps(m.pip_config()))"
    )
    out = subprocess.run([sys.executable, "-c", code, str(SCRIPT)], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    config = json.loads(out.stdout)
    assert config["find-links"] == "/from/env" and config["extra-index-url"] == "file:///file/simple"
    assert config["index-url"] == "https://install.example/simple"  # [install] over [global], as pip reads it
