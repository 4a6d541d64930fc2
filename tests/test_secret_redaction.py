"""secret.redact: the one function every server text and URL-bearing exception text goes through."""

from __future__ import annotations

import json
import logging

from eagle3_dagster.generate.drafter import DrafterIdentity
from eagle3_dagster.generate.endpoint_info import (
    describe_error,
    display_url,
    error_message,
    model_revision_of,
    safe_message,
)
from eagle3_dagster.generate.endpoints import DrafterReading, drafter_change_text
from eagle3_dagster.secret import REDACTED, RedactingFilter, Secret, redact


def test_a_settings_secret_is_redacted_wherever_it_appears():
    Secret("e3-unit-key-9f8e7d")  # the settings hand the key over as a Secret: that registers it
    text = "echo: e3-unit-key-9f8e7d, url-encoded e3-unit-key-9f8e7d too"
    assert "e3-unit-key-9f8e7d" not in redact(text)
    assert redact(text).count(REDACTED) == 2


def test_key_like_patterns_are_redacted_and_the_rest_kept():
    cases = {
        "{'authorization': 'Bearer abc.def-123', 'host': 'h:1'}": "{'authorization': 'Bearer [redacted]', 'host': 'h:1'}",
        "Authorization: Basic Ym9iOmh1bnRlcjI=": "Authorization: Basic [redacted]",
        "GET http://bob:hunter2@gw:8080/x failed": "GET http://bob:[redacted]@gw:8080/x failed",
        '{"api_key": "zz9", "n": 1}': '{"api_key": "[redacted]", "n": 1}',
        "url?api-key=abc&access_token=def&x=1": "url?api-key=[redacted]&access_token=[redacted]&x=1",
        "key sk-abcdefghijkl here": "key [redacted] here",
        "Authorization: Token abc123 def\nnext": "Authorization: [redacted]\nnext",
        "{'x-api-key': 'k-1', 'authorization': 'ApiKey zz top'}": "{'x-api-key': '[redacted]', 'authorization': '[redacted]'}",
        "completion_tokens: 5, max_new_tokens=7": "completion_tokens: 5, max_new_tokens=7",
    }
    for raw, want in cases.items():
        assert redact(raw) == want, raw


def test_server_error_bodies_are_redacted_where_they_enter():
    body = {"object": "error", "message": "bad request, headers={'authorization': 'Bearer q-secret-77'}", "code": 400}
    assert "q-secret-77" not in error_message(json.dumps(body).encode())
    assert "q-secret-77" not in error_message(b"proxy said: Authorization: Bearer q-secret-77")
    assert "q-secret-77" not in safe_message("token=q-secret-77")
    # a long quote: the key straddles the 1000-character cut, and no part of it survives
    Secret("straddling-key-0123456789")
    long_body = ("x" * 990 + " straddling-key-0123456789 tail").encode()
    kept = error_message(long_body)
    assert len(kept) <= 1000 and "straddl" not in kept


def test_urls_never_show_their_credentials():
    assert display_url("http://bob:hunter2@gw:8080/v1") == "http://gw:8080/v1"
    assert "s3cr3t" not in display_url("http://gw:8080/v1?api_key=s3cr3t")
    err = RuntimeError("cannot reach http://bob:hunter2@gw:8080/health")
    assert "hunter2" not in describe_error(err, "/health", 1.0)


def test_the_logging_filter_redacts_formatted_records():
    rec = logging.LogRecord(
        "eagle3_dagster.generate", logging.WARNING, __file__, 1, "said %s", ("Bearer xyz-99",), None
    )
    RedactingFilter().filter(rec)
    assert rec.getMessage() == "said Bearer [redacted]"


def test_a_model_revision_never_carries_a_model_uri_password():
    info = {"model_path": "s3://reader:pw-77x@bucket/kimi", "weight_version": "v3"}
    assert model_revision_of(info) == "s3://reader:[redacted]@bucket/kimi@v3"
    assert model_revision_of({"model_path": "moonshotai/Kimi-K2.5"}) == "moonshotai/Kimi-K2.5@default"


def test_a_drafter_change_names_the_worker_and_both_drafters_never_a_drafter_uri_password():
    """The text of ServingChangedError and of the endpoint's state: it quotes what servers said (a drafter path
    may be a URI with credentials, and hold control characters)."""
    was = DrafterIdentity("EAGLE3", "s3://reader:pw-77x@bucket/eagle3-a", num_draft_tokens=4)
    now = DrafterIdentity("EAGLE3", "s3://reader:pw-77x@bucket/eagle3-b\n\x1b[2J", num_draft_tokens=4)
    change = ("http://w1:30000", DrafterReading(True, was), DrafterReading(True, now))
    text = drafter_change_text("http://gw:8080", change)
    assert "pw-77x" not in text and text.isprintable(), text
    assert text.startswith("its worker http://w1:30000's drafter changed under the running shard: ")
    assert f"{was.drafter_id} (EAGLE3 s3://reader:{REDACTED}@bucket/eagle3-a@default" in text
    assert f"-> {now.drafter_id} (EAGLE3 s3://reader:{REDACTED}@bucket/eagle3-b\\n\\x1b[2J@default" in text
    own = drafter_change_text("http://w1:30000", (*change[:2], DrafterReading(True, None)))
    assert own.startswith("its drafter changed") and own.endswith("-> no speculative decoding")


