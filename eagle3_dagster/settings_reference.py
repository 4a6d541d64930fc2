"""What each setting of `config.Settings` means, for the generated configuration reference.

One entry per environment variable that `Settings.from_env` reads. `docs_gen.configuration_page` refuses to
write the page (DocsError, so `make docs` fails) when a variable read by `Settings.from_env` has no entry
here, an entry names a variable it never reads or a field `Settings` does not have, or a default written
here no longer contains the code's default. Adding a setting: add its entry here, then run
`python -m eagle3_dagster.docs_gen` (it rewrites docs/reference/*.md).
"""

from __future__ import annotations

from dataclasses import dataclass

LOAD_TIME = "load time"
RUN_START = "run start"


@dataclass(frozen=True)
class SettingDoc:
    var: str  # the environment variable
    field: str  # the `Settings` field it sets
    default: str  # Markdown; must contain the code's default where that is a plain value
    meaning: str  # Markdown
    per_run: str  # how it changes for one run: a resource field (`sglang.urls`), LOAD_TIME, RUN_START or "never ..."
    # for a Settings field whose default is None ("unset"): the GenerationConfig field whose default applies
    default_from: str | None = None


SCALE_OUT = "../scale-out.md"  # relative to docs/reference/

SETTING_DOCS: tuple[SettingDoc, ...] = (
    SettingDoc(
        "EAGLE3_SGLANG_URL",
        "sglang_urls",
        "simulator (demo) / `http://127.0.0.1:30000`",
        "SGLang server(s) or an sglang-router, comma-separated `http(s)://host:port` URLs; a "
        "`user:password@` is sent as Basic auth (never printed: refused next to `SGLANG_API_KEY`, which it "
        "would replace, and then not bound into run config)",
        "`sglang.urls`",
    ),
    SettingDoc(
        "SGLANG_API_KEY",
        "sglang_api_key",
        "unset",
        "bearer key for the server; read by the settings module only and handed to the client as a masked "
        "`Secret`: never in logs, metadata, run config or data (server texts quoting it are redacted)",
        "never (a secret: the environment of the run only)",
    ),
    SettingDoc(
        "EAGLE3_MODEL",
        "model",
        "`kimi-k2.5`",
        "model profile name in `assets/models/` (or a YAML path)",
        "`pipeline.model`",
    ),
    SettingDoc(
        "EAGLE3_TOKENIZER",
        "tokenizer_override",
        "`../shared/tokenizers/<model>` when that folder exists (then also `HF_HUB_OFFLINE=1`), else the "
        "profile's `tokenizer`",
        "tokenizer folder or Hugging Face id",
        "`pipeline.tokenizer`",
    ),
    SettingDoc(
        "EAGLE3_ASSETS_DIR",
        "assets_dir",
        "`./assets`",
        "folder of `sources/*.yaml` and `models/*.yaml`; a source's `path:` is a local file/glob or a URI "
        "(`s3://bucket/x/*.jsonl.gz?region=…`, `gs://…`, `memory://…`; "
        f"[scale-out §5]({SCALE_OUT}#prompt-sources-in-object-storage))",
        "`pipeline.assets_dir` (model profiles); the source list: load time",
    ),
    SettingDoc(
        "EAGLE3_DATA_DIR",
        "data_dir",
        "`./data`",
        "where every table is written: a local path or a URI — `s3://bucket/prefix?region=…` (S3-compatible "
        "stores with `&endpoint_override=host:port&scheme=http`), `gs://…`, `abfs://…`, any fsspec protocol; "
        "credentials only from the provider's environment (`AWS_ACCESS_KEY_ID`, …), never in the URI "
        f"([scale-out §5]({SCALE_OUT}#5-data-in-object-storage))",
        "`pipeline.data_dir`",
    ),
    SettingDoc(
        "EAGLE3_WORK_DIR",
        "work_dir",
        "the data dir if local, else `./.eagle3_work` (`$TMPDIR/eagle3-work` outside a checkout)",
        "local scratch that never goes to object storage: the GX file context and Data Docs (`gx/`), "
        "generation shard locks",
        "`pipeline.work_dir`",
    ),
    SettingDoc(
        "EAGLE3_EXPECTATIONS_DIR",
        "expectations_dir",
        "`./expectations`",
        "the GX suites ([gates reference](gates.md))",
        "`pipeline.expectations_dir`",
    ),
    SettingDoc(
        "EAGLE3_ENDPOINT_WAIT_S",
        "endpoint_wait_s",
        "`600` (the nightly, runs launched from the UI); `15` for `eagle3 demo`",
        "how long the `generations` steps wait for a routable endpoint — once per graph run (a demo, a "
        "nightly, a backfill): when it runs out in one shard, the run's other shards fail at once with the same "
        "line (generate/run_wait.py); every endpoint and its state (`connection refused`, `not an SGLang "
        "server: /model_info answered text/html`, `/health 503`, `router has no ready worker`) is logged at "
        "once and every 25 s, then the step fails naming them all",
        "`sglang.wait_for_endpoint_s`",
        default_from="wait_for_endpoint_s",
    ),
    SettingDoc(
        "EAGLE3_STREAM",
        "stream",
        "`1` (`True`)",
        "stream `/generate` (SSE) so a request that goes quiet is caught by `EAGLE3_STALL_TIMEOUT_S`; `0`: one "
        "JSON answer, bounded only by the 3600 s read timeout",
        "`sglang.stream`",
        default_from="stream",
    ),
    SettingDoc(
        "EAGLE3_STALL_TIMEOUT_S",
        "stall_timeout_s",
        "`300`",
        "silence between stream chunks that counts as a stalled request: it is aborted and retried with a new "
        "rid. Chunks come every `stream_interval` tokens (about 4 per sample, 16-2048 tokens), so this must "
        "exceed that many tokens at the fleet's slowest per-request speed",
        "`sglang.stall_timeout_s`",
        default_from="stall_timeout_s",
    ),
    SettingDoc(
        "EAGLE3_CONTEXT_OVERFLOW",
        "context_overflow",
        "`fit`",
        "a prompt shorter than the server's context length whose prompt + `max_new_tokens` exceeds it (SGLang "
        "answers such a request 400): `fit` sends it with `max_new_tokens` lowered to context - prompt tokens "
        "(what `--allow-auto-truncate` would do, done by the client: its cache key has that budget); `skip` does "
        "not send it and records a `context_overflow` failure. Both are counted (`context_fitted`, "
        "`context_overflow_skipped`), see [SGLang](../sglang.md)",
        "`sglang.context_overflow`",
        default_from="context_overflow",
    ),
    SettingDoc(
        "EAGLE3_ALLOW_OLD_SGLANG",
        "allow_old_sglang",
        "unset (`False`)",
        "`1` accepts servers whose `/server_info` version is older than 0.5.9 (refused by default: older "
        "releases can put prompt-tail ids at the front of `output_ids`)",
        RUN_START,
        default_from="allow_old_server",
    ),
    SettingDoc(
        "EAGLE3_GENERATION_COMPACT_AFTER_CHUNKS",
        "generation_compact_after_chunks",
        "`8`",
        "after a successful `generations` shard run with more than this many chunk files, merge them into one "
        "(crash-safe: one new chunk, then the old ones are deleted; readers see the same rows throughout); "
        "`0` never compacts",
        RUN_START,
        default_from="compact_after_chunks",
    ),
    SettingDoc(
        "EAGLE3_GX_KEEP_VALIDATIONS",
        "gx_keep_validations",
        "`20`",
        "GX validation results kept per gate suite in the work dir's GX context (older results and their Data "
        "Docs pages are pruned when the Data Docs index is rebuilt, under the context lock: at most every 30 s "
        "during a run and at its end, so up to 30 s of newer results can be kept beyond the count until then; "
        "every run without Data Docs prunes its own suite); `0` keeps all",
        RUN_START,
    ),
    SettingDoc(
        "EAGLE3_N_SHARDS",
        "n_shards",
        "`4`",
        "shard partitions (`hash(prompt_id) % n`), 1 to 4096 (`config.MAX_N_SHARDS`: each shard is a Dagster "
        "partition)",
        "load time (the partitions)",
    ),
    SettingDoc(
        "EAGLE3_NIGHTLY_CRON",
        "nightly_cron",
        "`0 2 * * *`",
        "when the nightly regeneration starts (5-field cron)",
        "load time (the schedule)",
    ),
    SettingDoc(
        "EAGLE3_NIGHTLY_TZ",
        "nightly_tz",
        "`UTC`",
        "the time zone `EAGLE3_NIGHTLY_CRON` is read in (IANA name)",
        "load time (the schedule)",
    ),
    SettingDoc(
        "EAGLE3_SNAPSHOT_RETENTION",
        "snapshot_retention",
        "`7`",
        "published snapshots kept (older ones are deleted after a publish; never the one `LATEST` names)",
        RUN_START,
    ),
    SettingDoc(
        "EAGLE3_SNAPSHOT_MAX_AGE",
        "snapshot_max_age",
        "`26h`",
        "the `training_dataset` freshness check fails when the last publish is older (`s`/`m`/`h`/`d`)",
        "load time (the freshness check)",
    ),
    SettingDoc(
        "EAGLE3_SENSOR_INTERVAL_S",
        "sensor_interval_s",
        "`30`",
        "minimum seconds between evaluations of each of the project's sensors",
        "load time (the sensors)",
    ),
    SettingDoc(
        "EAGLE3_EXECUTOR",
        "executor",
        "`multiprocess`",
        'step executor of the jobs: `multiprocess`, `in_process`, or `k8s` (one pod per step; `pip install ".[k8s]"`)',
        "load time (run config can configure the executor, not choose it)",
    ),
    SettingDoc(
        "TOKENIZERS_PARALLELISM",
        "tokenizers_parallelism",
        "`true` (`True`)",
        "threads of the `tokenizers` Rust library (its batch decode/encode) where the `training_samples` round "
        "trip uses it; the round trip normally goes through an exact `tiktoken` twin of a byte-level BPE "
        "tokenizer (`tokenize/fast_bpe.py`, probed against the tokenizer at load, else the `tokenizers` path "
        "with one log line naming why), which runs on one thread whatever this says",
        RUN_START,
    ),
    SettingDoc(
        "EAGLE3_TRAIN_ACCEPTANCE",
        "train_acceptance",
        "`0` (`False`)",
        "`1`: the `training_samples` tables, the snapshot and the `input_ids` + `loss_mask` export "
        "(`specforge_prompts.jsonl`) carry each row's `spec_accept_rate` and `spec_accept_length`: the "
        "drafter's acceptance the speculating server reported when the row was generated (null where it did "
        "not speculate), to weight or oversample the rows the drafter finds hard ([drafter](../drafter.md))",
        RUN_START,
    ),
    SettingDoc(
        "DAGSTER_HOME",
        "dagster_home",
        "`./.dagster_home`",
        "the Dagster instance (`eagle3 check` creates its storage once, under a file lock)",
        "never (the instance itself)",
    ),
)

