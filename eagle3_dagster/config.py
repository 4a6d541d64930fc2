"""Process-wide settings: ONE typed, validated object read from the environment in one place.

Every environment variable the pipeline reads is read here, and nowhere else (tests/test_layout.py
scans for it; the simulator, a program of its own, reads its own in sim/settings.py). Each setting is
declared once, as a field of `Settings` (its metadata a `SettingSpec`): its variable, default, parser (with its
bounds), section and meaning together; `Settings.from_env`, the generated reference page
(docs/reference/configuration.md, devtools/docs_gen.py) and the tests all read those declarations. Domain
functions take their values as parameters; the callers (definitions, CLIs, the demo) pass them from one
Settings object. The SGLang API key (SGLANG_API_KEY) is handed over as a `Secret` that never prints
itself. A bad value raises SettingsError whose message has one line per problem, each naming the
variable, the bad value and what is allowed:

    EAGLE3_N_SHARDS must be an integer >= 1, got 'abc'
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import Field, dataclass, field, fields
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

from .secret import Secret
from .spelling import did_you_mean
from .storage import DataPath, data_root
from .urls import Endpoints, credentials_conflict, parse_endpoint_urls, redact_url

# The project root is the folder holding pyproject.toml; defaults are relative to it so
# `make demo` works from a fresh clone without any configuration.
PROJECT_ROOT = Path(__file__).resolve().parent.parent

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
NIGHTLY_CRON_ENV = "EAGLE3_NIGHTLY_CRON"
NIGHTLY_TZ_ENV = "EAGLE3_NIGHTLY_TZ"
SNAPSHOT_MAX_AGE_DEFAULT = timedelta(hours=26)
TOKENIZERS_PARALLELISM_ENV = "TOKENIZERS_PARALLELISM"
API_KEY_ENV = "SGLANG_API_KEY"  # the SGLang server's --api-key; a secret


class SettingsError(ValueError):
    """Invalid settings. `problems` holds one readable line per bad variable; str() joins them."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


# How close an unknown EAGLE3_* variable must be to a setting to be taken for its typo (a letter missing, added or
# swapped: EAGLE3_N_SHARD, EAGLE3_MODLE, EAGLE3_DATADIR are above it; the test and tool variables of other
# programs, such as EAGLE3_TEST_NIGHTLY_DAEMON or EAGLE3_GPU_MODEL_PATH, are well below).
MISSPELT_VARIABLE_CUTOFF = 0.88


def misspelt_variables(env: Mapping[str, str], known: Iterable[str]) -> list[str]:
    """A line per EAGLE3_* variable of `env` that is no setting but very close to one: a typo would otherwise be
    ignored silently and its setting keep its default. A name close to none is another program's: left alone."""
    names = [k for k in known if k.startswith("EAGLE3_")]
    out = []
    for var in sorted(v for v in env if v.startswith("EAGLE3_") and v not in names):
        hint = did_you_mean(var, names, cutoff=MISSPELT_VARIABLE_CUTOFF)
        if hint and (env.get(var) or "").strip():
            out.append(f"{var} is not a setting{hint}: it would be ignored")
    return out


class PartitionKeyError(ValueError):
    """Shard keys that are not partitions of this deployment (EAGLE3_N_SHARDS); raised before any run starts."""


class _Problem(Exception):
    pass


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


def _urls(raw: str) -> Endpoints:
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


def _tokenizer(raw: str) -> str:
    # A hub repo id ("org/name") or a local folder; a value that is clearly a path must exist.
    if raw.startswith(("/", "./", "../", "~")) and not _path(raw).is_dir():
        raise _Problem(
            f"EAGLE3_TOKENIZER must be a tokenizer folder or a hub repo id (org/name), got {raw!r} (no such directory)"
        )
    return raw


SERVED_MODEL_ENV = "EAGLE3_SERVED_MODEL"


