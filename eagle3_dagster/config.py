"""Process-wide settings: ONE typed, validated object read from the environment in one place.

Every environment variable the pipeline reads is read here, and nowhere else (tests/test_layout.py
scans for it; the simulator, a program of its own, reads its own in sim/settings.py). The settings are
nested sections, one typed model each (`s.fleet.stall_timeout_s`, `s.shards.n_shards`, `s.storage.data_dir`).
Each setting is declared once, by `setting(...)` in its section: its concrete default, its variable, its
parser with its bounds (`Int(1, maximum=4096)`, `Seconds()`, `Choice(("fit", "skip"))`), its meaning and
how it changes for one run, together. `Settings.from_env`, the generated reference page
(docs/reference/configuration.md, devtools/docs_gen.py), the defaults of the resources and of
`GenerationConfig`, and the tests all read those declarations; a section built in code is held to the same
bounds. None is a default only where it is a value of its own (no API key, no pinned model, the profile's
own tokenizer).

`settings()` is called where the app's commands and the definitions start (tests/test_layout.py lists
where); everything below them is handed values: the definitions bind them into the resources and the
step bodies when they are built, so a step sees exactly the settings its definitions were built from.
The SGLang API key (SGLANG_API_KEY) is handed over as a `Secret` that never prints itself. A bad value
raises SettingsError whose message has one line per problem, each naming the variable, the bad value
and what is allowed:

    EAGLE3_N_SHARDS must be an integer >= 1, got 'abc'
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, Field, dataclass, field, fields
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar, Protocol, cast

from .secret import Secret
from .spelling import did_you_mean
from .storage import DataPath, data_root
from .urls import Endpoints, credentials_conflict, parse_endpoint_urls, redact_url

# The project root is the folder holding pyproject.toml; defaults are relative to it so
# `make demo` works from a fresh clone without any configuration.
PROJECT_ROOT = Path(__file__).resolve().parent.parent

URL_ENV = "EAGLE3_SGLANG_URL"
API_KEY_ENV = "SGLANG_API_KEY"  # the SGLang server's --api-key; a secret
ENDPOINT_WAIT_ENV = "EAGLE3_ENDPOINT_WAIT_S"
CONTEXT_OVERFLOW_ENV = "EAGLE3_CONTEXT_OVERFLOW"
SERVED_MODEL_ENV = "EAGLE3_SERVED_MODEL"
WORK_DIR_ENV = "EAGLE3_WORK_DIR"
NIGHTLY_CRON_ENV = "EAGLE3_NIGHTLY_CRON"
NIGHTLY_TZ_ENV = "EAGLE3_NIGHTLY_TZ"
EXECUTOR_ENV = "EAGLE3_EXECUTOR"
TOKENIZERS_PARALLELISM_ENV = "TOKENIZERS_PARALLELISM"


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


# --- the parsers: each reads a variable's text and holds a value to its bounds -------------------------------------


class Parser(Protocol):
    """How a setting's text is read (`__call__`: raises _Problem naming the variable, the text and what is allowed),
    what it allows (`allowed`, for the reference page) and the same bounds on a value given in code (`check`)."""

    @property
    def allowed(self) -> str: ...

    def __call__(self, var: str, raw: str) -> Any: ...

    def check(self, var: str, value: Any) -> None: ...


def _got(value: Any, shown: str | None) -> str:
    return repr(shown if shown is not None else value)


@dataclass(frozen=True)
class Int:
    """An integer of at least `minimum` (and at most `maximum`); `note` says what an edge value means."""

    minimum: int
    maximum: int | None = None
    note: str = ""
    why_max: str = ""

    @property
    def allowed(self) -> str:
        top = f" and <= {self.maximum}" if self.maximum is not None else ""
        return f"an integer >= {self.minimum}{top}{self.note}"

    def __call__(self, var: str, raw: str) -> int:
        try:
            n = int(raw.strip())
        except ValueError:
            raise _Problem(f"{var} must be an integer >= {self.minimum}{self.note}, got {raw!r}") from None
        self._bounds(var, n, raw)
        return n

    def check(self, var: str, value: Any) -> None:
        if not isinstance(value, int) or isinstance(value, bool):
            raise _Problem(f"{var} must be an integer >= {self.minimum}{self.note}, got {value!r}")
        self._bounds(var, value, None)

    def _bounds(self, var: str, n: int, shown: str | None) -> None:
        if n < self.minimum:
            raise _Problem(f"{var} must be an integer >= {self.minimum}{self.note}, got {_got(n, shown)}")
        if self.maximum is not None and n > self.maximum:
            raise _Problem(f"{var} must be at most {self.maximum}{self.why_max}, got {_got(n, shown)}")


@dataclass(frozen=True)
class Seconds:
    """A number of seconds > 0; from `minimum` to `maximum` when they are given."""

    minimum: float | None = None
    maximum: float | None = None

    @property
    def allowed(self) -> str:
        if self.minimum is None or self.maximum is None:
            return "a number of seconds > 0"
        return f"a number of seconds from {self.minimum:g} to {self.maximum:g}"

    def __call__(self, var: str, raw: str) -> float:
        try:
            v = float(raw.strip())
        except ValueError:
            raise _Problem(f"{var} must be a number of seconds > 0, got {raw!r}") from None
        self._bounds(var, v, raw)
        return v

    def check(self, var: str, value: Any) -> None:
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise _Problem(f"{var} must be a number of seconds > 0, got {value!r}")
        self._bounds(var, float(value), None)

    def _bounds(self, var: str, v: float, shown: str | None) -> None:
        if not v > 0:
            raise _Problem(f"{var} must be a number of seconds > 0, got {_got(v, shown)}")
        if self.minimum is not None and self.maximum is not None and not self.minimum <= v <= self.maximum:
            raise _Problem(f"{var} must be {self.allowed}, got {_got(v, shown)}")


@dataclass(frozen=True)
class Choice:
    """One of `choices` (case, surrounding spaces and `-` for `_` ignored); `aliases` map other names to one."""

    choices: tuple[str, ...]
    aliases: tuple[tuple[str, str], ...] = ()

    @property
    def allowed(self) -> str:
        return "one of " + ", ".join(f"`{c}`" for c in self.choices)

    def __call__(self, var: str, raw: str) -> str:
        name = raw.strip().lower().replace("-", "_")
        name = dict(self.aliases).get(name, name)
        if name not in self.choices:
            raise _Problem(f"{var} must be one of {', '.join(self.choices)}, got {raw!r}")
        return name

    def check(self, var: str, value: Any) -> None:
        if value not in self.choices:
            raise _Problem(f"{var} must be one of {', '.join(self.choices)}, got {value!r}")


@dataclass(frozen=True)
class Flag:
    """On or off."""

    allowed: str = "`1`/`0`, `true`/`false`, `yes`/`no`, `on`/`off`"

    def __call__(self, var: str, raw: str) -> bool:
        v = raw.strip().lower()
        if v in ("1", "true", "yes", "on"):
            return True
        if v in ("0", "false", "no", "off"):
            return False
        raise _Problem(f"{var} must be one of 1/0, true/false, yes/no, on/off; got {raw!r}")

    def check(self, var: str, value: Any) -> None:
        if not isinstance(value, bool):
            raise _Problem(f"{var} must be on or off (a bool), got {value!r}")


@dataclass(frozen=True)
class Text:
    """A value read by `read(var, raw)` (which raises _Problem naming the variable); `allowed` says what it takes.
    A value given in code is taken as it is (its type says what it is)."""

    read: Callable[[str, str], Any]
    allowed: str

    def __call__(self, var: str, raw: str) -> Any:
        return self.read(var, raw)

    def check(self, var: str, value: Any) -> None:
        return None


def _raw_only(fn: Callable[[str], Any]) -> Callable[[str, str], Any]:
    """A reader that needs no variable name (its messages name their variable themselves)."""
    return lambda _var, raw: fn(raw)


# Upper bound of EAGLE3_N_SHARDS: every shard is a Dagster partition of every shard asset (runs,
# materializations, sensors and the UI scale with it) and its key has four digits (storage.shard_key).
MAX_N_SHARDS = 4096
N_SHARDS = Int(
    1,
    maximum=MAX_N_SHARDS,
    why_max=" (one Dagster partition per shard; more partitions than this only slow every run and the UI)",
)


def check_n_shards(n: int, var: str = "EAGLE3_N_SHARDS") -> int:
    """`n` if 1 <= n <= MAX_N_SHARDS, else ValueError naming `var`, the value and the bound."""
    try:
        N_SHARDS(var, str(n))
    except _Problem as e:
        raise ValueError(str(e)) from None
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
            f"got {redact_url(raw)!r}: {e}"
        ) from None


def _urls(raw: str) -> Endpoints:
    try:
        return parse_endpoint_urls(raw, source=URL_ENV)
    except ValueError as e:
        raise _Problem(str(e)) from None


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


DEADLINE_MIN_S = 10.0
DEADLINE_MAX_S = 7 * 24 * 3600.0
CONTEXT_OVERFLOW_CHOICES = ("fit", "skip")
EXECUTOR_CHOICES = ("multiprocess", "in_process", "k8s")
EXECUTORS = Choice(EXECUTOR_CHOICES, aliases=(("default", "multiprocess"), ("k8s_job", "k8s")))


def work_dir_for(data_dir: DataPath, work_dir: Path | None = None) -> Path:
    """Local scratch for what cannot live in object storage (GX file context + Data Docs, shard locks):
    `work_dir` (EAGLE3_WORK_DIR, a `pipeline.work_dir`) if given; else the data directory itself when it is
    local (layout unchanged); else `.eagle3_work/` in the project root (a checkout), or
    `$TMPDIR/eagle3-work` when the package is installed without one (never inside site-packages)."""
    return work_dir if work_dir is not None else _default_work_dir(data_dir)


def _default_work_dir(data_dir: DataPath) -> Path:
    """The work dir when EAGLE3_WORK_DIR is not set: the data dir if local, else a local scratch folder."""
    if data_dir.is_local:
        return data_dir.local_path
    if (PROJECT_ROOT / "pyproject.toml").exists():
        return PROJECT_ROOT / ".eagle3_work"
    import tempfile

    return Path(tempfile.gettempdir()) / "eagle3-work"


# --- the declarations -----------------------------------------------------------------------------------------------

# How a setting that is no resource field changes: the definitions hand it to the steps that use it when they are
# built (so a code location reload, or a new process such as `eagle3 demo`, picks up a new value).
HANDED_TO_STEPS = "load time (handed to the steps)"
_SCALE_OUT = "../scale-out.md"  # relative to docs/reference/, where the reference page is written


@dataclass(frozen=True)
class SettingSpec:
    """How one setting is read from the environment, its bounds, and what the reference page says about it."""

    env: str  # the environment variable
    parse: Parser  # reads the non-blank text of the variable, holds it (and a value given in code) to its bounds
    meaning: str  # Markdown
    per_run: str  # how it changes for one run: a resource field (`sglang.urls`), "load time (...)" or "never ..."
    default_doc: str | None = None  # Markdown, when the default is not shown by its value alone

    @property
    def allowed(self) -> str:
        return self.parse.allowed


SPEC_KEY = "setting"
DERIVED_KEY = "derived"


def setting(
    default: Any, env: str, parse: Parser, meaning: str, per_run: str, *, default_doc: str | None = None
) -> Any:
    """A field of a settings section: its concrete default, and in its metadata how it is read from `env` (the
    parser and its bounds), what it means and how it changes for one run: the whole declaration in one place."""
    return field(default=default, metadata={SPEC_KEY: SettingSpec(env, parse, meaning, per_run, default_doc)})


class _Section:
    """A settings section: however it is built (from the environment, in code, by dataclasses.replace), every
    field is held to the bounds its declaration states; SettingsError names each value out of them."""

    SECTION: ClassVar[str]  # its title on the reference page

    def __post_init__(self) -> None:
        problems = []
        for f in fields(self):  # type: ignore[arg-type]
            spec = f.metadata.get(SPEC_KEY)
            if spec is None:
                continue
            try:
                spec.parse.check(spec.env, getattr(self, f.name))
            except _Problem as p:
                problems.append(str(p))
        if problems:
            raise SettingsError(problems)


@dataclass(frozen=True)
class FleetSettings(_Section):
    """The SGLang endpoints and their key, and how the client waits for them, streams, and treats prompts too long for them."""

    SECTION: ClassVar[str] = "SGLang fleet"

    urls: Endpoints = setting(
        parse_endpoint_urls("http://127.0.0.1:30000"),
        URL_ENV,
        Text(_raw_only(_urls), "comma-separated `http(s)://host:port` URLs"),
        "SGLang server(s) or an sglang-router, comma-separated `http(s)://host:port` URLs; a "
        "`user:password@` is sent as Basic auth (never printed: refused next to `SGLANG_API_KEY`, which it "
        "would replace, and then not bound into run config)",
        "`sglang.urls`",
        default_doc="simulator (demo) / `http://127.0.0.1:30000`",
    )
    api_key: Secret | None = setting(
        None,
        API_KEY_ENV,
        Text(_raw_only(Secret), "any text (never echoed, not even when refused)"),
        "bearer key for the server; read by the settings module only and handed to the client as a masked "
        "`Secret`: never in logs, metadata, run config or data (server texts quoting it are redacted)",
        "never (a secret: the environment of the code location only)",
        default_doc="unset (no `Authorization` header)",
    )
    wait_for_endpoint_s: float = setting(
        600.0,
        ENDPOINT_WAIT_ENV,
        Seconds(),
        "how long the `generations` steps wait for a routable endpoint — once per graph run (a demo, a "
        "nightly, a backfill): when it runs out in one shard, the run's other shards fail at once with the "
        "same line (generate/run_wait.py); every endpoint and its state (`connection refused`, `not an SGLang "
        "server: /model_info answered text/html`, `/health 503`, `router has no ready worker`) is logged at "
        "once and every 25 s, then the step fails naming them all",
        "`sglang.wait_for_endpoint_s`",
        default_doc="`600` (the nightly, a backfill, runs launched from the UI); `eagle3 demo` waits `15` unless "
        "this is set",
    )
    stream: bool = setting(
        True,
        "EAGLE3_STREAM",
        Flag(),
        "stream `/generate` (SSE) so a request that goes quiet is caught by `EAGLE3_STALL_TIMEOUT_S`; `0`: one "
        "JSON answer, bounded only by the 3600 s read timeout",
        "`sglang.stream`",
        default_doc="`1` (`True`)",
    )
    stall_timeout_s: float = setting(
        300.0,
        "EAGLE3_STALL_TIMEOUT_S",
        Seconds(),
        "silence between stream chunks that counts as a stalled request: it is aborted and retried with a new "
        "rid. Chunks come every `stream_interval` tokens (about 4 per sample, 16-2048 tokens), so this must "
        "exceed that many tokens at the fleet's slowest per-request speed",
        "`sglang.stall_timeout_s`",
    )
    request_deadline_s: float = setting(
        10800.0,
        "EAGLE3_REQUEST_DEADLINE_S",
        Seconds(DEADLINE_MIN_S, DEADLINE_MAX_S),
        "the overall deadline of one `/generate` request: its attempts, their queueing and backoff together "
        "end by it, and the sample fails with reason `request_deadline` (retried by the next run). Per-read "
        "and stall timeouts cannot end an answer that trickles a byte every few seconds and never finishes; "
        "this does. Long reasoning answers take many minutes (a queue wait of up to the first-chunk limit, "
        "1800 s, plus the decode): keep it well above them",
        HANDED_TO_STEPS,
        default_doc="`10800` (3 h)",
    )
    context_overflow: str = setting(
        "fit",
        CONTEXT_OVERFLOW_ENV,
        Choice(CONTEXT_OVERFLOW_CHOICES),
        "a prompt shorter than the server's context length whose prompt + `max_new_tokens` exceeds it (SGLang "
        "answers such a request 400): `fit` sends it with `max_new_tokens` lowered to context - prompt tokens "
        "(what `--allow-auto-truncate` would do, done by the client: its cache key has that budget); `skip` "
        "does not send it and records a `context_overflow` failure. Both are counted (`context_fitted`, "
        "`context_overflow_skipped`), see [SGLang](../sglang.md)",
        "`sglang.context_overflow`",
    )
    allow_old_server: bool = setting(
        False,
        "EAGLE3_ALLOW_OLD_SGLANG",
        Flag(),
        "`1` accepts servers whose `/server_info` version is older than 0.5.9 (refused by default: older "
        "releases can put prompt-tail ids at the front of `output_ids`)",
        HANDED_TO_STEPS,
        default_doc="`0` (`False`)",
    )


@dataclass(frozen=True)
class ModelSettings(_Section):
    """The model profile, the tokenizer folder that may replace its own, and the served model the user pins."""

    SECTION: ClassVar[str] = "Model"

    name: str = setting(
        "kimi-k2.5",
        "EAGLE3_MODEL",
        Text(_raw_only(_model), "a profile name (`assets/models/<name>.yaml`) or a YAML path"),
        "model profile name in `assets/models/` (or a YAML path)",
        "`pipeline.model`",
    )
    served_model: str | None = setting(
        None,
        SERVED_MODEL_ENV,
        Text(_raw_only(_served_model), "a model path as `/model_info` reports it (a Hugging Face id or a folder)"),
        "the `model_path` every endpoint must report in `/model_info` (a local folder, a fine-tune of the "
        "profile's model): endpoints serving another path are refused, and this one is used even when its "
        "`model_type` is not one of the profile's `model_types` (a warning names both). Unset: an endpoint "
        "is refused when its `model_type` is not the profile's, or its `model_path` not the profile's "
        "`model_path` where the profile pins one. The data card states the pin "
        "([SGLang](../sglang.md#which-model-an-endpoint-serves))",
        HANDED_TO_STEPS,
        default_doc="unset (the profile's `model_types` / `model_path` decide)",
    )
    tokenizer_override: str | None = setting(
        None,
        "EAGLE3_TOKENIZER",
        Text(_raw_only(_tokenizer), "an existing folder or a hub repo id (`org/name`)"),
        "tokenizer folder or Hugging Face id",
        "`pipeline.tokenizer`",
        default_doc="`../shared/tokenizers/<model>` when that folder exists (then also `HF_HUB_OFFLINE=1`), "
        "else the profile's `tokenizer`",
    )


@dataclass(frozen=True)
class StorageSettings(_Section):
    """Where the data, the work files, the asset YAMLs and the expectation suites live."""

    SECTION: ClassVar[str] = "Storage"

    data_dir: DataPath = setting(
        data_root(PROJECT_ROOT / "data"),
        "EAGLE3_DATA_DIR",
        Text(_raw_only(_data_dir), "a local path or a storage URI without credentials"),
        "where every table is written: a local path or a URI — `s3://bucket/prefix?region=…` (S3-compatible "
        "stores with `&endpoint_override=host:port&scheme=http`), `gs://…`, `abfs://…`, any fsspec protocol; "
        "credentials only from the provider's environment (`AWS_ACCESS_KEY_ID`, …), never in the URI "
        f"([scale-out §5]({_SCALE_OUT}#5-data-in-object-storage))",
        "`pipeline.data_dir`",
        default_doc="`./data`",
    )
    # when unset: the data dir if local, else a local scratch folder (from_env; work_dir_for)
    work_dir: Path = setting(
        PROJECT_ROOT / "data",
        WORK_DIR_ENV,
        Text(_raw_only(_path), "a local path"),
        "local scratch that never goes to object storage: the GX file context and Data Docs (`gx/`), "
        "generation shard locks",
        "`pipeline.work_dir`",
        default_doc="the data dir if local, else `./.eagle3_work` (`$TMPDIR/eagle3-work` outside a checkout)",
    )
    assets_dir: Path = setting(
        PROJECT_ROOT / "assets",
        "EAGLE3_ASSETS_DIR",
        Text(_existing_dir, "an existing folder"),
        "folder of `sources/*.yaml` and `models/*.yaml`; a source's `path:` is a local file/glob or a URI "
        "(`s3://bucket/x/*.jsonl.gz?region=…`, `gs://…`, `memory://…`; "
        f"[scale-out §5]({_SCALE_OUT}#prompt-sources-in-object-storage))",
        "`pipeline.assets_dir` (model profiles); the source list: load time",
        default_doc="`./assets`",
    )
    expectations_dir: Path = setting(
        PROJECT_ROOT / "expectations",
        "EAGLE3_EXPECTATIONS_DIR",
        Text(_existing_dir, "an existing folder"),
        "the GX suites ([gates reference](gates.md))",
        "`pipeline.expectations_dir`",
        default_doc="`./expectations`",
    )

    @property
    def sources_dir(self) -> Path:
        return self.assets_dir / "sources"

    @property
    def models_dir(self) -> Path:
        return self.assets_dir / "models"


@dataclass(frozen=True)
class ShardSettings(_Section):
    """The shard partitions, the nightly schedule and its freshness check, the sensors."""

    SECTION: ClassVar[str] = "Shards and schedule"

    n_shards: int = setting(
        4,
        "EAGLE3_N_SHARDS",
        N_SHARDS,
        "shard partitions (`hash(prompt_id) % n`), 1 to 4096 (`config.MAX_N_SHARDS`: each shard is a Dagster "
        "partition)",
        "load time (the partitions)",
    )
    nightly_cron: str = setting(
        "0 2 * * *",
        NIGHTLY_CRON_ENV,
        Text(_raw_only(_cron), "a 5-field cron expression"),
        "when the nightly regeneration starts (5-field cron)",
        "load time (the schedule)",
    )
    nightly_tz: str = setting(
        "UTC",
        NIGHTLY_TZ_ENV,
        Text(_raw_only(_tz), "an IANA time zone name"),
        "the time zone `EAGLE3_NIGHTLY_CRON` is read in (IANA name)",
        "load time (the schedule)",
    )
    snapshot_max_age: timedelta = setting(
        timedelta(hours=26),
        "EAGLE3_SNAPSHOT_MAX_AGE",
        Text(_duration, "a positive duration with a unit `s`, `m`, `h` or `d`"),
        "the `training_dataset` freshness check fails when the last publish is older (`s`/`m`/`h`/`d`); the "
        "quality report says the same of `LATEST`",
        "load time (the freshness check, the report)",
        default_doc="`26h`",
    )
    sensor_interval_s: int = setting(
        30,
        "EAGLE3_SENSOR_INTERVAL_S",
        Int(1),
        "minimum seconds between evaluations of each of the project's sensors",
        "load time (the sensors)",
    )


@dataclass(frozen=True)
class StageSettings(_Section):
    """What the stages keep and how they work: compaction, validation and snapshot retention, tokenizer threads, acceptance columns."""

    SECTION: ClassVar[str] = "Stage behaviour"

    compact_after_chunks: int = setting(
        8,
        "EAGLE3_GENERATION_COMPACT_AFTER_CHUNKS",
        Int(0, note=" (0 = never compact)"),
        "after a successful `generations` shard run with more than this many chunk files, merge them into one "
        "(crash-safe: one new chunk, then the old ones are deleted; readers see the same rows throughout); "
        "`0` never compacts",
        HANDED_TO_STEPS,
    )
    gx_keep_validations: int = setting(
        20,
        "EAGLE3_GX_KEEP_VALIDATIONS",
        Int(0, note=" (0 = keep all)"),
        "GX validation results kept per gate suite in the work dir's GX context (older results and their Data "
        "Docs pages are pruned when the `quality_report` step builds the Data Docs, and by `eagle3 report`); "
        "`0` keeps all",
        HANDED_TO_STEPS,
    )
    snapshot_retention: int = setting(
        7,
        "EAGLE3_SNAPSHOT_RETENTION",
        Int(1),
        "published snapshots kept (older ones are deleted after a publish; never the one `LATEST` names)",
        HANDED_TO_STEPS,
    )
    tokenizers_parallelism: bool = setting(
        True,
        TOKENIZERS_PARALLELISM_ENV,  # read by the `tokenizers` Rust library itself at each batch call
        Flag(),
        "threads of the `tokenizers` Rust library (its batch decode/encode) where the `training_samples` "
        "round trip uses it; the round trip normally goes through an exact `tiktoken` twin of a byte-level BPE "
        "tokenizer (`tokenize/fast_bpe.py`, probed against the tokenizer at load, else the `tokenizers` path "
        "with one log line naming why), which runs on one thread whatever this says",
        HANDED_TO_STEPS,
        default_doc="`true` (`True`)",
    )
    train_acceptance: bool = setting(
        False,
        "EAGLE3_TRAIN_ACCEPTANCE",
        Flag(),
        "`1`: the `training_samples` tables, the snapshot and the `input_ids` + `loss_mask` export "
        "(`specforge_prompts.jsonl`) carry each row's `spec_accept_rate` and `spec_accept_length`: the "
        "drafter's acceptance the speculating server reported when the row was generated (null where it did "
        "not speculate), to weight or oversample the rows the drafter finds hard ([drafter](../drafter.md))",
        HANDED_TO_STEPS,
        default_doc="`0` (`False`)",
    )


@dataclass(frozen=True)
class DagsterSettings(_Section):
    """The Dagster instance's folder and the executor that runs the steps."""

    SECTION: ClassVar[str] = "Dagster"

    home: Path = setting(
        PROJECT_ROOT / ".dagster_home",
        "DAGSTER_HOME",
        Text(_raw_only(_path), "a local path"),
        "the Dagster instance (`eagle3 check` creates its storage once, under a file lock)",
        "never (the instance itself)",
        default_doc="`./.dagster_home`",
    )
    executor: str = setting(
        "multiprocess",
        EXECUTOR_ENV,
        EXECUTORS,
        'step executor of the jobs: `multiprocess`, `in_process`, or `k8s` (one pod per step; `pip install ".[k8s]"`)',
        "load time (run config can configure the executor, not choose it)",
    )