# Settings fields computed from another setting, not read from a variable of their own.
DERIVED_FIELDS: dict[str, str] = {"sglang_url_configured": "EAGLE3_SGLANG_URL is set"}

CONFIG_INTRO = """\
All settings are read and validated in one place, `eagle3_dagster/config.py` (`Settings`), before any work
starts: when the definitions load, and by `eagle3 check`, which `make instance` (so `make demo`, `make ui`,
`make backfill`, `make check-defs`) runs first. No other module reads the environment (`tests/test_layout.py`;
the simulator, a program of its own, reads what its flags name in `sim/settings.py`); domain functions are
handed their values as parameters. A bad value stops with one line per problem, naming the variable, the
value and what is allowed, and exit code 2:

```
eagle3 demo: error: EAGLE3_N_SHARDS must be an integer >= 1, got 'abc'
```

The same holds for source YAMLs (one line per bad file, see the [source YAML reference](source-yaml.md)) and
for `eagle3 demo --shards` keys that are not partitions (the valid keys are listed; nothing is written).

From a plain shell (`source .venv/bin/activate; eagle3 ...`) the CLI applies the same project defaults as the
Makefile (`config.project_env_defaults`): `DAGSTER_HOME=./.dagster_home`, and the tokenizer under
`../shared/tokenizers/<EAGLE3_MODEL>` with `HF_HUB_OFFLINE=1` when that folder exists. What you export wins.
"""

