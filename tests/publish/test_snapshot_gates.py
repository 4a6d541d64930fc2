"""The publish gate's thresholds are data: a sudden drop against the previous snapshot is refused (LATEST
stays), the same drop is accepted when expectations/publish.json (or an override) allows it."""

from __future__ import annotations

import json
import shutil

from quality_helpers import EXPECTATIONS_DIR, training_rows

from eagle3_dagster.publish.snapshot import PublishPolicy, SnapshotContent, build_snapshot
from eagle3_dagster.publish.snapshot_gates import judge_snapshot
from eagle3_dagster.quality import read_gate_result, run_gate, training_features, write_gate_result
from eagle3_dagster.storage import write_frame_atomic


def _publish(data, kimi, profile, n: int, expectations=EXPECTATIONS_DIR):
    prompt = kimi.prompt("What is 2+2?")
    rows = [
        dict(sample_id=f"s{n}-{i}", prompt_ids=prompt, output_ids=kimi.output(f"step {i} of {n}", "4"))
        for i in range(n)
    ]
    samples = training_rows(rows)
    write_frame_atomic(samples, data / "training_samples" / "shard=0000" / "part-0000.parquet")
    if read_gate_result(data, "training_samples", 0) is None:
        res = run_gate(
            "training_samples",
            training_features(samples, profile, max_total_len=65536),
            expectations_dir=EXPECTATIONS_DIR,
            context_dir=data / "gx",
        )
        for gate in ("prompts", "generations", "training_samples"):
            write_gate_result(data, gate, 0, res)

    def judge(facts):
        return judge_snapshot(
            facts,
            expectations_dir=expectations,
            context_dir=data / "gx",
        )

    return build_snapshot(
        data,
        [0],
        lambda g, k: read_gate_result(data, g, k),
        SnapshotContent(config={}, profile=profile),
        policy=PublishPolicy(judge=judge),
    )


def test_a_sudden_drop_is_refused_unless_the_threshold_allows_it(tmp_path, kimi, kimi_profile):
    data = tmp_path / "data"
    first = _publish(data, kimi, kimi_profile, 10)
    assert first.published and (data / "snapshots" / "LATEST").read_text().strip() == first.version

    dropped = _publish(data, kimi, kimi_profile, 4)
    assert not dropped.published and dropped.path is None
    assert (data / "snapshots" / "LATEST").read_text().strip() == first.version
    assert dropped.verdict.reasons == [
        f"at least 50% of the previous snapshot's rows: 4 rows vs 10 in snapshot {first.version} (40%)"
    ]
    assert not (data / "snapshots" / dropped.version).exists()
    attempt = json.loads((data / "gates" / "publish" / "last.json").read_text())
    assert attempt["version"] == dropped.version and not attempt["published"] and not attempt["written"]

    # a smaller dataset on purpose: lower the threshold in the suite (data, not code)
    loose = tmp_path / "expectations"
    shutil.copytree(EXPECTATIONS_DIR, loose)
    suite = json.loads((loose / "publish.json").read_text())
    for e in suite["expectations"]:
        if e["meta"]["key"] == "rows_vs_previous":
            e["kwargs"]["min_value"] = 0.3
    (loose / "publish.json").write_text(json.dumps(suite))
    accepted = _publish(data, kimi, kimi_profile, 4, expectations=loose)
    assert accepted.published and accepted.version == dropped.version
    assert (data / "snapshots" / "LATEST").read_text().strip() == accepted.version
    assert accepted.manifest["publish_gate"]["values"]["rows_fraction_of_previous"] == 0.4


MANIFEST_KEYS = {
    "card", "config", "created_at", "drift", "exports", "files", "identity", "previous_version", "publish_gate",
    "published", "published_at", "request_failures", "rows", "served_by", "shards", "shards_left_out", "summary",
    "version",
}  # fmt: skip
GATE_KEYS = {"created_at", "outcomes", "success", "suite_sha256", "values"}
OUTCOME_KEYS = {"column", "description", "key", "name", "severity", "success"}


def test_the_manifest_keeps_the_verdict_as_json_readers_know_it(tmp_path, kimi, kimi_profile):
    """What readers of manifest.json (the report, the card, smoke) rely on: the same keys and values the
    verdict had when it was a dict; the verdict in memory is typed, the manifest on disk is not."""
    data = tmp_path / "data"
    first = _publish(data, kimi, kimi_profile, 10)
    second = _publish(data, kimi, kimi_profile, 7)
    for snap in (first, second):
        on_disk = json.loads((data / "snapshots" / snap.version / "manifest.json").read_text())
        assert on_disk == json.loads(json.dumps(snap.manifest)) and set(on_disk) == MANIFEST_KEYS
        assert on_disk["published"] is True and on_disk["publish_gate"] == snap.verdict.to_json()["publish_gate"]
        pg = on_disk["publish_gate"]
        assert set(pg) == GATE_KEYS and pg["success"] is True
        assert all(set(o) == OUTCOME_KEYS for o in pg["outcomes"]) and pg["outcomes"]
        assert set(pg["values"]) == {
            "row_id", "rows", "rows_fraction_of_previous", "same_answer_share", "shards_included",
            "shards_left_out_unasked",
        }  # fmt: skip
    assert first.manifest["drift"] is None and first.manifest["previous_version"] is None
    drift = json.loads((data / "snapshots" / second.version / "manifest.json").read_text())["drift"]
    assert set(drift) == GATE_KEYS | {"status", "policy", "against", "failed", "before"}
    assert (drift["status"], drift["policy"], drift["against"], drift["failed"]) == ("ok", "publish", first.version, [])
    assert drift["before"] == {"model_revision": "m", "sampling_hash": "s", "rows": 10}
    assert drift["values"]["reasoning_len_p50_ratio"] is not None and drift["values"]["model_revision_changed"] is False
    assert second.manifest["publish_gate"]["values"]["rows_fraction_of_previous"] == 0.7
    last = json.loads((data / "gates" / "publish" / "last.json").read_text())
    assert last["verdict"] == json.loads(json.dumps(second.verdict.to_json()))