def _served_model(raw: str) -> str:
    v = raw.strip().rstrip("/")
    if not v or any(not c.isprintable() for c in v):
        raise _Problem(
            f"{SERVED_MODEL_ENV} must be the model path the endpoints report in /model_info (a Hugging Face id or "
            f"a folder), got {raw!r}"
        )
    return v


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


DEADLINE_MIN_S = 10.0
DEADLINE_MAX_S = 7 * 24 * 3600.0


def _deadline(var: str, raw: str) -> float:
    v = _seconds(var, raw)
    if not DEADLINE_MIN_S <= v <= DEADLINE_MAX_S:
        raise _Problem(f"{var} must be a number of seconds from {DEADLINE_MIN_S:g} to {DEADLINE_MAX_S:g}, got {raw!r}")
    return v


CONTEXT_OVERFLOW_ENV = "EAGLE3_CONTEXT_OVERFLOW"
CONTEXT_OVERFLOW_CHOICES = ("fit", "skip")


def _context_overflow(raw: str) -> str:
    v = raw.strip().lower()
    if v not in CONTEXT_OVERFLOW_CHOICES:
        raise _Problem(f"{CONTEXT_OVERFLOW_ENV} must be one of {', '.join(CONTEXT_OVERFLOW_CHOICES)}, got {raw!r}")
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


RUN_START = "run start"
_SCALE_OUT = "../scale-out.md"  # relative to docs/reference/, where the reference page is written


@dataclass(frozen=True)
class SettingSpec:
    """How one `Settings` field is read from the environment, and what the reference page says about it."""

    env: str  # the environment variable
    parse: Callable[[str, str], Any]  # (variable, non-blank raw value) -> value; raises _Problem
    meaning: str  # Markdown
    per_run: (
        str  # how it changes for one run: a resource field (`sglang.urls`), "load time (...)", RUN_START or "never ..."
    )
    default_doc: str | None = None  # Markdown, when the default is not shown by its value alone
    # for a field whose default is None ("unset"): the GenerationConfig field whose default then applies
    default_from: str | None = None


SPEC_KEY = "setting"
DERIVED_KEY = "derived"


def _declares(spec: SettingSpec) -> dict[str, SettingSpec]:
    """The metadata of a `Settings` field read from a variable: the field holds the default, this the rest."""
    return {SPEC_KEY: spec}


def _parse_with(fn: Callable[..., Any]) -> Callable[[str, str], Any]:
    """A parser that needs no variable name (its messages name their variable themselves)."""
    return lambda _var, raw: fn(raw)


