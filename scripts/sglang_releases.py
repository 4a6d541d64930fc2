"""Put the speculative-metrics source of older SGLang releases beside the venv, for the SGLang schema lane.

    .venv/bin/python scripts/sglang_releases.py

SGLang renamed the per-request acceptance figures twice (docs/drafter.md). The schema lane
(tests/generate/test_sglang_spec_shapes.py) checks the names the simulator speaks for each release against
that release's own `srt/managers/tokenizer_manager.py`; only sglang 0.5.23 is installed (`make install`,
--no-deps), so this fetches the official wheels of the others with pip (`pip download --no-deps`, through the
indexes pip is configured with; pip's cache makes a second run cheap) and keeps that one file of each under
`.venv/sglang-releases/<version>/`, with the wheel's name and sha256 in `source.json`. A release already
there is not fetched again. The exit code is non-zero, naming the release, when one cannot be fetched.

Standard library only (it runs in `make install`).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# The releases the simulator speaks besides the installed 0.5.23 (sim/speculative.py SPEC_NAMES).
RELEASES = ("0.5.9", "0.5.10", "0.5.11", "0.5.12", "0.5.18")
FILES = ("sglang/srt/managers/tokenizer_manager.py",)
DEST = Path(sys.prefix) / "sglang-releases"


def fetch(version: str, dest: Path = DEST) -> str:
    """The release's FILES under dest/<version>/ (fetched unless already there); a line saying what was done."""
    out = dest / version
    if (out / "source.json").is_file() and all((out / f.removeprefix("sglang/")).is_file() for f in FILES):
        return f"sglang {version}: already there"
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp, f"sglang=={version}"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        wheels = sorted(Path(tmp).glob(f"sglang-{version}-*.whl"))
        if done.returncode != 0 or not wheels:
            said = " ".join((done.stderr or done.stdout).split())[-400:]
            raise RuntimeError(f"sglang {version}: pip download failed ({done.returncode}): {said}")
        wheel = wheels[0]
        with zipfile.ZipFile(wheel) as z:
            for name in FILES:
                target = out / name.removeprefix("sglang/")
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(z.read(name))
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        meta = {"version": version, "wheel": wheel.name, "sha256": digest, "files": list(FILES)}
        (out / "source.json").write_text(json.dumps(meta, indent=1) + "\n")
        return f"sglang {version}: {', '.join(FILES)} from {wheel.name} ({wheel.stat().st_size / 1e6:.1f} MB)"


def main() -> int:
    with ThreadPoolExecutor(max_workers=len(RELEASES)) as pool:  # downloads: the network is the limit
        results = list(pool.map(_try, RELEASES))
    for line in results:
        print(line, file=sys.stderr if line.startswith("FAILED") else sys.stdout)
    return 1 if any(line.startswith("FAILED") for line in results) else 0


def _try(version: str) -> str:
    try:
        return fetch(version)
    except (RuntimeError, OSError, zipfile.BadZipFile, KeyError) as e:
        return f"FAILED {e}"


if __name__ == "__main__":
    sys.exit(main())