@dataclass(frozen=True)
class Settings:
    """Every setting, in its section (the reference page's order), and which variables the environment set.
    Read from the environment by `Settings.from_env` / `settings()`."""

    fleet: FleetSettings = field(default_factory=FleetSettings)
    model: ModelSettings = field(default_factory=ModelSettings)
    storage: StorageSettings = field(default_factory=StorageSettings)
    shards: ShardSettings = field(default_factory=ShardSettings)
    stages: StageSettings = field(default_factory=StageSettings)
    dagster: DagsterSettings = field(default_factory=DagsterSettings)
    configured: frozenset[str] = field(
        default=frozenset(),
        metadata={DERIVED_KEY: "the variables the environment set (a blank one, or a list of blank URLs, is unset)"},
    )

    @property
    def urls_configured(self) -> bool:
        """EAGLE3_SGLANG_URL names endpoints (else the default URL, or the simulator `eagle3 demo` starts)."""
        return URL_ENV in self.configured

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        """Read and validate every setting from `env`; raise SettingsError listing every bad one."""
        problems: list[str] = misspelt_variables(env, [d.spec.env for d in setting_fields()])
        read: dict[str, dict[str, Any]] = {name: {} for name in SECTION_TYPES}
        configured: set[str] = set()
        for d in setting_fields():
            value = _read(env, d.spec, problems)
            if value is not _UNSET:
                read[d.section][d.field.name] = value
                configured.add(d.spec.env)
        if "urls" in read["fleet"] and not read["fleet"]["urls"]:  # a list of blanks (",") is no list: unset
            del read["fleet"]["urls"]
            configured.discard(URL_ENV)
        storage = read["storage"]
        if "work_dir" not in storage:  # from `env` only, never os.environ
            storage["work_dir"] = _default_work_dir(storage.get("data_dir", _default(StorageSettings, "data_dir")))
        if "api_key" in read["fleet"]:
            conflict = credentials_conflict(read["fleet"].get("urls", _default(FleetSettings, "urls")), URL_ENV)
            if conflict:
                problems.append(conflict)
        if problems:
            raise SettingsError(problems)
        sections = {name: section(**read[name]) for name, section in SECTION_TYPES.items()}
        return cls(**sections, configured=frozenset(configured))


