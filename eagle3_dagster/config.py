"""Process-wide settings: ONE typed, validated object read from the environment in one place.

Every environment variable the pipeline reads is read here, and nowhere else (tests/test_layout.py
scans for it; the simulator, a program of its own, reads its own in sim/settings.py), so the README
can list them (tests/test_layout.py compares its table with the Settings fields) and tests can
override them. Domain functions take their values as parameters; the callers (definitions, CLIs,
the demo) pass them from one Settings object. The SGLang API key (SGLANG_API_KEY) is read here too
and handed over as a `Secret` that never prints itself. `settings()` reads the environment now (not at import) and validates
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

from .secret import Secret
from .storage import DataPath, data_root
from .urls import parse_endpoint_urls, redact_url

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
TOKENIZERS_PARALLELISM_ENV = "TOKENIZERS_PARALLELISM"
API_KEY_ENV = "SGLANG_API_KEY"  # the SGLang server's --api-key; a secret


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


def _int(var: str, raw: str, *, minimum: int, note: str = "", maximum: int | None = None, why_max: str = "") -> int:
    allowed = f"an integer >= {minimum}{note}"
    try:
        n = int(raw.strip())
    except ValueError:
        raise _Problem(f"{var} must be {allowed}, got {raw!r}") from None
    if n < minimum:
        raise _Problem(f"{var} must be {allowed}, got {raw!r}")
    if maximum is not None and n > maximum:
        raise _Problem(f"{var} must be at most {maximum}{why_max}, got {raw!r}")
    return n


# Upper bound of EAGLE3_N_SHARDS: every shard is a Dagster partition of every shard asset (runs,
# materializations, sensors and the UI scale with it) and its key has four digits (storage.shard_key).
MAX_N_SHARDS = 4096


def check_n_shards(n: int, var: str = "EAGLE3_N_SHARDS") -> int:
    """`n` if 1 <= n <= MAX_N_SHARDS, else ValueError naming `var`, the value and the bound."""
    try:
        return _n_shards(var, str(n))
    except _Problem as e:
        raise ValueError(str(e)) from None


def _n_shards(var: str, raw: str) -> int:
    return _int(
        var,
        raw,
        minimum=1,
        maximum=MAX_N_SHARDS,
        why_max=" (one Dagster partition per shard; more partitions than this only slow every run and the UI)",
    )


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
            f"got {redact_url(raw)!r}: {e}"
        ) from None


def _urls(raw: str) -> tuple[str, ...]:
    try:
        return parse_endpoint_urls(raw, source="EAGLE3_SGLANG_URL")
    except ValueError as e:
        raise _Problem(str(e)) from None


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
    return work_dir if work_dir is not None else _default_work_dir(data_dir)


def _default_work_dir(data_dir: DataPath) -> Path:
    """The work dir when EAGLE3_WORK_DIR is not set: the data dir if local, else a local scratch folder."""
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
    # TOKENIZERS_PARALLELISM (read by the `tokenizers` Rust library itself): threads over a batch encode/decode
    tokenizers_parallelism: bool = True
    # SGLANG_API_KEY: the Bearer key, a Secret (repr/str masked) handed to GenerationConfig.api_key
    sglang_api_key: Secret | None = None

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
            work_dir=work if work is not None else _default_work_dir(data_dir),  # `env` only, not os.environ
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
            n_shards=get("EAGLE3_N_SHARDS", lambda r: _n_shards("EAGLE3_N_SHARDS", r), 4),
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
            tokenizers_parallelism=get(
                TOKENIZERS_PARALLELISM_ENV, lambda r: _bool(TOKENIZERS_PARALLELISM_ENV, r), True
            ),
            sglang_api_key=get(API_KEY_ENV, Secret, None),  # never echoed in a message, not even when bad
        )
        if problems:
            raise SettingsError(problems)
        return cls(**values)


SHARED_TOKENIZERS_DIR = PROJECT_ROOT.parent / "shared" / "tokenizers"


def project_env_defaults(env: Mapping[str, str]) -> dict[str, str]:
    """The project's environment defaults, for every way in: a plain shell (`eagle3 ...`), the Makefile's
    targets (they all go through `eagle3`, `dg` or pytest, which apply these), and the tests.

    - DAGSTER_HOME: the project-local instance, `./.dagster_home`;
    - EAGLE3_TOKENIZER and HF_HUB_OFFLINE=1: the offline tokenizer in ../shared/tokenizers/<EAGLE3_MODEL>
      when that folder exists (a checkout beside shared/); elsewhere the profile's own location is used.

    Only variables `env` does not set are returned: what a user exported always wins.
    """
    defaults = {"DAGSTER_HOME": str(PROJECT_ROOT / ".dagster_home")}
    shared_tokenizer = SHARED_TOKENIZERS_DIR / (env.get("EAGLE3_MODEL") or "kimi-k2.5")
    if "EAGLE3_TOKENIZER" not in env and shared_tokenizer.is_dir():
        defaults["EAGLE3_TOKENIZER"] = str(shared_tokenizer)
        defaults["HF_HUB_OFFLINE"] = "1"
    return {k: v for k, v in defaults.items() if k not in env}


def apply_project_env_defaults() -> dict[str, str]:
    """Put `project_env_defaults` into this process's environment (and so its children's); returns them."""
    applied = project_env_defaults(os.environ)
    os.environ.update(applied)
    return applied


def settings() -> Settings:
    """Read and validate the settings now (not at import), so tests and Dagster runs see the current env."""
    return Settings.from_env(os.environ)


def child_process_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a child process (`dagster dev` under `eagle3 ui`): ours with `extra` on top.

    Values are handed to children explicitly this way; nothing writes this process's environment.
    """
    env = dict(os.environ)
    env.update(extra or {})
    return env


