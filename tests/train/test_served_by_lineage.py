"""Which server and SGLang release made a row: every training row carries the `worker` and `sglang_version` of
its generation row (null where that row has none, also for chunks stored before those columns existed), and
the published snapshot counts them: manifest `served_by` and the data card, which names a mix of releases in
one plain line. The exports keep exactly the keys SpecForge and speculators read."""

from __future__ import annotations

import json
from types import SimpleNamespace

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from train_helpers import answered, build_shard, one_message_prompts

from eagle3_dagster import schemas
from eagle3_dagster.generate.multiturn import read_turn_rows, turn_generations, turns_dir
from eagle3_dagster.generate.store import iter_generations
from eagle3_dagster.publish.export import CONVERSATIONS_FILE, PREFORMATTED_FILE, SPECFORGE_FILE, exporters_for
from eagle3_dagster.publish.snapshot import SnapshotContent, build_snapshot
from eagle3_dagster.tokenize import PromptRenderer, tokenize_prompts
from eagle3_dagster.train import build_training_samples
from eagle3_dagster.train.samples import TRAINING_INPUT_COLUMNS
from eagle3_dagster.train.shard import SampleSources

SERVED = ("worker", "sglang_version")
# four generation rows: two workers on two releases (w2 upgraded mid-night), one row of a gateway that named
# no worker and whose release is not known
WORKERS = {"s-a": ("http://w1:30000", "0.5.12"), "s-b": ("http://w2:30000", "0.5.12")}
WORKERS |= {"s-c": ("http://w2:30000", "0.5.18"), "s-d": (None, None)}


def test_training_rows_and_the_snapshot_say_which_workers_and_releases_served_them(
    tmp_path, kimi_profile, kimi_tokenizer
):
    prompts = one_message_prompts([(p, "demo", f"question {p}") for p in (sid.removeprefix("s-") for sid in WORKERS)])
    tokenized, rejects = tokenize_prompts(prompts, PromptRenderer(kimi_profile, kimi_tokenizer), max_new_tokens=16)
    assert rejects.height == 0
    sids = [f"s-{p}" for p in tokenized["prompt_id"].to_list()]
    served = {"worker": [WORKERS[s][0] for s in sids], "sglang_version": [WORKERS[s][1] for s in sids]}
    gens = answered(tokenized, kimi_tokenizer, kimi_profile, **served)
    sources = SampleSources(tokenized, prompts, kimi_profile, kimi_tokenizer)
    table = build_shard(gens, sources, tmp_path / "training_samples" / "shard=0000")
    rows = {r["sample_id"]: r for r in table.to_pylist()}
    assert {sid: (r["worker"], r["sglang_version"]) for sid, r in rows.items()} == WORKERS
    assert table.schema.names == schemas.TRAINING_SAMPLES.names
    # every other column (token ids first) exactly what it was without the two columns
    plain = build_shard(gens.drop(*SERVED), sources, tmp_path / "plain")
    assert plain.column("worker").null_count == plain.column("sglang_version").null_count == plain.num_rows
    assert table.drop_columns(list(SERVED)).equals(plain.drop_columns(list(SERVED)))
    prompt_ids = dict(zip(tokenized["prompt_id"], tokenized["input_ids"].to_list()))
    for sid, r in rows.items():
        assert (
            r["input_ids"]
            == prompt_ids[r["prompt_id"]] + gens.filter(pl.col("sample_id") == sid)["output_ids"].to_list()[0]
        )

    exporters = exporters_for(kimi_profile.name, kimi_tokenizer)
    passed = lambda gate, shard: SimpleNamespace(success=True)
    snap = build_snapshot(tmp_path, [0], passed, SnapshotContent(config={}, exporters=exporters))
    assert snap.manifest["served_by"] == {
        "sglang_versions": {"0.5.12": 2, "0.5.18": 1, "unknown": 1},
        "workers": 2,
        "rows_without_worker": 1,
    }
    card = (snap.path / "README.md").read_text()
    assert (
        "\n**Mixed SGLang releases:** the rows were served by `0.5.12` (2 rows), `0.5.18` (1 rows), `unknown` "
        "(1 rows); each row's `sglang_version` says which (`unknown`: the row does not record it).\n" in card
    )
    assert (
        "| server (SGLang) | release(s) `0.5.12` (2 rows), `0.5.18` (1 rows), `unknown` (1 rows); 2 worker(s) " in card
    )
    # the exports stay exactly what SpecForge and speculators read: no provenance key, no worker or release
    keys = {
        SPECFORGE_FILE: {"id", "input_ids", "loss_mask"},
        PREFORMATTED_FILE: {"id", "text"},
        CONVERSATIONS_FILE: {
            "id",
            "conversations",
            "tools",
            "text_exact",
            "text_mismatch_pos",
            "control_text_in_content",
        },
    }
    for rel, want in keys.items():
        text = (snap.path / rel).read_text()
        lines = [json.loads(x) for x in text.splitlines()]
        assert len(lines) == 4 and all(set(r) == want for r in lines), rel
        assert "http://w1" not in text and "0.5.18" not in text, rel


def _row(sample_id: str, **over) -> dict:
    row = {f.name: None for f in schemas.TURN_GENERATIONS}
    row.update(sample_id=sample_id, prompt_id=f"p-{sample_id}", output_ids=[1, 2], integrity_violations=[], **over)
    return row


def test_generations_stored_before_the_columns_existed_still_train_with_null_provenance(tmp_path):
    """A chunk written before `worker` / `sglang_version` existed (final-turn and turn rows) reads as null
    there; a newer chunk beside it keeps its values."""
    gen_dir = tmp_path / "generations" / "shard=0000"
    gen_dir.mkdir(parents=True)
    old = pa.schema([f for f in schemas.GENERATIONS if f.name not in SERVED])
    pq.write_table(pa.Table.from_pylist([_row("a")], schema=old), gen_dir / "part-0001-a.parquet")
    new = _row("b", worker="http://w1:30000", sglang_version="0.5.18")
    pq.write_table(pa.Table.from_pylist([new], schema=schemas.GENERATIONS), gen_dir / "part-0002-b.parquet")
    gens = pl.concat(list(iter_generations(gen_dir, columns=TRAINING_INPUT_COLUMNS)))
    tokenized = pl.DataFrame(
        {"prompt_id": ["p-a", "p-b"], "input_ids": [[7], [8]], "tokenizer_fingerprint": ["f", "f"]},
        schema_overrides={"input_ids": pl.List(pl.Int32)},
    )
    samples, counts = build_training_samples(gens, tokenized)
    assert counts["samples"] == 2
    assert samples.select("sample_id", *SERVED).rows() == [("a", None, None), ("b", "http://w1:30000", "0.5.18")]
    assert samples["input_ids"].to_list() == [[7, 1, 2], [8, 1, 2]]

    # the turns of all_turns conversations, stored before the columns: read, and null there
    old_turns = pa.schema([f for f in schemas.TURN_GENERATIONS if f.name not in SERVED])
    turns_path = turns_dir(gen_dir).local_path
    turns_path.mkdir()
    pq.write_table(pa.Table.from_pylist([_row("t", prompt_ids=[3])], schema=old_turns), turns_path / "part-1.parquet")
    turns = turn_generations(read_turn_rows(gen_dir))
    assert turns.select("sample_id", *SERVED).rows() == [("t", None, None)]