@dataclass(frozen=True)
class FleetSettings:
    """The SGLang endpoints and their key, and how the client waits for them, streams, and treats prompts too long for them."""

    SECTION: ClassVar[str] = "SGLang fleet"

    sglang_urls: Endpoints = field(
        default=parse_endpoint_urls("http://127.0.0.1:30000"),
        metadata=_declares(
            SettingSpec(
                "EAGLE3_SGLANG_URL",
                _parse_with(_urls),
                "SGLang server(s) or an sglang-router, comma-separated `http(s)://host:port` URLs; a "
                "`user:password@` is sent as Basic auth (never printed: refused next to `SGLANG_API_KEY`, which it "
                "would replace, and then not bound into run config)",
                "`sglang.urls`",
                default_doc="simulator (demo) / `http://127.0.0.1:30000`",
            )
        ),
    )
    sglang_api_key: Secret | None = field(
        default=None,
        metadata=_declares(
            SettingSpec(
                API_KEY_ENV,
                _parse_with(Secret),  # never echoed in a message, not even when bad
                "bearer key for the server; read by the settings module only and handed to the client as a masked "
                "`Secret`: never in logs, metadata, run config or data (server texts quoting it are redacted)",
                "never (a secret: the environment of the run only)",
                default_doc="unset",
            )
        ),
    )
    endpoint_wait_s: float | None = field(
        default=None,
        metadata=_declares(
            SettingSpec(
                "EAGLE3_ENDPOINT_WAIT_S",
                _seconds,
                "how long the `generations` steps wait for a routable endpoint — once per graph run (a demo, a "
                "nightly, a backfill): when it runs out in one shard, the run's other shards fail at once with the "
                "same line (generate/run_wait.py); every endpoint and its state (`connection refused`, `not an SGLang "
                "server: /model_info answered text/html`, `/health 503`, `router has no ready worker`) is logged at "
                "once and every 25 s, then the step fails naming them all",
                "`sglang.wait_for_endpoint_s`",
                default_doc="`600` (the nightly, runs launched from the UI); `15` for `eagle3 demo`",
                default_from="wait_for_endpoint_s",
            )
        ),
    )
    stream: bool | None = field(
        default=None,
        metadata=_declares(
            SettingSpec(
                "EAGLE3_STREAM",
                _bool,
                "stream `/generate` (SSE) so a request that goes quiet is caught by `EAGLE3_STALL_TIMEOUT_S`; `0`: one "
                "JSON answer, bounded only by the 3600 s read timeout",
                "`sglang.stream`",
                default_doc="`1` (`True`)",
                default_from="stream",
            )
        ),
    )
    stall_timeout_s: float | None = field(
        default=None,
        metadata=_declares(
            SettingSpec(
                "EAGLE3_STALL_TIMEOUT_S",
                _seconds,
                "silence between stream chunks that counts as a stalled request: it is aborted and retried with a new "
                "rid. Chunks come every `stream_interval` tokens (about 4 per sample, 16-2048 tokens), so this must "
                "exceed that many tokens at the fleet's slowest per-request speed",
                "`sglang.stall_timeout_s`",
                default_from="stall_timeout_s",
            )
        ),
    )
    request_deadline_s: float | None = field(
        default=None,
        metadata=_declares(
            SettingSpec(
                "EAGLE3_REQUEST_DEADLINE_S",
                _deadline,
                "the overall deadline of one `/generate` request: its attempts, their queueing and backoff together "
                "end by it, and the sample fails with reason `request_deadline` (retried by the next run). Per-read "
                "and stall timeouts cannot end an answer that trickles a byte every few seconds and never finishes; "
                "this does. Long reasoning answers take many minutes (a queue wait of up to the first-chunk limit, "
                f"1800 s, plus the decode): keep it well above them. From {DEADLINE_MIN_S:g} s to "
                f"{DEADLINE_MAX_S:g} s (a week)",
                RUN_START,
                default_doc="`10800` (3 h)",
                default_from="request_deadline_s",
            )
        ),
    )
    context_overflow: str | None = field(
        default=None,
        metadata=_declares(
            SettingSpec(
                CONTEXT_OVERFLOW_ENV,
                _parse_with(_context_overflow),
                "a prompt shorter than the server's context length whose prompt + `max_new_tokens` exceeds it (SGLang "
                "answers such a request 400): `fit` sends it with `max_new_tokens` lowered to context - prompt tokens "
                "(what `--allow-auto-truncate` would do, done by the client: its cache key has that budget); `skip` "
                "does not send it and records a `context_overflow` failure. Both are counted (`context_fitted`, "
                "`context_overflow_skipped`), see [SGLang](../sglang.md)",
                "`sglang.context_overflow`",
                default_from="context_overflow",
            )
        ),
    )
    allow_old_sglang: bool | None = field(
        default=None,
        metadata=_declares(
            SettingSpec(
                "EAGLE3_ALLOW_OLD_SGLANG",
                _bool,
                "`1` accepts servers whose `/server_info` version is older than 0.5.9 (refused by default: older "
                "releases can put prompt-tail ids at the front of `output_ids`)",
                RUN_START,
                default_doc="unset (`False`)",
                default_from="allow_old_server",
            )
        ),
    )