CONFIG_OUTRO = """\
The last column says how a setting can change for one run. A resource field (`pipeline.data_dir`,
`sglang.urls`, ...) is bound from the setting when the definitions load (`eagle3_dagster/defs/common/resources.py`,
the one place) and can be overridden in a run's config, e.g. `resources: {sglang: {config: {regen_seed: 7}}}`;
fields a run config does not name keep the deployment's values. Fields with no variable, per run only:
`pipeline.max_new_tokens` (default: the profile's), `pipeline.max_failed_rate` (0.01: a generations shard whose
permanently failed requests exceed it fails its `request_failure_budget` check and is left out of snapshots;
fewer is a WARN), `sglang.max_in_flight` (default: from `/server_info`), `sglang.model_revision` (default: from
`/model_info`), `sglang.regen_seed` (bump it to regenerate every sample), `sglang.probe_seed` (bump it to regenerate the `role: probe` sets only, docs/probes.md), `sglang.read_timeout_s` (3600 s,
non-streamed requests), `sglang.max_retries` (6). `tests/pipeline/test_run_config_overrides.py` runs one real
Dagster run per field and checks its effect.

- **load time**: these shape the definitions themselves — the shard partitions, one asset per source YAML,
  the schedule's cron, the freshness check, the sensors' intervals, the executor — so they are fixed when
  the code location loads; change the variable and reload the code location (`make ui` restarts it; in the
  UI, *Reload definitions*). `tests/pipeline/test_defs_snapshot.py` pins what they produce at their defaults.
- **run start**: read from the environment when a run starts, not a resource field; change it for the
  deployment.
"""
