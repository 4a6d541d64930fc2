"""BFCL's multi-turn files, `function_docs` + `regenerate: all_turns`, through the real graph: real Dagster
runs, the real simulator over HTTP, the Kimi-K2.5 tokenizer from ../shared, the real BFCL files of
tests/data/bfcl (issue 28).

What a user relies on: every turn BFCL asks is answered on-policy (one stored turn row and one training
row per answered turn, each exactly the ids sent + the ids received); every request declares the
record's tools as Kimi's TypeScript text, and in a miss_func record the missed function only from
the turn BFCL adds it; later requests hold the model's own earlier answers; the counts reconcile.
"""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import polars as pl
import pytest

from eagle3_dagster.config import PROJECT_ROOT, settings
from eagle3_dagster.defs.ingest import build_ingest_assets
from eagle3_dagster.generate.multiturn import conversations_from_prompts
from eagle3_dagster.orchestration.resources import SGLangFleet, pipeline_resource
from eagle3_dagster.orchestration.run import GraphScope, materialize_graph
from eagle3_dagster.sim.process import start_simulator
from eagle3_dagster.sim.record import read_recorded
from eagle3_dagster.tokenize.kimi_tools import compute_tools_ts_str
from eagle3_dagster.tokenize.loading import load_tokenizer
from eagle3_dagster.tokenize.parse import parse_generation

pytestmark = pytest.mark.integration

BFCL = PROJECT_ROOT / "tests" / "data" / "bfcl"
BASE_LIMIT = 6


def _defs() -> dg.Definitions:
    from eagle3_dagster.definitions import defs

    ingest_free = [
        a
        for a in (defs.assets or [])
        if not any(k.path[0].startswith("source__") or k.path[0] == "prompts" for k in a.keys)
    ]
    return dg.Definitions(assets=[*build_ingest_assets(settings()), *ingest_free])


def _assets(tmp_path: Path) -> Path:
    assets = tmp_path / "assets"
    (assets / "sources").mkdir(parents=True)
    (assets / "models").symlink_to(PROJECT_ROOT / "assets" / "models")
    common = f"format: bfcl\nfunction_docs: {BFCL / 'multi_turn_func_doc'}\nregenerate: all_turns\n"
    (assets / "sources" / "bfcl_base.yaml").write_text(
        f"path: {BFCL / 'BFCL_v4_multi_turn_base.json.gz'}\nlimit: {BASE_LIMIT}\n{common}"
    )
    (assets / "sources" / "bfcl_miss_func.yaml").write_text(
        f"path: {BFCL / 'BFCL_v4_multi_turn_miss_func.excerpt.json'}\n{common}"
    )
    return assets


def _declared(text: str) -> str:
    head = "<|im_system|>tool_declare<|im_middle|>"
    assert text.startswith(head), text[:200]
    return text[len(head) : text.index("<|im_end|>")]