@dataclass(frozen=True)
class ModelSettings:
    """The model profile, the tokenizer folder that may replace its own, and the served model the user pins."""

    SECTION: ClassVar[str] = "Model"

    model: str = field(
        default="kimi-k2.5",
        metadata=_declares(
            SettingSpec(
                "EAGLE3_MODEL",
                _parse_with(_model),
                "model profile name in `assets/models/` (or a YAML path)",
                "`pipeline.model`",
            )
        ),
    )
    served_model: str | None = field(
        default=None,
        metadata=_declares(
            SettingSpec(
                SERVED_MODEL_ENV,
                _parse_with(_served_model),
                "the `model_path` every endpoint must report in `/model_info` (a local folder, a fine-tune of the "
                "profile's model): endpoints serving another path are refused, and this one is used even when its "
                "`model_type` is not one of the profile's `model_types` (a warning names both). Unset: an endpoint "
                "is refused when its `model_type` is not the profile's, or its `model_path` not the profile's "
                "`model_path` where the profile pins one. The data card states the pin "
                "([SGLang](../sglang.md#which-model-an-endpoint-serves))",
                RUN_START,
                default_doc="unset (the profile's `model_types` / `model_path` decide)",
            )
        ),
    )
    tokenizer_override: str | None = field(
        default=None,
        metadata=_declares(
            SettingSpec(
                "EAGLE3_TOKENIZER",
                _parse_with(_tokenizer),
                "tokenizer folder or Hugging Face id",
                "`pipeline.tokenizer`",
                default_doc="`../shared/tokenizers/<model>` when that folder exists (then also `HF_HUB_OFFLINE=1`), "
                "else the profile's `tokenizer`",
            )
        ),
    )


@dataclass(frozen=True)
class StorageSettings:
    """Where the data, the work files, the asset YAMLs and the expectation suites live."""

    SECTION: ClassVar[str] = "Storage"

    data_dir: DataPath = field(
        default=data_root(PROJECT_ROOT / "data"),
        metadata=_declares(
            SettingSpec(
                "EAGLE3_DATA_DIR",
                _parse_with(_data_dir),
                "where every table is written: a local path or a URI — `s3://bucket/prefix?region=…` (S3-compatible "
                "stores with `&endpoint_override=host:port&scheme=http`), `gs://…`, `abfs://…`, any fsspec protocol; "
                "credentials only from the provider's environment (`AWS_ACCESS_KEY_ID`, …), never in the URI "
                f"([scale-out §5]({_SCALE_OUT}#5-data-in-object-storage))",
                "`pipeline.data_dir`",
                default_doc="`./data`",
            )
        ),
    )
    # when unset: the data dir if local, else a local scratch folder (from_env)
    work_dir: Path = field(
        default=PROJECT_ROOT / "data",
        metadata=_declares(
            SettingSpec(
                "EAGLE3_WORK_DIR",
                _parse_with(_path),
                "local scratch that never goes to object storage: the GX file context and Data Docs (`gx/`), "
                "generation shard locks",
                "`pipeline.work_dir`",
                default_doc="the data dir if local, else `./.eagle3_work` (`$TMPDIR/eagle3-work` outside a checkout)",
            )
        ),
    )
    assets_dir: Path = field(
        default=PROJECT_ROOT / "assets",
        metadata=_declares(
            SettingSpec(
                "EAGLE3_ASSETS_DIR",
                _existing_dir,
                "folder of `sources/*.yaml` and `models/*.yaml`; a source's `path:` is a local file/glob or a URI "
                "(`s3://bucket/x/*.jsonl.gz?region=…`, `gs://…`, `memory://…`; "
                f"[scale-out §5]({_SCALE_OUT}#prompt-sources-in-object-storage))",
                "`pipeline.assets_dir` (model profiles); the source list: load time",
                default_doc="`./assets`",
            )
        ),
    )
    expectations_dir: Path = field(
        default=PROJECT_ROOT / "expectations",
        metadata=_declares(
            SettingSpec(
                "EAGLE3_EXPECTATIONS_DIR",
                _existing_dir,
                "the GX suites ([gates reference](gates.md))",
                "`pipeline.expectations_dir`",
                default_doc="`./expectations`",
            )
        ),
    )


