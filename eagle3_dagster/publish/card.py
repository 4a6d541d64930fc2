"""A snapshot's README.md: a Hugging Face dataset card, so the snapshot folder is a dataset folder.

`datasets.load_dataset("<snapshot folder>")` reads it as it is: the YAML header's `configs` name the
snapshot's own files (the training rows as the default config, one config per export). The header
carries what the Hub reads (license per source, size, task, tags, pretty_name); the body says what
made the rows (profile, tokenizer, model revision, template hash, sampling, weight versions, the SGLang
release(s) with their row counts and the number of workers; a snapshot of several releases says so in a
line of its own), the gates they passed, the counts (in = rows + rejected + duplicates + quarantined +
failed) and the sources with their licences and origin.

User text (source names, licences, descriptions, paths) reaches the header only through
yaml.safe_dump and the body only escaped (`_cell`). A source with no licence is written as `unknown`
and named in a warning; a free-text licence that is not a Hub licence id becomes `other` with its
text in `license_details`. The card holds no timestamp: the same snapshot gives the same card, and
it is written inside the snapshot before the manifest (which records its sha256), so it appears with
the snapshot and before LATEST moves. It is not part of the content identity (the version is what a
trainer consumes; the card describes it).
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from ..secret import printable
from ..storage import DataPath, TextSink, display_uri, sha256_of
from .card_facts import (
    UNKNOWN_RELEASE,
    GateFacts,
    SourceCounts,
    gate_facts,
    reconciliation,
    release_order,
    source_counts,
    table_columns,
    table_provenance,
    weight_versions,
)

CARD_FILE = "README.md"
DEFAULT_CONFIG = "training_samples"
UNKNOWN_LICENCE = "unknown"
TAGS = ("eagle3", "speculative-decoding", "synthetic", "reasoning")
# Hub licence ids a source's `licence` may be given as (case-insensitive; SPDX spelling)
HUB_LICENCES = frozenset(
    [
        "apache-2.0",
        "mit",
        "bsd-2-clause",
        "bsd-3-clause",
        "cc0-1.0",
        "cc-by-2.0",
        "cc-by-3.0",
        "cc-by-4.0",
        "cc-by-sa-3.0",
        "cc-by-sa-4.0",
        "cc-by-nc-4.0",
        "cc-by-nc-sa-4.0",
        "cc-by-nd-4.0",
        "cc-by-nc-nd-4.0",
        "odc-by",
        "odbl",
        "pddl",
        "cdla-permissive-1.0",
        "cdla-permissive-2.0",
        "cdla-sharing-1.0",
        "gpl-2.0",
        "gpl-3.0",
        "lgpl-2.1",
        "lgpl-3.0",
        "agpl-3.0",
        "mpl-2.0",
        "epl-2.0",
        "isc",
        "unlicense",
        "zlib",
        "wtfpl",
        "llama2",
        "llama3",
        "llama3.1",
        "llama3.2",
        "llama3.3",
        "gemma",
    ]
)
_SIZES = ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M"))
_BIG = ((10**7, "1M<n<10M"), (10**8, "10M<n<100M"), (10**9, "100M<n<1B"))

log = logging.getLogger(__name__)


def public_location(location: str, *, local: bool) -> str:
    """A location as a card (and the manifest beside it) names it: a URI (without credentials: display_uri) or
    a Hugging Face id as it is; a `local` path by its last part only, marked so: a card names no folder of the
    machine that made it."""
    if not local:
        return display_uri(location)
    name = PurePosixPath(str(location).replace("\\", "/").rstrip("/")).name or str(location)
    return f"{name} (local)"


def card_config(profile: Any, specs: Sequence[Any], served_model_pin: str | None = None) -> dict[str, Any]:
    """What the card needs beyond the rows, for the snapshot's `config`: the profile's tokenizer and
    sampling, the served model the endpoints were checked against (the profile's model_types and
    model_path, the user's EAGLE3_SERVED_MODEL pin), and each source's licence and origin, each location as
    public_location names it."""
    tokenizer = str(profile.tokenizer)
    return {
        "tokenizer": public_location(tokenizer, local=Path(tokenizer).expanduser().exists()),
        "sampling": asdict(profile.sampling),
        "served_model": {
            "model_types": list(profile.model_types),
            "model_path": _public_model_path(profile.model_path),
            "pinned_path": _public_model_path(served_model_pin),
        },
        "sources": [
            {
                "name": s.name,
                "licence": s.licence,
                "language": list(s.language),
                "origin": public_location(s.path, local="://" not in s.path or s.path.startswith("file://")),
                "description": s.description,
                "role": s.role,
            }
            for s in specs
        ],
    }


def hub_licence(licence: str) -> str | None:
    """The Hub licence id a source's licence text is, or None (free text)."""
    t = licence.strip().rstrip(".").lower()
    return t if t in HUB_LICENCES else None


def size_category(rows: int) -> str:
    for limit, name in (*_SIZES, *_BIG):
        if rows < limit:
            return name
    return "n>1B"


def _one_line(s: Any) -> str:
    """User text on one line: a header value or table cell never opens a block or ends the front matter, and
    holds no control character (a model path or version a server sent: secret.printable)."""
    return printable(" ".join(str(s).split()))


def _code(s: Any) -> str:
    """User text inside a Markdown code span (or code block line): no backtick, quote or table break."""
    return _one_line(s).replace("`", "'").replace('"', "'").replace("|", "\\|")


def _cell(s: Any) -> str:
    """User text as inert Markdown (no HTML, links, emphasis or table breaks)."""
    t = _one_line(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return re.sub(r"([\\`*_{}\[\]()#+!|~])", r"\\\1", t)


def source_licences(sources: Sequence[dict[str, Any]], names: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """(source -> licence text or `unknown`, warnings naming every source without one)."""
    given = {str(s.get("name")): _one_line(s.get("licence") or "") for s in sources}
    out, warnings = {}, []
    for name in names:
        text = given.get(name, "")
        if not text:
            where = "its YAML has no `licence`" if name in given else "no source YAML names it at publish time"
            warnings.append(f"source {name!r} states no licence ({where}): written as {UNKNOWN_LICENCE} in the card")
            text = UNKNOWN_LICENCE
        out[name] = text
    return out, warnings


def declared_languages(sources: Sequence[dict[str, Any]], names: Sequence[str]) -> list[str]:
    """The languages the card's sources declare (`language` in their YAML), in first-seen order."""
    wanted = set(names)
    langs = [str(x) for s in sources if str(s.get("name")) in wanted for x in s.get("language") or []]
    return list(dict.fromkeys(langs))


def licence_header(licences: dict[str, str]) -> dict[str, Any]:
    """`license` (one per source, Hub ids; `other` for free text) and, for free text, license_name/details."""
    ids, free = [], {}
    for name, text in licences.items():
        hub = UNKNOWN_LICENCE if text == UNKNOWN_LICENCE else hub_licence(text)
        if hub is None:
            free[name] = text
            hub = "other"
        if hub not in ids:
            ids.append(hub)
    header: dict[str, Any] = {"license": ids[0] if len(ids) == 1 else ids}
    if free:
        header["license_name"] = f"{next(iter(free))}-licence" if len(free) == 1 else "per-source-licences"
        header["license_details"] = "; ".join(f"{n}: {t}" for n, t in free.items())
    return header


def configs(table_groups: Sequence[Sequence[str]]) -> list[dict[str, Any]]:
    """The training rows' Parquet tables (split `train`): one config per set of tables sharing their
    columns (`datasets` cannot read tables with other columns as one split), the first the default.
    The JSONL exports are not configs: `datasets` builds every config of a folder with one builder."""
    out: list[dict[str, Any]] = []
    for i, files in enumerate(table_groups):
        name = DEFAULT_CONFIG if i == 0 else f"{DEFAULT_CONFIG}_{i + 1}"
        out.append({"config_name": name, "data_files": [{"split": "train", "path": list(files)}]})
    if out:
        out[0] = {"config_name": DEFAULT_CONFIG, "default": True, "data_files": out[0]["data_files"]}
    return out


def table_groups(columns: dict[str, tuple[str, ...]]) -> tuple[list[list[str]], list[str]]:
    """(the tables grouped by their columns, in file order; a warning when there is more than one group)."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for rel, cols in columns.items():
        groups.setdefault(cols, []).append(rel)
    if len(groups) < 2:
        return list(groups.values()), []
    first, *others = groups
    extra = sorted({c for o in others for c in set(o) ^ set(first)})
    return list(groups.values()), [
        f"the training tables do not share one set of columns (differing: {', '.join(extra)}): the rows are "
        f"split over {len(groups)} configs ({DEFAULT_CONFIG} and {DEFAULT_CONFIG}_2...); load each of them"
    ]


def card_header(
    *,
    profile: str,
    version: str,
    rows: int,
    licences: dict[str, str],
    cfgs: list[dict[str, Any]],
    languages: Sequence[str] = (),
) -> dict[str, Any]:
    header: dict[str, Any] = {
        "pretty_name": _one_line(f"EAGLE-3 drafter training data: {profile}, snapshot {version}"),
        **licence_header(licences),
        **({"language": list(languages)} if languages else {}),
        "size_categories": [size_category(rows)],
        "task_categories": ["text-generation"],
        "tags": [*TAGS, _one_line(profile)] if profile else list(TAGS),
    }
    if cfgs:
        header["configs"] = cfgs
    return header


def _values(c: Counter[str]) -> str:
    return ", ".join(f"`{_code(v)}` ({n} rows)" for v, n in sorted(c.items())) or "not recorded"


def _public_model_path(path: str | None) -> str | None:
    """A model path as the card names it: a folder of the serving machine (absolute) by its last part."""
    if path is None or not (path.startswith(("/", "~", "\\")) or ":\\" in path):
        return path
    return public_location(path, local=True)


def public_revisions(c: Counter[str]) -> Counter[str]:
    """Model revisions (`model_path@weight_version`) as the card names them: a model path that is a folder of the
    serving machine (absolute) by its last part; a Hugging Face id as it is."""
    out: Counter[str] = Counter()
    for value, n in c.items():
        path, at, version = value.rpartition("@") if "@" in value else (value, "", "")
        out[f"{_public_model_path(path)}{at}{version}"] += n
    return out


def model_section(manifest: dict[str, Any], values: dict[str, Counter[str]]) -> list[str]:
    cfg = manifest.get("config") or {}
    sampling = cfg.get("sampling")
    # max_new_tokens: the run's (an override of the profile's), said once below
    sampling_text = ", ".join(
        f"{_cell(k)}={_cell(v)}" for k, v in sorted((sampling or {}).items()) if k != "max_new_tokens"
    )
    wv = weight_versions(values)
    return [
        "## Model and generation",
        "",
        "| | |",
        "|---|---|",
        f"| model profile | `{_code(cfg.get('profile') or 'not recorded')}` "
        f"(fingerprint `{_code(cfg.get('profile_fingerprint') or 'not recorded')}`) |",
        f"| tokenizer | `{_code(cfg.get('tokenizer') or 'not recorded')}`; "
        f"fingerprints {_values(values['tokenizer_fingerprint'])} |",
        f"| model revision (model path @ weight version) | {_values(public_revisions(values['model_revision']))} |",
        f"| served model (each endpoint's `/model_info`, checked before a request was sent) | "
        f"{_served_model_text(cfg.get('served_model'))} |",
        f"| chat template (template hash) | {_values(values['template_hash'])} |",
        f"| sampling | {sampling_text or 'not recorded'}; max_new_tokens={_cell(cfg.get('max_new_tokens', 'n/a'))}; "
        f"sampling hash {_values(values['sampling_hash'])} |",
        f"| server (SGLang) | {_served_by_text(manifest.get('served_by'))}; "
        f"weight version(s) {', '.join(f'`{_code(w)}`' for w in wv) or 'not recorded'} |",
        "",
    ]


def _releases_text(served: dict[str, Any]) -> str:
    releases = served.get("sglang_versions") or {}
    ordered = sorted(releases.items(), key=lambda kv: release_order(str(kv[0])))
    return ", ".join(f"`{_code(r)}` ({n} rows)" for r, n in ordered)


def _served_by_text(served: dict[str, Any] | None) -> str:
    """The SGLang release(s) of the rows with their row counts and the number of workers (manifest `served_by`)."""
    if not served:
        return "release(s) not recorded"
    workers = f"{served.get('workers', 0)} worker(s)"
    if served.get("rows_without_worker"):
        workers += f" ({served['rows_without_worker']} rows do not name theirs)"
    return f"release(s) {_releases_text(served) or 'not recorded'}; {workers}"


def mixed_releases_line(served: dict[str, Any] | None) -> list[str]:
    """One plain line when the rows were served by more than one SGLang release (`unknown` counted as one):
    legal (a fleet upgraded mid-run), but the release decides the spec-metric names and the server's behaviour."""
    releases = (served or {}).get("sglang_versions") or {}
    if len(releases) < 2:
        return []
    unknown = " (`unknown`: the row does not record it)" if UNKNOWN_RELEASE in releases else ""
    return [
        f"**Mixed SGLang releases:** the rows were served by {_releases_text(served or {})}; "
        f"each row's `sglang_version` says which{unknown}.",
        "",
    ]


def _served_model_text(served: dict[str, Any] | None) -> str:
    """What the endpoints were required to serve (generate/served_model.py), or that the snapshot does not say."""
    if not served:
        return "not recorded"
    types = " or ".join(f"`{_code(t)}`" for t in served.get("model_types") or []) or "any"
    pin = served.get("pinned_path")
    if pin:
        return (
            f"model path `{_code(pin)}`, pinned by EAGLE3_SERVED_MODEL: endpoints serving it were used whatever "
            f"their model type (the profile expects model type {types}), any other model was refused"
        )
    path = served.get("model_path")
    return f"model type {types}" + (f" and model path `{_code(path)}`" if path else "") + "; any other was refused"


def left_out_section(manifest: dict[str, Any]) -> list[str]:
    """A partial snapshot (asked for explicitly): each shard it leaves out and why; nothing for a whole one."""
    left_out = manifest.get("shards_left_out") or {}
    if not left_out:
        return []
    total = len(manifest.get("shards") or [])
    lines = [
        "## Shards left out",
        "",
        f"**This is a partial snapshot**, published on an explicit request: {len(left_out)} of {total} shard(s) "
        "did not pass and are not in it (their prompts have no row here).",
        "",
        "| shard | why it was left out |",
        "|---|---|",
    ]
    lines += [f"| {_cell(shard)} | {_cell(why)} |" for shard, why in sorted(left_out.items())]
    return [*lines, ""]


def gates_section(manifest: dict[str, Any], row_gates: Sequence[GateFacts], shards: int) -> list[str]:
    lines = [
        "## Gates passed",
        "",
        f"Every row comes from a shard that passed all three row-level gates ({shards} shard(s) included; "
        "a failing row is quarantined, not published).",
        "",
        "| gate | suite (sha256) | shards passed | rows checked | rows quarantined |",
        "|---|---|---|---|---|",
    ]
    for g in row_gates:
        suites = ", ".join(f"`{_code(s)}`" for s in g.suites) or "n/a"
        lines.append(f"| {g.gate} | {suites} | {g.shards_passed}/{shards} | {g.rows_checked} | {g.rows_quarantined} |")
    pg = manifest.get("publish_gate")
    if pg:  # a snapshot the publish gate refuses is never written: a written one passed it
        lines.append(f"| publish | `{_code(pg.get('suite_sha256', 'n/a'))}` | snapshot passed when written | | |")
    # Whether it is published (the drift policy may hold it back) is decided against the LATEST of each
    # publish and can change for the same content: the card leaves it to the manifest, so it stays true.
    lines += [
        "",
        "Whether this snapshot is published (LATEST) and its drift against the previous one are in "
        "`manifest.json` (`published`, `drift`): they are decided at each publish against the LATEST of the moment.",
    ]
    return [*lines, ""]


_COUNT_COLUMNS = (
    ("read", "read"),
    ("rejected", "rejected at ingest"),
    ("duplicates", "duplicates"),
    ("sampled_out", "sampled out"),
    ("accepted", "accepted"),
    ("cross_source_duplicates", "duplicates of an earlier source"),
    ("eval_overlap", "eval overlap"),
    ("probe_overlap", "probe overlap"),
    ("other_shards", "in other shards"),
    ("prompts", "prompts in the snapshot's shards"),
    ("probe_prompts", "probe prompts"),
    ("no_row", "quarantined or failed"),
    ("tokenize_rejected", "of which quarantined at tokenize"),
    ("gate_quarantined", "rows quarantined by gates"),
    ("generation_failed", "generation failed"),
    ("trained", "trained prompts"),
    ("rows", "rows"),
)


def counts_section(counts: dict[str, SourceCounts], rows: int) -> list[str]:
    lines = [
        "## Counts",
        "",
        f"Prompts in: {reconciliation(counts)} (the snapshot's {rows} rows).",
        "",
        "Every prompt read is counted once: ingest figures (read to probe overlap) cover every shard; prompts of "
        "shards not in this snapshot are `in other shards`; of the snapshot's shards, a `role: probe` source's "
        "prompts are generated to compare drafters and never trained on, and a training prompt is either trained "
        "(one row, or one per turn of a multi-turn conversation) or quarantined or failed (at tokenize, by a gate, "
        "its request failed for good, or skipped; the three columns after it break that down, a row a gate "
        "quarantined counted by each gate that did).",
        "",
        "| source | " + " | ".join(label for _, label in _COUNT_COLUMNS) + " |",
        "|---" * (len(_COUNT_COLUMNS) + 1) + "|",
    ]
    for name, c in counts.items():
        cells = ["n/a" if getattr(c, key) is None else str(getattr(c, key)) for key, _ in _COUNT_COLUMNS]
        lines.append(f"| {_cell(name)} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def sources_section(sources: Sequence[dict[str, Any]], licences: dict[str, str]) -> list[str]:
    given = {str(s.get("name")): s for s in sources}
    lines = [
        "## Sources",
        "",
        "| source | licence | from | role | language | description |",
        "|---|---|---|---|---|---|",
    ]
    for name, licence in licences.items():
        s = given.get(name, {})
        origin = _cell(s.get("origin") or "not recorded")
        lines.append(
            f"| {_cell(name)} | {_cell(licence)} | {origin} | {_cell(s.get('role') or 'train')} "
            f"| {_cell(', '.join(s.get('language') or []) or 'not declared')} | {_cell(s.get('description') or '')} |"
        )
    return [*lines, ""]


def load_section(version: str, exports: Sequence[str], more_configs: Sequence[str] = ()) -> list[str]:
    lines = [
        "## Load it",
        "",
        f"The default config `{DEFAULT_CONFIG}` is the token-exact training rows (split `train`):",
        "",
        "```python",
        "import datasets",
        "",
        f'ds = datasets.load_dataset("snapshots/{version}")  # this folder, under the data dir',
        *(f'{name} = datasets.load_dataset("snapshots/{version}", "{name}")  # other columns' for name in more_configs),
    ]
    for rel in exports:
        lines.append(
            f'{_code(PurePosixPath(rel).stem)} = datasets.load_dataset("json", data_files="snapshots/{version}/{rel}")'
        )
    return [
        *lines,
        "```",
        "",
        "`manifest.json` beside this card has every file's sha256, the content identity and the full gate "
        "results; docs/exports.md says which trainer reads which export.",
        "",
    ]


def render_card(
    manifest: dict[str, Any],
    *,
    table_groups: Sequence[Sequence[str]],
    values: dict[str, Counter[str]],
    counts: dict[str, SourceCounts],
    row_gates: Sequence[GateFacts],
    licences: dict[str, str],
    warnings: Sequence[str],
) -> str:
    """The card's text: the YAML header (yaml.safe_dump of plain values) and the Markdown body."""
    cfg = manifest.get("config") or {}
    version, rows = str(manifest.get("version", "")), int(manifest.get("rows", 0))
    cfgs = configs(table_groups)
    header = card_header(
        profile=str(cfg.get("profile") or ""),
        version=version,
        rows=rows,
        licences=licences,
        cfgs=cfgs,
        languages=declared_languages(cfg.get("sources") or [], list(licences)),
    )
    body = [
        f"# {_cell(header['pretty_name'])}",
        "",
        f"EAGLE-3 drafter training data generated by eagle3-dagster: {rows} rows, snapshot `{_code(version)}` "
        "(content identity: " + _cell((manifest.get("identity") or {}).get("of", "n/a")) + ").",
        "",
        *([f"**Warning:** {_cell(w)}" for w in warnings] + ([""] if warnings else [])),
        *mixed_releases_line(manifest.get("served_by")),
        *left_out_section(manifest),
        *model_section(manifest, values),
        *gates_section(manifest, row_gates, sum(len(g) for g in table_groups)),
        *counts_section(counts, rows),
        *sources_section(cfg.get("sources") or [], licences),
        *load_section(_code(version), sorted(manifest.get("exports") or {}), [c["config_name"] for c in cfgs[1:]]),
    ]
    front = yaml.safe_dump(header, sort_keys=False, allow_unicode=True, width=10_000)
    return f"---\n{front}---\n\n" + "\n".join(body)


def write_card(data: DataPath, snapshot: DataPath, manifest: dict[str, Any]) -> dict[str, Any]:
    """Write `snapshot`/README.md for a snapshot being assembled (its tables and exports in place, its
    manifest dict not yet written) and return the manifest's `card` entry (file, sha256, warnings)."""
    tables = list(snapshot.joinpath("training_samples").glob("shard=*.parquet"))
    groups, warnings = table_groups({f"training_samples/{t.name}": table_columns(t) for t in tables})
    _, values = table_provenance(tables)
    shards = [int(s["shard"]) for s in manifest.get("shards", []) if s.get("included")]
    sources = (manifest.get("config") or {}).get("sources") or []
    roles = {str(s.get("name")): s.get("role", "train") for s in sources}
    names = list(dict.fromkeys(n for n, role in roles.items() if role in ("train", "probe")))
    counts = source_counts(data, names, shards, tables, [n for n, role in roles.items() if role == "probe"])
    licences, licence_warnings = source_licences(sources, list(counts))
    warnings = licence_warnings + warnings
    if not tables:
        warnings.append("the snapshot has no training table: the card names no data files")
    for w in warnings:
        log.warning(f"data card of snapshot {manifest.get('version')}: {w}")
    text = render_card(
        manifest,
        table_groups=groups,
        values=values,
        counts=counts,
        row_gates=gate_facts(data, shards),
        licences=licences,
        warnings=warnings,
    )
    sink = TextSink(snapshot / CARD_FILE)
    try:
        sink.write(text)
    except BaseException:
        sink.abort()
        raise
    sink.commit()
    return {"file": CARD_FILE, "sha256": sha256_of(snapshot / CARD_FILE), "warnings": warnings}