# The sections in the order of the reference page: the attribute of `Settings` -> its model (each field declared
# once there: the value's type and default, and in its SettingSpec the variable, parser and bounds, and meaning).
SECTION_TYPES: dict[str, type[Any]] = {
    f.name: cast(type[Any], f.default_factory) for f in fields(Settings) if f.default_factory is not MISSING
}
SETTINGS_SECTIONS = tuple(SECTION_TYPES.values())
SECTIONS = tuple(section.SECTION for section in SETTINGS_SECTIONS)


@dataclass(frozen=True)
class Declared:
    """One setting as declared: the section that holds it (`fleet`), its field (name, type, default), its spec."""

    section: str
    field: Field[Any]
    spec: SettingSpec

    @property
    def path(self) -> str:
        """Where a caller finds it: `fleet.stall_timeout_s`."""
        return f"{self.section}.{self.field.name}"

    @property
    def title(self) -> str:
        """The section's title on the reference page."""
        return str(SECTION_TYPES[self.section].SECTION)

    @property
    def default(self) -> Any:
        return self.field.default


def setting_fields() -> list[Declared]:
    """Every setting read from a variable, with its declaration, in the reference page's order."""
    return [
        Declared(name, f, f.metadata[SPEC_KEY])
        for name, section in SECTION_TYPES.items()
        for f in fields(section)
        if SPEC_KEY in f.metadata
    ]