@dataclass(frozen=True)
class ShardSettings:
    """The shard partitions, the nightly schedule and its freshness check, the sensors, the step executor."""

    SECTION: ClassVar[str] = "Shards and schedule"

    n_shards: int = field(
        default=4,
        metadata=_declares(
            SettingSpec(
                "EAGLE3_N_SHARDS",
                _n_shards,
                "shard partitions (`hash(prompt_id) % n`), 1 to 4096 (`config.MAX_N_SHARDS`: each shard is a Dagster "
                "partition)",
                "load time (the partitions)",
            )
        ),
    )
    nightly_cron: str = field(
        default="0 2 * * *",
        metadata=_declares(
            SettingSpec(
                NIGHTLY_CRON_ENV,
                _parse_with(_cron),
                "when the nightly regeneration starts (5-field cron)",
                "load time (the schedule)",
            )
        ),
    )
    nightly_tz: str = field(
        default="UTC",
        metadata=_declares(
            SettingSpec(
                NIGHTLY_TZ_ENV,
                _parse_with(_tz),
                "the time zone `EAGLE3_NIGHTLY_CRON` is read in (IANA name)",
                "load time (the schedule)",
            )
        ),
    )
    snapshot_max_age: timedelta = field(
        default=SNAPSHOT_MAX_AGE_DEFAULT,
        metadata=_declares(
            SettingSpec(
                "EAGLE3_SNAPSHOT_MAX_AGE",
                _duration,
                "the `training_dataset` freshness check fails when the last publish is older (`s`/`m`/`h`/`d`)",
                "load time (the freshness check)",
                default_doc="`26h`",
            )
        ),
    )
    sensor_interval_s: int = field(
        default=30,
        metadata=_declares(
            SettingSpec(
                "EAGLE3_SENSOR_INTERVAL_S",
                partial(_int, minimum=1),
                "minimum seconds between evaluations of each of the project's sensors",
                "load time (the sensors)",
            )
        ),
    )
    executor: str = field(
        default="multiprocess",
        metadata=_declares(
            SettingSpec(
                EXECUTOR_ENV,
                _parse_with(_executor),
                "step executor of the jobs: `multiprocess`, `in_process`, or `k8s` (one pod per step; "
                '`pip install ".[k8s]"`)',
                "load time (run config can configure the executor, not choose it)",
            )
        ),
    )


