"""regenerate: all_turns through the real graph: real Dagster runs, the real simulator over HTTP, the
shared multi-turn datasets, both model profiles (generate/multiturn.py, train/multiturn.py).

What a user relies on: every later turn is generated from a prompt holding the model's OWN earlier
answers (what the simulator received, from its request log) and none of the dataset's assistant
text; every training row is exactly a request's ids + the ids it got back; one row per regenerated
turn; the turn counts reconcile; an unchanged night sends nothing; a run that fails mid-shard
resumes without re-sending the stored turns.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import dagster as dg
import polars as pl
import pytest
from graph_helpers import shard_with_most_prompts

from eagle3_dagster.config import PROJECT_ROOT, settings
from eagle3_dagster.defs.ingest import build_ingest_assets
from eagle3_dagster.orchestration.resources import SGLangFleet, pipeline_resource
from eagle3_dagster.orchestration.run import GraphScope, materialize_graph
from eagle3_dagster.sim.process import start_simulator
from eagle3_dagster.sim.record import read_recorded
from eagle3_dagster.tokenize.loading import load_tokenizer
from eagle3_dagster.tokenize.parse import parse_generation

pytestmark = pytest.mark.integration

# the shared multi-turn datasets: folder/file, format, extra YAML
SOURCES = {
    "sharegpt": ("sharegpt_v3_test/sharegpt_test.json", "sharegpt", ""),
    "ultrachat": ("ultrachat_200k_sample/ultrachat_200k_sample20.json", "ultrachat", ""),
    "glaive": ("glaive_toolcall_sharegpt_en/glaive_toolcall_en_demo.json", "glaive", "on_tool_mismatch: continue\n"),
    "hermes": ("hermes_reasoning_tool_use/reason_tool_use_demo_50.jsonl", "hermes", ""),
    "bfcl": ("bfcl_live_simple/BFCL_v4_live_simple.json", "bfcl", ""),
}


def _assets(tmp_path: Path, datasets_dir: Path, limit: int) -> Path:
    assets = tmp_path / "assets"
    (assets / "sources").mkdir(parents=True)
    (assets / "models").symlink_to(PROJECT_ROOT / "assets" / "models")
    for name, (rel, fmt, extra) in SOURCES.items():
        body = f"path: {datasets_dir / rel}\nformat: {fmt}\nlimit: {limit}\nregenerate: all_turns\nmax_turns: 3\n"
        (assets / "sources" / f"{name}.yaml").write_text(body + textwrap.dedent(extra))
    return assets


def _defs() -> dg.Definitions:
    from eagle3_dagster.definitions import defs

    ingest_free = [
        a
        for a in (defs.assets or [])
        if not any(k.path[0].startswith("source__") or k.path[0] == "prompts" for k in a.keys)
    ]
    return dg.Definitions(assets=[*build_ingest_assets(settings()), *ingest_free])


def _turn_rows(data: Path, shard: str) -> pl.DataFrame:
    return pl.read_parquet(data / "generations" / f"shard={shard}" / "turns" / "part-*.parquet")


def _meta(instance, key: str) -> dict:
    return instance.get_latest_materialization_event(dg.AssetKey(key)).asset_materialization.metadata


def _run_profile(tmp_path, monkeypatch, datasets_dir, profile, model: str, *, limit: int = 4, night2: bool = True):
    assets = _assets(tmp_path, datasets_dir, limit)
    monkeypatch.setenv("EAGLE3_ASSETS_DIR", str(assets))
    data = tmp_path / "data"
    log = tmp_path / "requests.jsonl"
    args = ["--model", model, "--tokenizer", profile.tokenizer, "--record-requests", str(log)]
    defs = _defs()
    with start_simulator(extra_args=args) as sim:
        res = {
            "pipeline": pipeline_resource(settings(), data_dir=str(data), model=model, tokenizer=profile.tokenizer),
            "sglang": SGLangFleet(urls=sim.url, wait_for_endpoint_s=5),
        }
        with dg.instance_for_test() as instance:
            assert materialize_graph(defs, instance, scope=GraphScope(shards=[]), resources=res).ingest_success
            shard = shard_with_most_prompts(data)
            sh = materialize_graph(
                defs, instance, scope=GraphScope(shards=[shard], run_ingest=False), resources=res
            ).shards[0]
            assert sh.success, sh
            gen_meta, train_meta = _meta(instance, "generations"), _meta(instance, "training_samples")
            first_requests = len(read_recorded(log))
            if not night2:
                return data, shard, log, gen_meta, train_meta, first_requests
            # an unchanged night: every turn is replayed from the store, nothing is sent
            again = materialize_graph(
                defs, instance, scope=GraphScope(shards=[shard], run_ingest=False), resources=res
            ).shards[0]
            assert again.success, again
            assert len(read_recorded(log)) == first_requests
            assert (
                _meta(instance, "generations")["turns"].value["turns_cached"]
                == gen_meta["turns"].value["turns_regenerated"]
            )
    return data, shard, log, gen_meta, train_meta, first_requests


def _check(data: Path, shard: str, log: Path, gen_meta, train_meta, profile, datasets_dir) -> dict:
    tok = load_tokenizer(profile.tokenizer)
    prompts = pl.read_parquet(data / "prompts" / "prompts.parquet").filter(pl.col("shard") == int(shard))
    conv = {r["prompt_id"]: r for r in prompts.filter(pl.col("regenerate").is_not_null()).iter_rows(named=True)}
    assert conv, "the shard holds all_turns conversations"
    turns = _turn_rows(data, shard)
    train = pl.read_parquet(data / "training_samples" / f"shard={shard}" / "part-0000.parquet")
    recorded = [tuple(r["input_ids"]) for r in read_recorded(log)]
    sent = set(recorded)

    # counts reconcile: turns planned = regenerated + not reached (by reason); conversations = completed + ended
    t = gen_meta["turns"].value
    assert t["reconciles"] is True, t
    planned = sum(len(json.loads(c["regenerate"])["turns"]) for c in conv.values())
    assert t["turns_planned"] == planned
    assert t["turns_planned"] == t["turns_regenerated"] + sum(t["turns_not_reached"].values())
    assert (
        t["conversations"] == len(conv) == t["conversations_completed"] + sum(t["conversations_ended_early"].values())
    )
    # the first night sent every turn (a prompt two conversations share is one sample)
    assert t["turns_regenerated"] - t["turns_shared"] == turns.height <= t["turns_sent"]
    assert t["turns_cached"] == 0
    assert sum(int(v) for v in t["rows_by_turn"].values()) == t["turns_regenerated"]
    assert max(turns["turn_index"].to_list()) >= 2, "some conversation reached a later turn"

    # every training row of a turn is exactly the ids sent for it + the ids received; one row per turn
    by_sid = {r["sample_id"]: r for r in turns.iter_rows(named=True)}
    quarantined = set(pl.read_parquet(data / "generations" / f"shard={shard}" / "quarantine.parquet")["row_id"])
    quarantined |= set(pl.read_parquet(data / "training_samples" / f"shard={shard}" / "quarantine.parquet")["row_id"])
    turn_train = train.filter(pl.col("turn_index").is_not_null())
    assert turn_train.height + len(quarantined & set(by_sid)) == turns.height
    for r in turn_train.iter_rows(named=True):
        g = by_sid[r["sample_id"]]
        assert tuple(g["prompt_ids"]) in sent  # the simulator received exactly these ids
        assert r["input_ids"] == g["prompt_ids"] + g["output_ids"]
        assert r["loss_mask"] == [0] * len(g["prompt_ids"]) + [1] * len(g["output_ids"])
        assert (r["conversation_id"], r["turn_index"]) == (g["conversation_id"], g["turn_index"])
        assert (r["worker"], r["sglang_version"]) == (g["worker"], g["sglang_version"]) and r["sglang_version"]
    assert train.filter(pl.col("turn_index").is_null()).height == 0  # this shard holds only conversations

    # every later-turn request holds the model's own earlier answers and none of the dataset's
    by_conv: dict[str, dict[int, dict]] = {}
    for r in turns.iter_rows(named=True):
        by_conv.setdefault(r["conversation_id"], {})[r["turn_index"]] = r
    later = 0
    for cid, ts in by_conv.items():
        messages = json.loads(conv[cid]["conversation"])
        positions = json.loads(conv[cid]["regenerate"])["turns"]
        for k, row in ts.items():
            if k == 1:
                continue
            later += 1
            text = tok.decode(row["prompt_ids"], skip_special_tokens=False)
            for j in range(1, k):
                own = parse_generation(ts[j]["output_ids"], profile, tok)
                if own.content.strip():
                    assert own.content.strip() in text, (cid, k, j)
                for call in own.tool_calls:
                    assert call["function"]["arguments"] in text
                dataset_text = (messages[positions[j - 1]].get("content") or "").strip()
                if len(dataset_text) >= 30 and dataset_text not in (own.content or ""):
                    assert dataset_text[:200] not in text, (cid, k, j)
    assert later > 0

    # the conversations a user exports: the last turn's row holds the whole regenerated conversation
    for ts in by_conv.values():
        last = ts[max(ts)]
        rows = train.filter(pl.col("sample_id") == last["sample_id"])
        if rows.height == 0:
            continue
        msgs = json.loads(rows["conversation"][0])
        assistants = [m for m in msgs if m["role"] == "assistant"]
        assert len(assistants) >= len(ts)
        for m in assistants[-len(ts) :]:
            assert m.get("reasoning_content")
    # metadata a user reads: rows per turn index; the quality report's conversations section
    assert train_meta["turn_rows"].value["rows_by_turn"]
    report = (data / "reports" / "index.html").read_text()
    section = report.split("<h2>Multi-turn conversations (regenerate: all_turns)</h2>")[1].split("</table>")[0]
    assert f"<td>{shard}</td>" in section and f'<td class="num">{t["turns_planned"]}</td>' in section
    for reason in t["conversations_ended_early"]:
        assert reason in section
    return t


def test_all_turns_kimi(tmp_path, monkeypatch, datasets_dir, kimi_profile):
    data, shard, log, gen_meta, train_meta, _ = _run_profile(
        tmp_path, monkeypatch, datasets_dir, kimi_profile, "kimi-k2.5"
    )
    _check(data, shard, log, gen_meta, train_meta, kimi_profile, datasets_dir)


def test_all_turns_qwen3(tmp_path, monkeypatch, datasets_dir, qwen_profile):
    data, shard, log, gen_meta, train_meta, _ = _run_profile(
        tmp_path, monkeypatch, datasets_dir, qwen_profile, "qwen3", night2=False
    )
    _check(data, shard, log, gen_meta, train_meta, qwen_profile, datasets_dir)
    _check_published(data, shard, qwen_profile)


def _check_published(data: Path, shard: str, profile) -> None:
    """Publishing a shard of turn rows: the snapshot and every export hold each turn row, lineage kept,
    and the conversations export's last turn of each conversation is the whole regenerated conversation."""
    res = {
        "pipeline": pipeline_resource(settings(), data_dir=str(data), model="qwen3", tokenizer=profile.tokenizer),
        "sglang": SGLangFleet(urls="http://127.0.0.1:9"),  # publishing sends nothing
    }
    with dg.instance_for_test() as instance:
        out = materialize_graph(
            _defs(),
            instance,
            scope=GraphScope(shards=[], run_ingest=False, run_publish=True, allow_partial=True),
            resources=res,
        )
    assert out.publish_success, out
    snap = data / "snapshots" / (data / "snapshots" / "LATEST").read_text().strip()
    train = pl.read_parquet(data / "training_samples" / f"shard={shard}" / "part-0000.parquet")
    published = pl.read_parquet(snap / "training_samples" / f"shard={shard}.parquet")
    assert published.select("sample_id", "input_ids", "conversation_id", "turn_index").equals(
        train.select("sample_id", "input_ids", "conversation_id", "turn_index")
    )
    exported = {json.loads(line)["id"]: json.loads(line) for line in (snap / "exports" / "conversations.jsonl").open()}
    assert set(exported) == set(train["sample_id"])  # one export row per turn row
    prompts = {json.loads(line)["id"] for line in (snap / "exports" / "specforge_prompts.jsonl").open()}
    assert prompts == set(train["sample_id"])
    last = train.sort("turn_index").group_by("conversation_id", maintain_order=True).last()
    for r in last.iter_rows(named=True):
        assistants = [m for m in exported[r["sample_id"]]["conversations"] if m["role"] == "assistant"]
        assert len(assistants) >= r["turn_index"]  # every regenerated turn up to the last one
        assert all(m.get("reasoning_content") for m in assistants[-r["turn_index"] :])
