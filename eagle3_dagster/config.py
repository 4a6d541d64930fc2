"""Process-wide settings: ONE typed, validated object read from the environment in one place.

Every environment variable the project reads is read here (the simulator's own flags and the
SGLang API key, a secret the client reads by name, excepted), so the README can list them and
tests can override them. `settings()` reads the environment now (not at import) and validates
every setting at once: a bad value raises SettingsError whose message has one line per problem,
each naming the variable, the bad value and what is allowed:

    EAGLE3_N_SHARDS must be an integer >= 1, got 'abc'

`Settings.from_env(mapping)` does the same for any mapping, so callers can be handed values as
parameters instead of reading the environment themselves.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from .storage import DataPath, data_root

# The project root is the folder holding pyproject.toml; defaults are relative to it so
# `make demo` works from a fresh clone without any configuration.
PROJECT_ROOT = Path(__file__).resolve().parent.parent

GX_KEEP_VALIDATIONS_ENV = "EAGLE3_GX_KEEP_VALIDATIONS"
GX_KEEP_VALIDATIONS_DEFAULT = 20
EXECUTOR_ENV = "EAGLE3_EXECUTOR"
EXECUTOR_CHOICES = ("multiprocess", "in_process", "k8s")
_EXECUTOR_ALIASES = {
    "multiprocess": "multiprocess",
    "default": "multiprocess",
    "in_process": "in_process",
    "k8s": "k8s",
    "k8s_job": "k8s",
}
COMPACT_ENV = "EAGLE3_GENERATION_COMPACT_AFTER_CHUNKS"
SNAPSHOT_RETENTION_ENV = "EAGLE3_SNAPSHOT_RETENTION"
NIGHTLY_CRON_ENV = "EAGLE3_NIGHTLY_CRON"
NIGHTLY_TZ_ENV = "EAGLE3_NIGHTLY_TZ"
SNAPSHOT_MAX_AGE_ENV = "EAGLE3_SNAPSHOT_MAX_AGE"
SNAPSHOT_MAX_AGE_DEFAULT = timedelta(hours=26)
SENSOR_INTERVAL_ENV = "EAGLE3_SENSOR_INTERVAL_S"


class SettingsError(ValueError):
    """Invalid settings. `problems` holds one readable line per bad variable; str() joins them."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


class PartitionKeyError(ValueError):
    """Shard keys that are not partitions of this deployment (EAGLE3_N_SHARDS); raised before any run starts."""


class _Problem(Exception):
    pass


T = TypeVar("T")


def _int(var: str, raw: str, *, minimum: int, note: str = "") -> int:
    allowed = f"an integer >= {minimum}{note}"
    try:
        n = int(raw.strip())
    except ValueError:
        raise _Problem(f"{var} must be {allowed}, got {raw!r}") from None
    if n < minimum:
        raise _Problem(f"{var} must be {allowed}, got {raw!r}")
    return n


def _path(raw: str) -> Path:
    return Path(raw).expanduser().resolve()


def _existing_dir(var: str, raw: str) -> Path:
    p = _path(raw)
    if not p.is_dir():
        raise _Problem(f"{var} must be an existing directory, got {raw!r} ({p} is not a directory)")
    return p


def _data_dir(raw: str) -> DataPath:
    """EAGLE3_DATA_DIR: a local path (default ./data), file://, s3://, gs://, ... or any fsspec URI."""
    try:
        return data_root(raw) if "://" in raw else data_root(_path(raw))
    except Exception as e:  # any refusal (credentials in the URI, unknown scheme) is a settings error
        raise _Problem(
            f"EAGLE3_DATA_DIR must be a local path or a storage URI (s3://, gs://, file://, ...), "
            f"got {_redact(raw)!r}: {e}"
        ) from None


def _redact(raw: str) -> str:
    """A URI without user info and query (where credentials could hide), for messages."""
    if "://" not in raw:
        return raw
    parts = urlsplit(raw)
    host = parts.hostname or ""
    return f"{parts.scheme}://{host}{':' + str(parts.port) if parts.port else ''}{parts.path}"


def _urls(raw: str) -> tuple[str, ...]:
    urls = tuple(u.strip().rstrip("/") for u in raw.split(",") if u.strip())
    for u in urls:
        try:
            parts = urlsplit(u)
            ok = parts.scheme in ("http", "https") and bool(parts.hostname) and (parts.port is None or parts.port > 0)
        except ValueError:
            ok = False
        if not ok:
            raise _Problem(f"EAGLE3_SGLANG_URL must be comma-separated http(s)://host:port URLs, got {_redact(u)!r}")
    return urls


def _executor(raw: str) -> str:
    name = raw.strip().lower().replace("-", "_")
    if name not in _EXECUTOR_ALIASES:
        raise _Problem(f"{EXECUTOR_ENV} must be one of {', '.join(EXECUTOR_CHOICES)}, got {raw!r}")
    return _EXECUTOR_ALIASES[name]