@dataclass(frozen=True)
class StageSettings:
    """What the stages keep and how they work: compaction, validation and snapshot retention, tokenizer threads, acceptance columns."""

    SECTION: ClassVar[str] = "Stage behaviour"

    generation_compact_after_chunks: int | None = field(
        default=None,
        metadata=_declares(
            SettingSpec(
                COMPACT_ENV,
                partial(_int, minimum=0, note=" (0 = never compact)"),
                "after a successful `generations` shard run with more than this many chunk files, merge them into one "
                "(crash-safe: one new chunk, then the old ones are deleted; readers see the same rows throughout); "
                "`0` never compacts",
                RUN_START,
                default_from="compact_after_chunks",
            )
        ),
    )
    gx_keep_validations: int = field(
        default=GX_KEEP_VALIDATIONS_DEFAULT,
        metadata=_declares(
            SettingSpec(
                "EAGLE3_GX_KEEP_VALIDATIONS",
                partial(_int, minimum=0, note=" (0 = keep all)"),
                "GX validation results kept per gate suite in the work dir's GX context (older results and their Data "
                "Docs pages are pruned when the Data Docs index is rebuilt, under the context lock: at most every 30 s "
                "during a run and at its end, so up to 30 s of newer results can be kept beyond the count until then; "
                "every run without Data Docs prunes its own suite); `0` keeps all",
                RUN_START,
            )
        ),
    )
    snapshot_retention: int = field(
        default=7,
        metadata=_declares(
            SettingSpec(
                "EAGLE3_SNAPSHOT_RETENTION",
                partial(_int, minimum=1),
                "published snapshots kept (older ones are deleted after a publish; never the one `LATEST` names)",
                RUN_START,
            )
        ),
    )
    tokenizers_parallelism: bool = field(
        default=True,
        metadata=_declares(
            SettingSpec(
                TOKENIZERS_PARALLELISM_ENV,  # read by the `tokenizers` Rust library itself at each batch call
                _bool,
                "threads of the `tokenizers` Rust library (its batch decode/encode) where the `training_samples` "
                "round trip uses it; the round trip normally goes through an exact `tiktoken` twin of a byte-level BPE "
                "tokenizer (`tokenize/fast_bpe.py`, probed against the tokenizer at load, else the `tokenizers` path "
                "with one log line naming why), which runs on one thread whatever this says",
                RUN_START,
                default_doc="`true` (`True`)",
            )
        ),
    )
    train_acceptance: bool = field(
        default=False,
        metadata=_declares(
            SettingSpec(
                "EAGLE3_TRAIN_ACCEPTANCE",
                _bool,
                "`1`: the `training_samples` tables, the snapshot and the `input_ids` + `loss_mask` export "
                "(`specforge_prompts.jsonl`) carry each row's `spec_accept_rate` and `spec_accept_length`: the "
                "drafter's acceptance the speculating server reported when the row was generated (null where it did "
                "not speculate), to weight or oversample the rows the drafter finds hard ([drafter](../drafter.md))",
                RUN_START,
                default_doc="`0` (`False`)",
            )
        ),
    )


@dataclass(frozen=True)
class DagsterSettings:
    """The Dagster instance's folder."""

    SECTION: ClassVar[str] = "Dagster"

    dagster_home: Path = field(
        default=PROJECT_ROOT / ".dagster_home",
        metadata=_declares(
            SettingSpec(
                "DAGSTER_HOME",
                _parse_with(_path),
                "the Dagster instance (`eagle3 check` creates its storage once, under a file lock)",
                "never (the instance itself)",
                default_doc="`./.dagster_home`",
            )
        ),
    )


# The sections, in the order of the reference page: one typed model each, its fields declared once (the value's type
# and default, and in its SettingSpec the variable, parser and bounds, and meaning).
SETTINGS_SECTIONS = (FleetSettings, ModelSettings, StorageSettings, ShardSettings, StageSettings, DagsterSettings)
SECTIONS = tuple(section.SECTION for section in SETTINGS_SECTIONS)


@dataclass(frozen=True)
class Settings(DagsterSettings, StageSettings, ShardSettings, StorageSettings, ModelSettings, FleetSettings):
    """Every setting: the fields of the section models above (declaration order: fleet first), read from the
    environment by `Settings.from_env` / `settings()`."""

    # Derived: EAGLE3_SGLANG_URL was set (else the default URL / a demo simulator)
    sglang_url_configured: bool = field(default=False, metadata={DERIVED_KEY: "EAGLE3_SGLANG_URL is set"})

    @property
    def sources_dir(self) -> Path:
        return self.assets_dir / "sources"

    @property
    def models_dir(self) -> Path:
        return self.assets_dir / "models"

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        """Read and validate every setting from `env`; raise SettingsError listing every bad one."""
        problems: list[str] = misspelt_variables(env, [spec.env for _, spec in setting_fields()])
        read = {f.name: _read(env, spec, problems) for f, spec in setting_fields()}
        values = {name: _default(name) if v is _UNSET else v for name, v in read.items()}
        # a list of blanks (",") is no list: the default URL, as when the variable is unset
        values["sglang_url_configured"] = read["sglang_urls"] is not _UNSET and bool(read["sglang_urls"])
        if not values["sglang_url_configured"]:
            values["sglang_urls"] = _default("sglang_urls")
        if read["work_dir"] is _UNSET:  # from `env` only, never os.environ
            values["work_dir"] = _default_work_dir(values["data_dir"])
        if values["sglang_api_key"] is not None:
            conflict = credentials_conflict(values["sglang_urls"], "EAGLE3_SGLANG_URL")
            if conflict:
                problems.append(conflict)
        if problems:
            raise SettingsError(problems)
        return cls(**values)


