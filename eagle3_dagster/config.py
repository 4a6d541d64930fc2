"""Process-wide settings, read from the environment with sane defaults.

One place for every environment variable the project reads, so the README can list them and
tests can override them.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import timedelta
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


# ---------------------------------------------------------------------------------- automation
NIGHTLY_CRON_ENV = "EAGLE3_NIGHTLY_CRON"
NIGHTLY_TZ_ENV = "EAGLE3_NIGHTLY_TZ"
SNAPSHOT_MAX_AGE_ENV = "EAGLE3_SNAPSHOT_MAX_AGE"
SENSOR_INTERVAL_ENV = "EAGLE3_SENSOR_INTERVAL_S"
_CRON_FIELD = re.compile(r"^[0-9A-Za-z*/,\-?LW#]+$")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd])\s*$")


def nightly_cron() -> str:
    """EAGLE3_NIGHTLY_CRON: when the nightly regeneration starts (5-field cron, default 02:00)."""
    raw = os.environ.get(NIGHTLY_CRON_ENV, "").strip() or "0 2 * * *"
    fields = raw.split()
    if len(fields) != 5 or not all(_CRON_FIELD.match(f) for f in fields):
        raise ValueError(f"{NIGHTLY_CRON_ENV} must be a 5-field cron expression such as '0 2 * * *' "
                         f"(minute hour day month weekday), got {raw!r}")
    return " ".join(fields)


def nightly_timezone() -> str:
    """EAGLE3_NIGHTLY_TZ: the IANA time zone the cron is read in (default UTC)."""
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    raw = os.environ.get(NIGHTLY_TZ_ENV, "").strip() or "UTC"
    try:
        ZoneInfo(raw)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"{NIGHTLY_TZ_ENV} must be an IANA time zone such as 'UTC' or 'Europe/Paris', got {raw!r}") from None
    return raw


def parse_duration(raw: str, var: str) -> timedelta:
    m = _DURATION.match(raw)
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"{var} must be a positive duration with a unit s, m, h or d (e.g. '26h', '90m'), got {raw!r}")
    n, unit = float(m.group(1)), m.group(2)
    unit_name = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}[unit]
    return timedelta(**{unit_name: n})


def snapshot_max_age() -> timedelta:
    """EAGLE3_SNAPSHOT_MAX_AGE: the freshness check on training_dataset fails past this age (default 26h)."""
    return parse_duration(os.environ.get(SNAPSHOT_MAX_AGE_ENV, "").strip() or "26h", SNAPSHOT_MAX_AGE_ENV)


def sensor_interval_s() -> int:
    """EAGLE3_SENSOR_INTERVAL_S: minimum seconds between two evaluations of each project sensor (default 30)."""
    raw = os.environ.get(SENSOR_INTERVAL_ENV, "").strip()
    if not raw:
        return 30
    try:
        n = int(raw)
    except ValueError:
        raise ValueError(f"{SENSOR_INTERVAL_ENV} must be a whole number of seconds >= 1, got {raw!r}") from None
    if n < 1:
        raise ValueError(f"{SENSOR_INTERVAL_ENV} must be a whole number of seconds >= 1, got {n}")
    return n


SGLANG_WAIT_ENV = "EAGLE3_SGLANG_WAIT_S"


def sglang_wait_s() -> float | None:
    """EAGLE3_SGLANG_WAIT_S: how long a generation step waits for a routable SGLang endpoint before failing.

    None (unset): the generation default (900 s), long enough for a server restart.
    """
    raw = os.environ.get(SGLANG_WAIT_ENV, "").strip()
    if not raw:
        return None
    try:
        n = float(raw)
    except ValueError:
        raise ValueError(f"{SGLANG_WAIT_ENV} must be a number of seconds > 0, got {raw!r}") from None
    if not n > 0:
        raise ValueError(f"{SGLANG_WAIT_ENV} must be a number of seconds > 0, got {raw!r}")
    return n
