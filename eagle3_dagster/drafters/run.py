"""One comparison of a candidate drafter with production's, end to end (the CLI and the asset call this).

    outcome = compare_candidate(CompareInputs(...), CompareRequest(candidate_urls, baseline, trained_on))

1. Ask the candidate what it runs (candidate.inspect_candidate): dead, not speculating or mixed -> refused,
   nothing stored (CandidateRefused).
2. Load the baseline (production's current drafter unless named) and refuse, stored with the reason, a
   candidate that is the baseline drafter, serves another target model or weights, or would be sent
   other sampling than the baseline's probe rows were generated with.
3. Send the baseline's probe prompts, and only those, to the candidate with production's sampling, regen
   seed and probe seed, through the generation client (every answer checked as production's are), into
   the candidate's own store; record its results keyed like probe results (a rerun sends nothing again).
4. Pair, judge, decide (compare.py), with the lineage of both drafters, and store the comparison.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars as pl

from ..generate.active import active_sample_ids
from ..generate.config import GenerationConfig, sampling_hash
from ..generate.context_fit import ContextBudget
from ..generate.inputs import prompt_view
from ..generate.multiturn import MultiTurn, active_turn_ids, current_turns, load_multiturn
from ..generate.probes import ProbeKeys
from ..generate.shard import generate_shard
from ..profiles import ModelProfile
from ..publish.snapshot import list_snapshots
from ..storage import DataPath, list_files, scan_parquet, shard_dir
from .baseline import Baseline, BaselineError, load_baseline
from .candidate import CandidateRefused, CandidateServer, inspect_candidate, target_problem
from .compare import HOLD, decide, interval_text, judge
from .lineage import Lineage, candidate_lineage, headline, production_lineage
from .rule import PromotionRule
from .store import candidate_generations_dir, read_comparisons, record_candidate_results, write_comparison
from .units import pair

# the generation client's wait for a candidate endpoint that stops answering mid-way (not the nightly's long wait:
# the candidate answered the pre-check seconds ago)
CANDIDATE_WAIT_S = 30.0


@dataclass(frozen=True)
class CompareRequest:
    candidate_urls: tuple[str, ...]
    baseline: str | None = None  # a drafter_id; None: production's current drafter
    trained_on: str | None = None  # the snapshot that trained the candidate (else its lineage record, if any)


@dataclass(frozen=True)
class CompareInputs:
    """What the caller resolved: where the data is, the rule, the probe sources, and the generation config
    production runs with (sampling, regen seed, probe seed), pointed at the candidate's endpoints."""

    data: DataPath
    lock_dir: Path
    rule: PromotionRule
    probe_sources: frozenset[str]
    config: GenerationConfig
    log: Callable[[str], None] = print
    # a probe conversation regenerated turn by turn renders each next turn with the model's chat template:
    # the profile and a renderer factory (tokenize.PromptRenderer), called only when a shard has one
    profile: ModelProfile | None = None
    renderer: Callable[[], Any] | None = None


@dataclass
class Outcome:
    doc: dict[str, Any]  # the comparison (docs/drafter-compare.md describes its fields)
    path: str | None = None  # where it is stored
    requests: dict[str, int] = field(default_factory=dict)

    @property
    def decision(self) -> str:
        return str(self.doc["decision"])

    @property
    def refused(self) -> str | None:
        return self.doc.get("refused")


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _candidate_json(c: CandidateServer, lineage: Lineage | None) -> dict[str, Any]:
    return {
        **c.drafter.columns(),
        "endpoints": list(c.endpoints),
        "model_revision": c.model_revision,
        "trained_on": lineage.as_json() if lineage else None,
    }


def _refused(inputs: CompareInputs, cand: dict[str, Any], prod: dict[str, Any] | None, why: str) -> Outcome:
    """A comparison that could not be made: stored with the reason (hold), so the history shows it."""
    doc = {
        "decision": HOLD,
        "reasons": [why],
        "refused": why,
        "notes": [],
        "compared_at": _now(),
        "production": prod,
        "candidate": cand,
        "overall": None,
        "sources": [],
        "rule": inputs.rule.as_dict(),
        "headline": None,
    }
    return Outcome(doc, str(write_comparison(inputs.data, doc)))


def _usable_baseline(
    baseline: Baseline, cand: CandidateServer, s_hash: str
) -> tuple[pl.DataFrame, list[str], str | None]:
    """(the baseline rows to compare, notes, a refusal line): same target and sampling as what is sent."""
    rows, notes = baseline.rows, list[str]()
    problem = target_problem(cand, rows["model_revision"].drop_nulls().to_list())
    if problem:
        return rows, notes, problem
    other = rows.filter(pl.col("model_revision").is_not_null() & (pl.col("model_revision") != cand.model_revision))
    if other.height:
        notes.append(f"{other.height} production probe rows of another target revision left out")
    rows = rows.filter(pl.col("model_revision").is_null() | (pl.col("model_revision") == cand.model_revision))
    hashes = sorted(set(rows["sampling_hash"].drop_nulls().to_list()))
    if hashes and s_hash not in hashes:
        return (
            rows,
            notes,
            (
                f"production's probe rows were generated with sampling hash {', '.join(hashes)}, this comparison would "
                f"send {s_hash}: not the same sampling (max_new_tokens, or the profile's sampling, differ from "
                "production's run: pass production's --max-new-tokens)"
            ),
        )
    rows = rows.filter(pl.col("sampling_hash").is_null() | (pl.col("sampling_hash") == s_hash))
    if baseline.without_generation_row:
        notes.append(
            f"{baseline.without_generation_row} production probe rows have no generations row any more: their "
            "integrity flags could not be read"
        )
    return rows, notes, None