def test_bfcl_multi_turn_all_turns_on_policy_with_tools_per_turn(tmp_path, monkeypatch, kimi_profile) -> None:
    monkeypatch.setenv("EAGLE3_ASSETS_DIR", str(_assets(tmp_path)))
    data, log = tmp_path / "data", tmp_path / "requests.jsonl"
    defs = _defs()
    args = ["--model", "kimi-k2.5", "--tokenizer", kimi_profile.tokenizer, "--record-requests", str(log)]
    with start_simulator(extra_args=args) as sim:
        res = {
            "pipeline": pipeline_resource(
                settings(), data_dir=str(data), model="kimi-k2.5", tokenizer=kimi_profile.tokenizer
            ),
            "sglang": SGLangFleet(urls=sim.url, wait_for_endpoint_s=5),
        }
        with dg.instance_for_test() as instance:
            assert materialize_graph(defs, instance, scope=GraphScope(shards=[]), resources=res).ingest_success
            prompts = pl.read_parquet(data / "prompts" / "prompts.parquet")
            assert prompts.group_by("source").len().sort("source").rows() == [
                ("bfcl_base", BASE_LIMIT),
                ("bfcl_miss_func", 4),
            ]
            assert pl.read_parquet(data / "prompts" / "prompt_rejects.parquet").height == 0
            # the shards holding a miss_func conversation (and the base ones beside them)
            shards = sorted({f"{s:04d}" for s in prompts.filter(pl.col("source") == "bfcl_miss_func")["shard"]})
            out = materialize_graph(defs, instance, scope=GraphScope(shards=shards, run_ingest=False), resources=res)
            assert all(sh.success for sh in out.shards), out.shards
    tok = load_tokenizer(kimi_profile.tokenizer)
    sent = {tuple(r["input_ids"]) for r in read_recorded(log)}
    tokenized = pl.read_parquet(data / "tokenized_prompts" / "shard=*" / "part-*.parquet")
    conversations = {c.conversation_id: c for c in conversations_from_prompts(prompts, tokenized)}
    missed_at = {}  # conversation id -> (question index of the missed turn, missed names)
    for r in prompts.filter(pl.col("source") == "bfcl_miss_func").iter_rows(named=True):
        rec = json.loads(
            (BFCL / "BFCL_v4_multi_turn_miss_func.excerpt.json").read_text().splitlines()[r["source_row"] - 1]
        )
        ((turn, names),) = rec["missed_function"].items()
        missed_at[r["prompt_id"]] = (int(turn), names)

    reached_missed_turn = later = 0
    for sh in shards:
        t = json.loads((data / "generations" / f"shard={sh}" / "turns.json").read_text())  # the run's turn counts
        in_shard = [c for c in conversations.values() if c.shard == int(sh)]
        assert t["reconciles"] is True and t["conversations"] == len(in_shard), t
        assert t["turns_planned"] == sum(len(c.turns) for c in in_shard)  # every BFCL question is a turn
        # end to end: every conversation answered all its turns (the simulator answers every turn with `stop`)
        assert t["conversations_completed"] == t["conversations"] and t["turns_regenerated"] == t["turns_planned"], t
        turns = pl.read_parquet(data / "generations" / f"shard={sh}" / "turns" / "part-*.parquet")
        train = pl.read_parquet(data / "training_samples" / f"shard={sh}" / "part-0000.parquet")
        assert t["turns_regenerated"] - t["turns_shared"] == turns.height
        # one training row per answered turn, exactly the ids sent + the ids received
        quarantined = set(pl.read_parquet(data / "training_samples" / f"shard={sh}" / "quarantine.parquet")["row_id"])
        quarantined |= set(pl.read_parquet(data / "generations" / f"shard={sh}" / "quarantine.parquet")["row_id"])
        turn_train = train.filter(pl.col("turn_index").is_not_null())
        assert turn_train.height + len(quarantined & set(turns["sample_id"])) == turns.height
        by_sid = {r["sample_id"]: r for r in turns.iter_rows(named=True)}
        for r in turn_train.iter_rows(named=True):
            g = by_sid[r["sample_id"]]
            assert r["input_ids"] == g["prompt_ids"] + g["output_ids"] and tuple(g["prompt_ids"]) in sent
            assert r["tools"] == g["tools"]  # the training row carries the tools that turn declared
        by_conv: dict[str, dict[int, dict]] = {}
        for g in by_sid.values():
            by_conv.setdefault(g["conversation_id"], {})[g["turn_index"]] = g
        for cid, ts in by_conv.items():
            conv = conversations[cid]
            for k, g in ts.items():
                tools, tools_json = conv.tools_at(conv.turns[k - 1])
                assert g["tools"] == tools_json
                text = tok.decode(g["prompt_ids"], skip_special_tokens=False)
                # the request declares exactly that turn's tools, as Kimi's TypeScript text
                assert _declared(text) == compute_tools_ts_str(tools)[1]
                if cid in missed_at:
                    turn, names = missed_at[cid]
                    for name in names:
                        assert (f"\ntype {name} = (_:" in _declared(text)) is (k - 1 >= turn), (cid, k, name)
                    reached_missed_turn += k - 1 == turn
                for j in range(1, k):  # on-policy: the model's own earlier answers are in the prompt
                    own = parse_generation(ts[j]["output_ids"], kimi_profile, tok)
                    if own.content.strip():
                        assert own.content.strip() in text, (cid, k, j)
                    for call in own.tool_calls:
                        assert call["function"]["arguments"] in text
                later += k > 1
    assert later > 0 and reached_missed_turn == len(missed_at) == 4  # each miss_func record reached its added turn