def set_in_this_process(values: Mapping[str, str]) -> Settings:
    """Set EAGLE3_* variables for this process and the step processes it starts, validated first.

    Only `eagle3 demo --samples` uses it: the partition count and the assets folder are load-time
    settings (they shape the asset graph), so they must be in the environment the definitions load from.
    """
    new = Settings.from_env({**os.environ, **values})  # a bad value fails here, naming the variable
    os.environ.update(values)
    return new


def gx_keep_validations() -> int:
    """EAGLE3_GX_KEEP_VALIDATIONS: GX validation results (+ Data Docs pages) kept per suite; 0 keeps all."""
    return settings().gx_keep_validations


def generation_env(s: Settings | None = None) -> dict[str, object]:
    """GenerationConfig overrides from the settings (only those that are set):

    EAGLE3_ENDPOINT_WAIT_S   seconds a generations step waits for a routable endpoint, once (default 600)
    EAGLE3_STREAM            stream /generate (SSE, stall detection); 0 for one JSON answer (default 1)
    EAGLE3_STALL_TIMEOUT_S   silence between stream chunks that counts as a stall (default 300)
    EAGLE3_ALLOW_OLD_SGLANG  1: accept servers older than 0.5.9 (default: refused)
    SGLANG_API_KEY           the Bearer key (a Secret: masked in repr/str, never in logs/metadata/run config)
    """
    s = s or settings()
    pairs = {
        "api_key": s.sglang_api_key,
        "wait_for_endpoint_s": s.endpoint_wait_s,
        "stream": s.stream,
        "stall_timeout_s": s.stall_timeout_s,
        "allow_old_server": s.allow_old_sglang,
    }
    return {k: v for k, v in pairs.items() if v is not None}


def apply_tokenizers_parallelism(s: Settings | None = None) -> bool:
    """Put the validated TOKENIZERS_PARALLELISM (default true) in the environment, where the `tokenizers`
    Rust library reads it at each batch call: the training stage's batch decode/encode then runs on every
    core (train/parse.py). Set it to 0 to keep a step on one thread. Returns the value applied."""
    s = s or settings()
    os.environ[TOKENIZERS_PARALLELISM_ENV] = "true" if s.tokenizers_parallelism else "false"
    return s.tokenizers_parallelism