def _probe_prompts(data: DataPath, shard: int, prompt_ids: list[str], sources: frozenset[str]) -> pl.DataFrame:
    """The shard's tokenized rows of these probe prompts (never a training prompt)."""
    files = list_files(shard_dir(data, "tokenized_prompts", shard), "part-*.parquet")
    if not files:
        return pl.DataFrame()
    ids = pl.Series(prompt_ids, dtype=pl.String)
    rows = (
        scan_parquet(files)
        .filter(pl.col("prompt_id").is_in(ids.implode()) & pl.col("source").is_in(sorted(sources)))
        .collect()
    )
    stray = rows.filter(~pl.col("source").is_in(sorted(sources)))
    if stray.height:  # never: the filter above; kept as the promise this module makes
        raise AssertionError(f"a non-probe prompt was about to be sent to a candidate: {stray['prompt_id'].to_list()}")
    return rows


def _conversations(inputs: CompareInputs, shard: int, tokenized: pl.DataFrame) -> MultiTurn | None:
    """The shard's probe conversations regenerated turn by turn (`regenerate: all_turns`), or None."""
    prompts = inputs.data / "prompts" / "prompts.parquet"
    if not prompts.exists():
        return None
    lf = scan_parquet([prompts])
    if "regenerate" not in lf.collect_schema().names():
        return None
    ids = tokenized["prompt_id"].implode()
    found = lf.filter(pl.col("regenerate").is_not_null() & pl.col("prompt_id").is_in(ids)).select("prompt_id")
    if found.collect().height == 0:
        return None
    if inputs.profile is None or inputs.renderer is None:
        raise ValueError("the probe sets hold conversations regenerated turn by turn: the comparison needs a renderer")
    return load_multiturn(
        prompts,
        shard,
        tokenized,
        renderer=inputs.renderer(),
        profile=inputs.profile,
        max_new_tokens=inputs.config.max_new_tokens,
    )


def _send_shard(
    inputs: CompareInputs, cand: CandidateServer, shard: int, tokenized: pl.DataFrame, counts: dict[str, int]
) -> pl.DataFrame:
    """One shard's probe prompts (and the turns of its probe conversations) to the candidate; its current rows."""
    multiturn = _conversations(inputs, shard, tokenized)
    out_dir = candidate_generations_dir(inputs.data, shard)
    report = generate_shard(tokenized, out_dir, inputs.config, lock_dir=inputs.lock_dir, multiturn=multiturn)
    turns = report.turns or {}
    counts["sent"] += report.succeeded + report.failed - report.carried_failed
    counts["sent"] += turns.get("turns_sent", 0) + turns.get("turns_failed", 0)
    counts["cached"] += report.skipped_cached + turns.get("turns_cached", 0)
    counts["failed"] += report.failed + turns.get("turns_failed", 0)
    if not report.drafter_key:
        raise CandidateRefused(f"the candidate stopped answering while it was measured (shard {shard:04d})")
    if report.drafter_key != cand.drafter.drafter_id:
        raise CandidateRefused(
            f"the candidate's drafter changed while it was measured: {cand.drafter.drafter_id} at the start, "
            f"{report.drafter_key} in shard {shard:04d}"
        )
    budget = ContextBudget.of(inputs.config, report.server_context_length)
    active = active_sample_ids(
        prompt_view(tokenized),
        report.model_revision,
        report.sampling_hash,
        inputs.config.regen_seed,
        row_hash=budget.hash_for if report.server_context_length is not None else None,
        probes=ProbeKeys(inputs.probe_sources, report.drafter_key, inputs.config.probe_seed),
    )
    current = current_turns(out_dir, active_turn_ids(report.turn_sample_ids)) if multiturn is not None else None
    return record_candidate_results(
        inputs.data,
        shard,
        active["sample_id"],
        turns=current,
        drafter_key=report.drafter_key,
        probe_seed=inputs.config.probe_seed,
        now=datetime.now(UTC),
    )


def _generate(inputs: CompareInputs, cand: CandidateServer, rows: pl.DataFrame, counts: dict[str, int]) -> pl.DataFrame:
    """Send the baseline's probe prompts to the candidate, shard by shard; the candidate's current rows."""
    out = []
    for shard in sorted(set(rows["shard"].to_list())):
        ids = rows.filter(pl.col("shard") == shard)["prompt_id"].unique().to_list()
        tokenized = _probe_prompts(inputs.data, shard, ids, inputs.probe_sources)
        if tokenized.height:
            out.append(_send_shard(inputs, cand, shard, tokenized, counts))
    return pl.concat(out) if out else pl.DataFrame()