def setting_fields() -> list[tuple[Field[Any], SettingSpec]]:
    """Every `Settings` field read from a variable, with its declaration, in declaration order."""
    return [(f, f.metadata[SPEC_KEY]) for f in fields(Settings) if SPEC_KEY in f.metadata]


def section_of(name: str) -> str:
    """The section title of the `Settings` field `name`: the title of the section model that declares it."""
    return next(c.SECTION for c in SETTINGS_SECTIONS if name in {f.name for f in fields(c)})


def derived_fields() -> dict[str, str]:
    """`Settings` fields computed from other settings: name -> what they say."""
    return {f.name: f.metadata[DERIVED_KEY] for f in fields(Settings) if DERIVED_KEY in f.metadata}


_UNSET: Any = object()


def _default(name: str) -> Any:
    return Settings.__dataclass_fields__[name].default


def _read(env: Mapping[str, str], spec: SettingSpec, problems: list[str]) -> Any:
    """One setting's value from `env`, or _UNSET when unset, blank or bad (a bad value adds its problem line)."""
    raw = env.get(spec.env)
    if raw is None or not raw.strip():
        return _UNSET
    try:
        return spec.parse(spec.env, raw)
    except _Problem as p:
        problems.append(str(p))
        return _UNSET


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


_VARIABLES = tuple(spec.env for _, spec in setting_fields())
_cached: tuple[tuple[str | None, ...], Settings] | None = None  # (cwd + the raw variables, what they gave)


def settings() -> Settings:
    """This process's validated settings, read from the environment on first use (never at import) and again
    only when one of the variables `Settings` reads, or the working directory, has changed since
    (a test's monkeypatch): every caller shares one parsed object."""
    global _cached
    raw = (os.getcwd(), *(os.environ.get(var) for var in _VARIABLES))  # relative paths resolve against the cwd
    if _cached is None or _cached[0] != raw:
        _cached = (raw, Settings.from_env(os.environ))  # a SettingsError is raised, never cached
    return _cached[1]


def reset_settings() -> None:
    """Forget the cached settings: the next `settings()` reads and validates again even if no variable changed
    (for tests that change what a setting points at, e.g. remove the assets folder)."""
    global _cached
    _cached = None


# An interactive run (`eagle3 demo`) names a dead endpoint within seconds; the nightly and the runs the UI
# launches wait the long default (a fleet restarting overnight), which EAGLE3_ENDPOINT_WAIT_S sets for both.
INTERACTIVE_ENDPOINT_WAIT_S = 15.0


def interactive_endpoint_wait_s(s: Settings | None = None) -> float:
    """EAGLE3_ENDPOINT_WAIT_S when set, else the short wait of an interactive run."""
    s = s or settings()
    return s.endpoint_wait_s if s.endpoint_wait_s is not None else INTERACTIVE_ENDPOINT_WAIT_S


def child_process_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a child process (`dagster dev` under `eagle3 ui`): ours with `extra` on top.

    Values are handed to children explicitly this way; nothing writes this process's environment.
    """
    env = dict(os.environ)
    env.update(extra or {})
    return env


def apply_tokenizers_parallelism(s: Settings | None = None) -> bool:
    """Put the validated TOKENIZERS_PARALLELISM (default true) in the environment, where the `tokenizers`
    Rust library reads it at each batch call: the training stage's batch decode/encode then runs on every
    core (tokenize/parse.py). Set it to 0 to keep a step on one thread. Returns the value applied."""
    s = s or settings()
    os.environ[TOKENIZERS_PARALLELISM_ENV] = "true" if s.tokenizers_parallelism else "false"
    return s.tokenizers_parallelism
