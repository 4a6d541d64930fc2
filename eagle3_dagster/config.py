"""Process-wide settings, read from the environment with sane defaults.

One place for every environment variable the project reads, so the README can list them and
tests can override them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .storage import DataPath, data_root

# The project root is the folder holding pyproject.toml; defaults are relative to it so
# `make demo` works from a fresh clone without any configuration.
PROJECT_ROOT = Path(__file__).resolve().parent.parent


def _path_from_env(var: str, default: Path) -> Path:
    raw = os.environ.get(var)
    return Path(raw).expanduser().resolve() if raw else default


def _data_dir_from_env() -> DataPath:
    """EAGLE3_DATA_DIR: a local path (default ./data), file://, s3://, gs://, ... or any fsspec URI."""
    raw = os.environ.get("EAGLE3_DATA_DIR")
    if not raw:
        return data_root(PROJECT_ROOT / "data")
    if "://" in raw:
        return data_root(raw)
    return data_root(Path(raw).expanduser().resolve())


def work_dir_for(data_dir: DataPath) -> Path:
    """Local scratch for what cannot live in object storage (GX file context + Data Docs, shard locks).

    EAGLE3_WORK_DIR if set; else the data directory itself when it is local (layout unchanged);
    else `.eagle3_work/` in the project root (a checkout), or `$TMPDIR/eagle3-work` when the package
    is installed without one (never inside site-packages).
    """
    raw = os.environ.get("EAGLE3_WORK_DIR")
    if raw:
        return Path(raw).expanduser().resolve()
    if data_dir.is_local:
        return data_dir.local_path
    if (PROJECT_ROOT / "pyproject.toml").exists():
        return PROJECT_ROOT / ".eagle3_work"
    import tempfile

    return Path(tempfile.gettempdir()) / "eagle3-work"


GX_KEEP_VALIDATIONS_ENV = "EAGLE3_GX_KEEP_VALIDATIONS"
GX_KEEP_VALIDATIONS_DEFAULT = 20


def gx_keep_validations() -> int:
    """EAGLE3_GX_KEEP_VALIDATIONS: GX validation results (+ Data Docs pages) kept per suite; 0 keeps all."""
    raw = os.environ.get(GX_KEEP_VALIDATIONS_ENV, "").strip()
    if not raw:
        return GX_KEEP_VALIDATIONS_DEFAULT
    try:
        n = int(raw)
    except ValueError:
        raise ValueError(f"{GX_KEEP_VALIDATIONS_ENV} must be an integer (0 = keep all), got {raw!r}") from None
    if n < 0:
        raise ValueError(f"{GX_KEEP_VALIDATIONS_ENV} must be >= 0 (0 = keep all), got {n}")
    return n


def _float_env(var: str, *, minimum: float) -> float | None:
    raw = os.environ.get(var, "").strip()
    if not raw:
        return None
    try:
        v = float(raw)
    except ValueError:
        raise ValueError(f"{var} must be a number of seconds (> {minimum:g}), got {raw!r}") from None
    if not v > minimum:
        raise ValueError(f"{var} must be a number of seconds (> {minimum:g}), got {raw!r}")
    return v


def _bool_env(var: str) -> bool | None:
    raw = os.environ.get(var, "").strip().lower()
    if not raw:
        return None
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{var} must be one of 1/0, true/false, yes/no, on/off; got {raw!r}")


def generation_env() -> dict[str, object]:
    """GenerationConfig overrides from the environment (only the variables that are set):

    EAGLE3_ENDPOINT_WAIT_S   seconds a generations step waits for a routable endpoint, once (default 600)
    EAGLE3_STREAM            stream /generate (SSE, stall detection); 0 for one JSON answer (default 1)
    EAGLE3_STALL_TIMEOUT_S   silence between stream chunks that counts as a stall (default 300)
    EAGLE3_ALLOW_OLD_SGLANG  1: accept servers older than 0.5.9 (default: refused)
    """
    out: dict[str, object] = {}
    wait = _float_env("EAGLE3_ENDPOINT_WAIT_S", minimum=0)
    if wait is not None:
        out["wait_for_endpoint_s"] = wait
    stall = _float_env("EAGLE3_STALL_TIMEOUT_S", minimum=0)
    if stall is not None:
        out["stall_timeout_s"] = stall
    stream = _bool_env("EAGLE3_STREAM")
    if stream is not None:
        out["stream"] = stream
    old = _bool_env("EAGLE3_ALLOW_OLD_SGLANG")
    if old is not None:
        out["allow_old_server"] = old
    return out


@dataclass(frozen=True)
class Settings:
    data_dir: DataPath  # str() is the OS path, or the URI without query/credentials
    work_dir: Path
    assets_dir: Path
    expectations_dir: Path
    model: str
    tokenizer_override: str | None
    sglang_urls: tuple[str, ...]
    n_shards: int

    @property
    def sources_dir(self) -> Path:
        return self.assets_dir / "sources"

    @property
    def models_dir(self) -> Path:
        return self.assets_dir / "models"


def settings() -> Settings:
    """Read settings now (not at import), so tests and Dagster runs see the current env."""
    urls = tuple(u.strip().rstrip("/") for u in os.environ.get("EAGLE3_SGLANG_URL", "").split(",") if u.strip())
    data_dir = _data_dir_from_env()
    return Settings(
        data_dir=data_dir,
        work_dir=work_dir_for(data_dir),
        assets_dir=_path_from_env("EAGLE3_ASSETS_DIR", PROJECT_ROOT / "assets"),
        expectations_dir=_path_from_env("EAGLE3_EXPECTATIONS_DIR", PROJECT_ROOT / "expectations"),
        model=os.environ.get("EAGLE3_MODEL", "kimi-k2.5"),
        tokenizer_override=os.environ.get("EAGLE3_TOKENIZER") or None,
        sglang_urls=urls or ("http://127.0.0.1:30000",),
        n_shards=int(os.environ.get("EAGLE3_N_SHARDS", "4")),
    )