def _lineage_notes(data: DataPath, *lineages: Lineage | None) -> list[str]:
    known = {v for v, _ in list_snapshots(data / "snapshots")}
    return [
        f"snapshot {x.snapshot} ({x.basis}) is not among this data dir's snapshots"
        for x in lineages
        if x is not None and x.snapshot not in known
    ]


def _verdict_doc(
    inputs: CompareInputs, baseline: Baseline, cand: CandidateServer, rows: pl.DataFrame, cand_rows: pl.DataFrame,
    notes: list[str], lineages: tuple[Lineage | None, Lineage | None],
) -> dict[str, Any]:  # fmt: skip
    rule = inputs.rule
    paired = pair(rows, cand_rows)
    d_base, d_cand = baseline.num_draft_tokens, cand.drafter.num_draft_tokens
    rates = d_base is not None and d_base == d_cand
    if not rates:
        notes.append(
            f"speculative_num_draft_tokens differ (production {d_base}, candidate {d_cand}): accept lengths are "
            "compared, accept rates are not (the rate falls as the draft budget grows)"
        )
    if paired.table.height == 0:
        raise BaselineError("no probe prompt has usable figures from both drafters: nothing to compare")
    overall, sources = judge(paired, rule, rates_compared=rates)
    missing = sum(v for why, v in overall.left_out.items() if why.startswith("no candidate answer"))
    failed = "failed requests: the errors.parquet of probes/candidates/generations/shard=NNNN"
    holds = [f"{missing} probe prompts have no candidate answer ({failed})"] if missing else []
    decision, reasons = decide(overall, sources, rule, holds)
    notes += [s.too_few for s in (*sources, overall) if s.too_few and s.too_few not in reasons]
    notes += [
        f"{why}: {k} prompts left out" for why, k in overall.left_out.items() if not why.startswith("no candidate")
    ]
    cand_line, prod_line = lineages
    return {
        "decision": decision,
        "reasons": reasons,
        "refused": None,
        "notes": notes,
        "headline": headline(cand_line, prod_line, interval_text(overall.length)),
        "rates_compared": rates,
        "overall": overall.as_json(rule.confidence),
        "sources": [s.as_json(rule.confidence) for s in sources],
    }


def compare_candidate(inputs: CompareInputs, request: CompareRequest) -> Outcome:
    """The comparison (module docstring); CandidateRefused when the candidate cannot be asked at all."""
    headers = {"Authorization": f"Bearer {inputs.config.api_key.reveal()}"} if inputs.config.api_key else None
    cand = inspect_candidate(request.candidate_urls, headers=headers)
    cand_lineage = candidate_lineage(request.trained_on, cand.drafter.draft_model_path)
    cand_json = _candidate_json(cand, cand_lineage)
    try:
        baseline = load_baseline(inputs.data, request.baseline, inputs.probe_sources)
    except BaselineError as e:
        return _refused(inputs, cand_json, None, str(e))
    prod_lineage = production_lineage(baseline.drafter_id, baseline.draft_model_path, read_comparisons(inputs.data))
    prod_json = {**baseline.as_json(), "trained_on": prod_lineage.as_json() if prod_lineage else None}
    if cand.drafter.drafter_id == baseline.drafter_id:
        return _refused(
            inputs, cand_json, prod_json,
            f"the candidate ({', '.join(cand.endpoints)}) runs the production drafter {cand.drafter.describe()}: the "
            "same identity, nothing to compare; deploy the new drafter on the candidate servers, or name another "
            "baseline with --baseline",
        )  # fmt: skip
    s_hash = sampling_hash(inputs.config)
    rows, notes, problem = _usable_baseline(baseline, cand, s_hash)
    if problem:
        return _refused(inputs, cand_json, prod_json, problem)
    inputs.log(
        f"comparing {cand.drafter.describe()} with production {baseline.drafter_id} on {rows.height} probe prompts"
    )
    counts = {"sent": 0, "cached": 0, "failed": 0}
    cand_rows = _generate(inputs, cand, rows, counts)
    try:
        verdict = _verdict_doc(
            inputs,
            baseline,
            cand,
            rows,
            cand_rows,
            notes + _lineage_notes(inputs.data, cand_lineage, prod_lineage),
            (cand_lineage, prod_lineage),
        )
    except BaselineError as e:
        return _refused(inputs, cand_json, prod_json, str(e))
    doc = {
        **verdict,
        "compared_at": _now(),
        "production": prod_json,
        "candidate": cand_json,
        "rule": inputs.rule.as_dict(),
        "probe_seed": inputs.config.probe_seed,
        "sampling_hash": s_hash,
        "model_revision": cand.model_revision,
        "requests": counts,
    }
    return Outcome(doc, str(write_comparison(inputs.data, doc)), counts)
