"""What one shard's training build reads, and the build from it (plain: no Dagster).

The inputs: the shard's current samples (the latest generations materialization, probe samples left out:
probe sets are never trained on), their generations streamed in batches, the sources of the two lookups
(the tokenized prompts and the prompts, plus the turns of all_turns conversations) and the row ids the
prompts and generations gates quarantined. A shard whose stored prompts or generations gate failed (in
any earlier run) is never consumed: `training_inputs` raises GateFailedError naming it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import polars as pl
import pyarrow as pa

from ..generate.active import read_active_samples
from ..generate.inputs import iter_batches, tokenized_source
from ..generate.multiturn import current_turns, turn_generations, turn_prompt_rows, turn_tokenized
from ..generate.probes import without_probes
from ..generate.store import iter_generations
from ..ingest.pipeline import PROMPTS_FILE
from ..ingest.prompts_table import shard_prompts
from ..profiles import ModelProfile
from ..quality.gate import GateResult, require_gate_passed
from ..schemas import GENERATIONS, TRAINING_SAMPLES, TRAINING_SAMPLES_TURNS
from ..storage import DataPath, KeyedRows, shard_dir
from .multiturn import WithTurns, with_turns
from .samples import ACCEPTANCE_INPUT_COLUMNS, TRAINING_INPUT_COLUMNS, with_acceptance
from .shard import SampleSources, ShardOutput, TrainingShard, build_training_shard

GENERATION_BATCH_ROWS = 512  # generations parsed and built at a time (train/shard.py streams the shard)

TOKEN_ROWS = {
    "prompt_id": pl.String,
    "input_ids": pl.List(pl.Int32),
    "tokenizer_fingerprint": pl.String,
    "control_text_in_content": pl.Boolean,  # as_served control text: carried onto the training rows
}
PROMPT_ROWS = {"prompt_id": pl.String, "messages": pl.String, "tools": pl.String}
_NO_SOURCES = pl.DataFrame(schema={"prompt_id": pl.String, "source": pl.String})


def table_schema(turns: bool, acceptance: bool) -> pa.Schema:
    """The shard's training table: with the turns' lineage columns, with the per-row acceptance columns."""
    schema = TRAINING_SAMPLES_TURNS if turns else TRAINING_SAMPLES
    return with_acceptance(schema) if acceptance else schema


def shard_prompt_batches(prompts_path: Any, shard: int) -> Iterable[pl.DataFrame]:
    """prompt_id, messages, tools of the shard's rows of prompts.parquet, streamed in batches."""
    for b in shard_prompts(prompts_path, shard, columns=list(PROMPT_ROWS), batch_rows=1024):
        yield b.cast(cast(Any, PROMPT_ROWS))


def passed_gates(data: Any, shard: int) -> dict[str, GateResult]:
    """The shard's stored prompts and generations gate results; GateFailedError when either is missing or failed."""
    return {g: require_gate_passed(data, g, shard) for g in ("prompts", "generations")}


@dataclass(frozen=True)
class TrainingInputs:
    """What one shard's training build reads: the current samples, their generations (streamed), the lookups'
    sources (the tokenized prompts and the prompts, plus the turns of all_turns conversations) and the gates."""

    active: pl.Series
    batches: Iterable[pl.DataFrame]
    token_rows: Iterable[pl.DataFrame]
    prompt_rows: Iterable[pl.DataFrame]
    turns: WithTurns  # lineage, excluded samples, per-source tokenized counts
    bad_sample_ids: set[str]
    bad_prompt_ids: set[str]
    acceptance: bool
    probe_samples_left_out: int = 0  # current samples of probe sources, not trained on

    @property
    def schema(self) -> pa.Schema:
        return table_schema(self.turns.lineage is not None, self.acceptance)


def training_inputs(
    data: Any,
    shard: int,
    *,
    profile_name: str,
    tokenizer_fingerprint: str,
    probe_sources: Sequence[str],
    acceptance: bool,
) -> TrainingInputs:
    """The inputs of shard `shard` of the data dir `data`; `acceptance`: with the per-row acceptance columns."""
    gates = passed_gates(data, shard)
    tok_src = tokenized_source(data, shard)  # a folder, streamed: the prompt ids are never held whole
    gen_dir = shard_dir(data, "generations", shard)
    source_of = pl.concat(list(iter_batches(tok_src, ["prompt_id", "source"])) or [_NO_SOURCES])
    current = read_active_samples(gen_dir)
    active_samples = without_probes(current, source_of, probe_sources)  # probe sets: never trained on
    bad_prompts = set(gates["prompts"].row_failures["row_id"].to_list())
    # the turns of all_turns conversations: one row each, built like any sample (train/multiturn.py)
    turns = current_turns(gen_dir, active_samples)
    wt = with_turns(  # per-row scalars only here: the prompts' ids and messages are looked up per batch
        cast(pl.DataFrame, pl.from_arrow(GENERATIONS.empty_table())),  # the generations come streamed
        source_of,
        pl.DataFrame(schema=PROMPT_ROWS),
        turns,
        profile_name=profile_name,
        tokenizer_fingerprint=tokenizer_fingerprint,
        bad_prompt_ids=bad_prompts,
    )
    extra_tok: list[pl.DataFrame] = []
    extra_prompts: list[pl.DataFrame] = []
    if turns.height:  # each turn's exact prompt ids and messages, looked up like the prompts'
        extra_tok = [turn_tokenized(turns, profile_name=profile_name, tokenizer_fingerprint=tokenizer_fingerprint)]
        extra_prompts = [turn_prompt_rows(turns)]
    active = active_samples["sample_id"]
    batches: Iterable[pl.DataFrame] = iter_generations(
        gen_dir,
        only=active,
        batch_rows=GENERATION_BATCH_ROWS,
        columns=(*TRAINING_INPUT_COLUMNS, *(ACCEPTANCE_INPUT_COLUMNS if acceptance else ())),
    )
    if turns.height:
        batches = itertools.chain(batches, [turn_generations(turns)])
    return TrainingInputs(
        active=active,
        batches=batches,
        token_rows=itertools.chain(iter_batches(tok_src, list(TOKEN_ROWS)), extra_tok),
        prompt_rows=itertools.chain(shard_prompt_batches(data / "prompts" / PROMPTS_FILE, shard), extra_prompts),
        turns=wt,
        bad_sample_ids=set(gates["generations"].row_failures["row_id"].to_list()) | wt.exclude_sample_ids,
        bad_prompt_ids=bad_prompts,
        acceptance=acceptance,
        probe_samples_left_out=current.height - active_samples.height,
    )


def build_from_inputs(
    inputs: TrainingInputs, profile: ModelProfile, tokenizer: Any, out: DataPath | Path, *, spill_dir: Path
) -> TrainingShard:
    """Build the shard's training table (`out`/part-0000.parquet, its parse quarantine beside it) from its
    inputs, the lookups spilled to disk (bounded memory)."""
    with (
        KeyedRows(inputs.token_rows, "prompt_id", TOKEN_ROWS, spill_dir=spill_dir) as tokenized,
        KeyedRows(inputs.prompt_rows, "prompt_id", PROMPT_ROWS, spill_dir=spill_dir) as prompts,
    ):
        return build_training_shard(
            inputs.batches,
            inputs.active,
            SampleSources(tokenized, prompts, profile, tokenizer, inputs.bad_sample_ids, inputs.bad_prompt_ids),
            ShardOutput(out / "part-0000.parquet", out / "quarantine.parquet", inputs.schema, spill_dir),
            max_total_len=profile.max_train_len,
            lineage=inputs.turns.lineage,
        )