def _cron(raw: str) -> str:
    import dagster as dg  # the public API: a schedule definition refuses an invalid cron string

    try:
        dg.ScheduleDefinition(name="cron_check", cron_schedule=raw.strip(), job_name="cron_check")
        valid = True
    except dg.DagsterInvalidDefinitionError:
        valid = False
    if not valid:
        raise _Problem(f"{NIGHTLY_CRON_ENV} must be a 5-field cron expression such as '0 2 * * *', got {raw!r}")
    return raw.strip()


def _tz(raw: str) -> str:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        ZoneInfo(raw.strip())
    except (ZoneInfoNotFoundError, ValueError):
        raise _Problem(
            f"{NIGHTLY_TZ_ENV} must be an IANA time zone such as 'UTC' or 'Europe/Paris', got {raw!r}"
        ) from None
    return raw.strip()


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd])\s*$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def _duration(var: str, raw: str) -> timedelta:
    m = _DURATION.match(raw)
    if not m or float(m.group(1)) <= 0:
        raise _Problem(f"{var} must be a positive duration with a unit s, m, h or d (e.g. '26h', '90m'), got {raw!r}")
    return timedelta(**{_UNITS[m.group(2)]: float(m.group(1))})


def _positive_seconds(var: str, raw: str) -> float:
    try:
        n = float(raw.strip())
    except ValueError:
        raise _Problem(f"{var} must be a number of seconds > 0, got {raw!r}") from None
    if not n > 0:
        raise _Problem(f"{var} must be a number of seconds > 0, got {raw!r}")
    return n


def _tokenizer(raw: str) -> str:
    # A hub repo id ("org/name") or a local folder; a value that is clearly a path must exist.
    if raw.startswith(("/", "./", "../", "~")) and not _path(raw).is_dir():
        raise _Problem(
            f"EAGLE3_TOKENIZER must be a tokenizer folder or a hub repo id (org/name), got {raw!r} (no such directory)"
        )
    return raw


def _model(raw: str) -> str:
    if not re.match(r"^[\w.@/~+-][\w .@/~+-]*$", raw):
        raise _Problem(
            f"EAGLE3_MODEL must be a model profile name (assets/models/<name>.yaml) or a YAML path, got {raw!r}"
        )
    return raw


def _seconds(var: str, raw: str) -> float:
    try:
        v = float(raw.strip())
    except ValueError:
        raise _Problem(f"{var} must be a number of seconds > 0, got {raw!r}") from None
    if not v > 0:
        raise _Problem(f"{var} must be a number of seconds > 0, got {raw!r}")
    return v


def _bool(var: str, raw: str) -> bool:
    v = raw.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise _Problem(f"{var} must be one of 1/0, true/false, yes/no, on/off; got {raw!r}")