def derived_fields() -> dict[str, str]:
    """`Settings` fields computed from the environment rather than read from one variable: name -> what they say."""
    return {f.name: f.metadata[DERIVED_KEY] for f in fields(Settings) if DERIVED_KEY in f.metadata}


_UNSET: Any = object()


def _default(section: type[Any], name: str) -> Any:
    return section.__dataclass_fields__[name].default


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


_VARIABLES = tuple(d.spec.env for d in setting_fields())
_cached: tuple[tuple[str | None, ...], Settings] | None = None  # (cwd + the raw variables, what they gave)


def settings() -> Settings:
    """This process's validated settings, read from the environment on first use (never at import) and again
    only when one of the variables `Settings` reads, or the working directory, has changed since
    (a test's monkeypatch): every caller shares one parsed object. Called where the app's commands and the
    definitions start, never by what they run (tests/test_layout.py)."""
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


def interactive_endpoint_wait_s(s: Settings) -> float:
    """EAGLE3_ENDPOINT_WAIT_S when it is set, else the short wait of an interactive run."""
    return s.fleet.wait_for_endpoint_s if ENDPOINT_WAIT_ENV in s.configured else INTERACTIVE_ENDPOINT_WAIT_S


def child_process_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a child process (`dagster dev` under `eagle3 ui`): ours with `extra` on top.

    Values are handed to children explicitly this way; nothing writes this process's environment.
    """
    env = dict(os.environ)
    env.update(extra or {})
    return env


def apply_tokenizers_parallelism(enabled: bool) -> bool:
    """Put TOKENIZERS_PARALLELISM (`s.stages.tokenizers_parallelism`, default true) in the environment, where the
    `tokenizers` Rust library reads it at each batch call: the training stage's batch decode/encode then runs on
    every core (tokenize/parse.py). Set it to 0 to keep a step on one thread. Returns the value applied."""
    os.environ[TOKENIZERS_PARALLELISM_ENV] = "true" if enabled else "false"
    return enabled
