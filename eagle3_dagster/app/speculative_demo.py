"""`eagle3 demo --speculative`: the demo with a drafter, in one switch.

The simulator the demo starts speculates with SGLang's own flags (SPECULATIVE_SIM_ARGS: an EAGLE3 drafter,
3 steps, top-k 1, 4 draft tokens), and the demo's sources gain the example probe set
(examples/speculative-demo/probe_demo.yaml, `role: probe`): every generated row then carries the drafter's
acceptance, the probe set measures the drafter, and the summary and the quality report show both
(docs/drafter.md, docs/probes.md). The probe set is added through a fresh assets folder under the work dir
(the configured sources, their paths made absolute, plus the probe set; the model profiles linked): the
settings are a changed copy, the project's `assets/` is never written. With EAGLE3_SGLANG_URL set no
simulator is started: the fleet's own drafter (if it runs one) is what the probe set measures.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any

import yaml

from ..config import PROJECT_ROOT, Settings
from ..storage import DataPath

SPECULATIVE_SIM_ARGS = (
    "--speculative-algorithm",
    "EAGLE3",
    "--speculative-draft-model-path",
    "example/kimi-k2.5-eagle3",
    "--speculative-num-steps",
    "3",
    "--speculative-eagle-topk",
    "1",
    "--speculative-num-draft-tokens",
    "4",
)
EXAMPLE_PROBE_SET = PROJECT_ROOT / "examples" / "speculative-demo" / "probe_demo.yaml"
_PATH_KEYS = ("path", "function_docs")  # source YAML keys relative to the YAML's folder


def _absolute(raw: dict[str, Any], base: Path) -> dict[str, Any]:
    """A source YAML's mapping with its relative paths made absolute (it is written to another folder)."""
    out = dict(raw)
    for key in _PATH_KEYS:
        value = out.get(key)
        if isinstance(value, str) and "://" not in value and not Path(value).is_absolute():
            out[key] = str((base / value).resolve())
    return out


def speculative_settings(s: Settings, probe_set: Path = EXAMPLE_PROBE_SET) -> Settings:
    """`s` with an assets folder (under the work dir) whose sources are `s`'s plus `probe_set`. A source YAML
    that is not a mapping is copied as it is (the demo's own validation names it)."""
    assets = s.storage.work_dir / "speculative_demo" / "assets"
    if assets.exists():
        shutil.rmtree(assets)
    sources = assets / "sources"
    sources.mkdir(parents=True)
    (assets / "models").symlink_to(s.storage.models_dir.resolve(), target_is_directory=True)
    for f in sorted([*s.storage.sources_dir.glob("*.yaml"), *s.storage.sources_dir.glob("*.yml"), probe_set]):
        raw = yaml.safe_load(f.read_text(encoding="utf-8"))
        if not isinstance(raw, dict):
            shutil.copyfile(f, sources / f.name)
            continue
        (sources / f.name).write_text(yaml.safe_dump(_absolute(raw, f.parent.resolve()), sort_keys=False))
    return dataclasses.replace(s, storage=dataclasses.replace(s.storage, assets_dir=assets.resolve()))


def acceptance_lines(data_dir: DataPath, shards: list[int]) -> list[str]:
    """The summary's acceptance lines: the drafter's figures over the shards (Σ/Σ) and the probe sets' table
    (none when no row carries figures and no probe result is stored)."""
    from ..generate.group_acceptance import GroupAcceptance
    from ..generate.probe_results import drafter_versions, read_all_results
    from ..quality.acceptance import collect_acceptance, summary_group

    lines: list[str] = []
    whole = sum((summary_group(a) for a in collect_acceptance(data_dir, shards).values()), GroupAcceptance())
    if whole.rows or whole.left_out:
        length, rate = whole.accept_length, whole.accept_rate
        lines.append(
            f"acceptance: {whole.rows} row(s) with the drafter's figures: accept length "
            f"{'-' if length is None else f'{length:.2f}'} tokens per verify step, accept rate "
            f"{'-' if rate is None else f'{rate:.2f}'}" + (f"; {whole.left_out_text()}" if whole.left_out else "")
        )
    for v in drafter_versions(read_all_results(data_dir)).iter_rows(named=True):
        length = v["accept_length"]
        lines.append(
            f"probe sets: drafter {v['drafter_id']} ({v['draft_model_path'] or '?'}) on {v['n_probe_prompts']} probe "
            f"prompt(s): accept length {'-' if length is None else f'{length:.2f}'} (the report's drafter versions)"
        )
    return lines