def test_a_json_value_keeps_its_shape_and_loses_every_credential():
    from eagle3_dagster.secret import redact_json, redacted_json_text

    meta = {
        "id": "r-1",
        "prompt_tokens": 12,
        "reasoning_tokens": 4,
        "output_token_logprobs": [[-0.5, 412, None]],
        "x_gateway_authorization": "Bearer gw-abc123def",
        "credentials": "plain-value-9",
        "upstream": {"api_key": "k9", "note": "key sk-abcdefghijk"},
    }
    out = redact_json(meta)
    assert out["x_gateway_authorization"] == "[redacted]" and out["credentials"] == "[redacted]"
    assert out["upstream"] == {"api_key": "[redacted]", "note": "key [redacted]"}
    assert {k: out[k] for k in ("id", "prompt_tokens", "reasoning_tokens", "output_token_logprobs")} == {
        k: meta[k] for k in ("id", "prompt_tokens", "reasoning_tokens", "output_token_logprobs")
    }
    assert json.loads(redacted_json_text(meta)) == out
    plain = {"id": "r-2", "prompt_tokens": 3, "cached_tokens": 1}
    assert redacted_json_text(plain) == '{"id":"r-2","prompt_tokens":3,"cached_tokens":1}'


def test_a_drafter_path_loses_its_credentials_where_it_is_read_and_keeps_its_identity():
    """/server_info's speculative_draft_model_path is stored in every row and names the drafter everywhere:
    drafter_of redacts it, and the drafter_id is the redacted identity's (generate/drafter.py)."""
    from eagle3_dagster.generate.drafter import drafter_of, redact_draft_path

    cases = {
        "s3://reader:pw-77x@bucket/eagle3": "s3://[redacted]@bucket/eagle3",
        "https://ghp_tok77x@hub.example/o/eagle3": "https://[redacted]@hub.example/o/eagle3",  # a token as user
        "https://h:8443/eagle3?X-Amz-Signature=sig77x&X-Amz-Expires=60": (
            "https://h:8443/eagle3?X-Amz-Signature=[redacted]&X-Amz-Expires=[redacted]"
        ),
        "https://h/eagle3#tok77x": "https://h/eagle3#[redacted]",
        "org/eagle3-kimi": "org/eagle3-kimi",
        "/models/eagle3": "/models/eagle3",
        "s3://bucket/eagle3": "s3://bucket/eagle3",
    }
    for raw, want in cases.items():
        assert redact_draft_path(raw) == want, raw

    def served(path: str) -> dict:
        return {
            "speculative_algorithm": "EAGLE3",
            "speculative_draft_model_path": path,
            "speculative_num_draft_tokens": 4,
        }

    a, b = (
        drafter_of(served("s3://reader:pw-77x@bucket/eagle3")),
        drafter_of(served("s3://reader:rotated-99@bucket/eagle3")),
    )
    assert a is not None and b is not None
    assert a.draft_model_path == "s3://[redacted]@bucket/eagle3" and "pw-77x" not in json.dumps(a.columns())
    assert a.drafter_id == b.drafter_id  # the same drafter, whichever credential reads it
    other = drafter_of(served("s3://reader:pw-77x@bucket/eagle3-v2"))
    assert other is not None and other.drafter_id != a.drafter_id
    plain = drafter_of(served("org/eagle3-kimi"))  # a path without credentials keeps the id it always had
    assert (
        plain is not None
        and plain.drafter_id == DrafterIdentity("EAGLE3", "org/eagle3-kimi", num_draft_tokens=4).drafter_id
    )


def test_a_drafter_path_stored_before_the_redaction_is_not_shown(tmp_path):
    """Probe results and comparisons written before drafter paths were redacted: the report and a new
    comparison's production identity show the path redacted."""
    from datetime import UTC, datetime

    import polars as pl

    from eagle3_dagster.drafters.baseline import load_baseline
    from eagle3_dagster.drafters.text import identity_line
    from eagle3_dagster.generate.probe_results import update_shard_results
    from eagle3_dagster.report.probes import collect_probes, probes_section
    from eagle3_dagster.storage import as_data_path

    now = datetime(2026, 1, 1, tzinfo=UTC)
    row = {"sample_id": "s1", "prompt_id": "p1", "source": "probe_x", "drafter_id": "eagle3-old",
           "spec_draft_model_path": "s3://reader:pw-77x@bucket/eagle3", "spec_draft_model_revision": None,
           "spec_accept_length": 2.0, "spec_accept_rate": 0.5, "completion_tokens": 20, "spec_verify_ct": 10,
           "spec_num_correct_drafts": 15, "spec_num_proposed_drafts": 30, "generated_at": now,
           "integrity_violations": []}  # fmt: skip
    update_shard_results(tmp_path, 0, pl.DataFrame([row]), "eagle3-old", now)
    shown = "\n".join(probes_section(collect_probes(as_data_path(tmp_path))))
    assert "s3://[redacted]@bucket/eagle3" in shown and "pw-77x" not in shown
    production = load_baseline(tmp_path, None, ["probe_x"]).as_json()
    assert production["spec_draft_model_path"] == "s3://[redacted]@bucket/eagle3"
    assert production["drafter_id"] == "eagle3-old"
    assert "pw-77x" not in identity_line(
        "production", {**production, "spec_draft_model_path": row["spec_draft_model_path"]}
    )