def work_dir_for(data_dir: DataPath, work_dir: Path | None = None) -> Path:
    """Local scratch for what cannot live in object storage (GX file context + Data Docs, shard locks).

    EAGLE3_WORK_DIR if set; else the data directory itself when it is local (layout unchanged);
    else `.eagle3_work/` in the project root (a checkout), or `$TMPDIR/eagle3-work` when the package
    is installed without one (never inside site-packages).
    """
    if work_dir is None:
        raw = os.environ.get("EAGLE3_WORK_DIR")
        work_dir = _path(raw) if raw else None
    if work_dir is not None:
        return work_dir
    if data_dir.is_local:
        return data_dir.local_path
    if (PROJECT_ROOT / "pyproject.toml").exists():
        return PROJECT_ROOT / ".eagle3_work"
    import tempfile

    return Path(tempfile.gettempdir()) / "eagle3-work"


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
    sglang_url_configured: bool = False  # EAGLE3_SGLANG_URL was set (else the default URL / a demo simulator)
    executor: str = "multiprocess"  # one of EXECUTOR_CHOICES
    gx_keep_validations: int = GX_KEEP_VALIDATIONS_DEFAULT  # 0 keeps all
    generation_compact_after_chunks: int | None = None  # None: unset (GenerationConfig's default); 0: never
    snapshot_retention: int = 7
    nightly_cron: str = "0 2 * * *"
    nightly_tz: str = "UTC"
    snapshot_max_age: timedelta = SNAPSHOT_MAX_AGE_DEFAULT  # the training_dataset freshness check fails past it
    sensor_interval_s: int = 30  # minimum seconds between evaluations of each project sensor
    dagster_home: Path = PROJECT_ROOT / ".dagster_home"
    # generation client (None: unset, GenerationConfig's default)
    endpoint_wait_s: float | None = None  # EAGLE3_ENDPOINT_WAIT_S: one bounded wait for a routable endpoint per step
    stream: bool | None = None  # EAGLE3_STREAM: SSE with stall detection (default on)
    stall_timeout_s: float | None = None  # EAGLE3_STALL_TIMEOUT_S: silence between chunks that is a stall
    allow_old_sglang: bool | None = None  # EAGLE3_ALLOW_OLD_SGLANG: accept /server_info versions < 0.5.9

    @property
    def sources_dir(self) -> Path:
        return self.assets_dir / "sources"

    @property
    def models_dir(self) -> Path:
        return self.assets_dir / "models"

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        """Read and validate every setting from `env`; raise SettingsError listing every bad one."""
        problems: list[str] = []

        def get(var: str, parse: Callable[[str], T], default: T) -> T:
            raw = env.get(var)
            if raw is None or not raw.strip():
                return default
            try:
                return parse(raw)
            except _Problem as p:
                problems.append(str(p))
                return default

        data_dir = get("EAGLE3_DATA_DIR", _data_dir, None) or data_root(PROJECT_ROOT / "data")
        work = get("EAGLE3_WORK_DIR", _path, None)
        urls: tuple[str, ...] = get("EAGLE3_SGLANG_URL", _urls, ())
        values: dict[str, Any] = dict(
            data_dir=data_dir,
            work_dir=work_dir_for(data_dir, work),
            assets_dir=get(
                "EAGLE3_ASSETS_DIR", lambda r: _existing_dir("EAGLE3_ASSETS_DIR", r), PROJECT_ROOT / "assets"
            ),
            expectations_dir=get(
                "EAGLE3_EXPECTATIONS_DIR",
                lambda r: _existing_dir("EAGLE3_EXPECTATIONS_DIR", r),
                PROJECT_ROOT / "expectations",
            ),
            model=get("EAGLE3_MODEL", _model, "kimi-k2.5"),
            tokenizer_override=get("EAGLE3_TOKENIZER", _tokenizer, None),
            sglang_urls=urls or ("http://127.0.0.1:30000",),
            sglang_url_configured=bool(urls),
            n_shards=get("EAGLE3_N_SHARDS", lambda r: _int("EAGLE3_N_SHARDS", r, minimum=1), 4),
            executor=get(EXECUTOR_ENV, _executor, "multiprocess"),
            gx_keep_validations=get(
                GX_KEEP_VALIDATIONS_ENV,
                lambda r: _int(GX_KEEP_VALIDATIONS_ENV, r, minimum=0, note=" (0 = keep all)"),
                GX_KEEP_VALIDATIONS_DEFAULT,
            ),
            generation_compact_after_chunks=get(
                COMPACT_ENV, lambda r: _int(COMPACT_ENV, r, minimum=0, note=" (0 = never compact)"), None
            ),
            snapshot_retention=get(SNAPSHOT_RETENTION_ENV, lambda r: _int(SNAPSHOT_RETENTION_ENV, r, minimum=1), 7),
            nightly_cron=get(NIGHTLY_CRON_ENV, _cron, "0 2 * * *"),
            nightly_tz=get(NIGHTLY_TZ_ENV, _tz, "UTC"),
            snapshot_max_age=get(
                SNAPSHOT_MAX_AGE_ENV, lambda r: _duration(SNAPSHOT_MAX_AGE_ENV, r), SNAPSHOT_MAX_AGE_DEFAULT
            ),
            sensor_interval_s=get(SENSOR_INTERVAL_ENV, lambda r: _int(SENSOR_INTERVAL_ENV, r, minimum=1), 30),
            dagster_home=get("DAGSTER_HOME", _path, PROJECT_ROOT / ".dagster_home"),
            endpoint_wait_s=get("EAGLE3_ENDPOINT_WAIT_S", lambda r: _seconds("EAGLE3_ENDPOINT_WAIT_S", r), None),
            stream=get("EAGLE3_STREAM", lambda r: _bool("EAGLE3_STREAM", r), None),
            stall_timeout_s=get("EAGLE3_STALL_TIMEOUT_S", lambda r: _seconds("EAGLE3_STALL_TIMEOUT_S", r), None),
            allow_old_sglang=get("EAGLE3_ALLOW_OLD_SGLANG", lambda r: _bool("EAGLE3_ALLOW_OLD_SGLANG", r), None),
        )
        if problems:
            raise SettingsError(problems)
        return cls(**values)


def settings() -> Settings:
    """Read and validate the settings now (not at import), so tests and Dagster runs see the current env."""
    return Settings.from_env(os.environ)


def gx_keep_validations() -> int:
    """EAGLE3_GX_KEEP_VALIDATIONS: GX validation results (+ Data Docs pages) kept per suite; 0 keeps all."""
    return settings().gx_keep_validations


def generation_env(s: Settings | None = None) -> dict[str, object]:
    """GenerationConfig overrides from the settings (only those that are set):

    EAGLE3_ENDPOINT_WAIT_S   seconds a generations step waits for a routable endpoint, once (default 600)
    EAGLE3_STREAM            stream /generate (SSE, stall detection); 0 for one JSON answer (default 1)
    EAGLE3_STALL_TIMEOUT_S   silence between stream chunks that counts as a stall (default 300)
    EAGLE3_ALLOW_OLD_SGLANG  1: accept servers older than 0.5.9 (default: refused)
    """
    s = s or settings()
    pairs = {
        "wait_for_endpoint_s": s.endpoint_wait_s,
        "stream": s.stream,
        "stall_timeout_s": s.stall_timeout_s,
        "allow_old_server": s.allow_old_sglang,
    }
    return {k: v for k, v in pairs.items() if v is not None}
