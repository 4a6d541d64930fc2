"""The speculative-decoding drafter an endpoint runs, and what SGLang says about its acceptance per answer.

SGLang 0.5.23 (`managers/tokenizer_manager.py`, `_calculate_spec_decoding_metrics`) adds to a finished
answer's `meta_info`, only when the server speculates (`--speculative-algorithm`) and the request had at
least one verify step:

- `spec_verify_ct`: verify steps; `spec_num_correct_drafts`: draft tokens the target accepted;
- `spec_num_proposed_drafts` = spec_verify_ct x (speculative_num_draft_tokens - 1);
- `spec_accept_rate` = correct / proposed; `spec_accept_length` = completion_tokens / spec_verify_ct
  (tokens per verify step, the bonus token included);
- `spec_correct_drafts_histogram`: index k = how many verify steps accepted k draft tokens (so it adds
  up to spec_verify_ct, and its k-weighted sum is spec_num_correct_drafts).

The five scalars come together (the source sets them in one block, only when proposed > 0); the
histogram comes with them whenever it is non-empty. The server's `/server_info` carries the drafter:
`speculative_algorithm`, `speculative_draft_model_path`, `speculative_draft_model_revision`,
`speculative_num_steps`, `speculative_eagle_topk`, `speculative_num_draft_tokens` (flat keys: SGLang's
ServerArgs assembles its namespaces into one record and serves `resolved_dict()`).

These figures are the server's claims: they are stored as received and checked against each other and
the drafter; a row whose figures do not add up keeps its ids and is flagged
(`spec_metrics_inconsistent:<which>` in integrity_violations).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from ..secret import printable

log = logging.getLogger(__name__)

FLOAT_KEYS = ("spec_accept_length", "spec_accept_rate")
COUNT_KEYS = ("spec_verify_ct", "spec_num_correct_drafts", "spec_num_proposed_drafts")
HISTOGRAM_KEY = "spec_correct_drafts_histogram"
METRIC_KEYS = (*FLOAT_KEYS, *COUNT_KEYS, HISTOGRAM_KEY)
# row column -> the /server_info key it is read from
IDENTITY_COLUMNS = {
    "spec_algorithm": "speculative_algorithm",
    "spec_draft_model_path": "speculative_draft_model_path",
    "spec_draft_model_revision": "speculative_draft_model_revision",
    "spec_num_steps": "speculative_num_steps",
    "spec_eagle_topk": "speculative_eagle_topk",
    "spec_num_draft_tokens": "speculative_num_draft_tokens",
}
ROW_COLUMNS = (*METRIC_KEYS, "drafter_id", *IDENTITY_COLUMNS)
INCONSISTENT = "spec_metrics_inconsistent"
_REL_TOL = 1e-9


@dataclass(frozen=True)
class DrafterIdentity:
    """What drafts for an endpoint, as its /server_info says (None: the server does not say)."""

    algorithm: str
    draft_model_path: str | None = None
    draft_model_revision: str | None = None
    num_steps: int | None = None
    eagle_topk: int | None = None
    num_draft_tokens: int | None = None

    @property
    def drafter_id(self) -> str:
        """Short and stable: the algorithm plus a digest of every field (same drafter, same id, any run)."""
        digest = hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:10]
        return f"{self.algorithm.lower()}-{digest}"

    def describe(self) -> str:
        """For people: the server's strings escaped (secret.printable); the fields keep them as received."""
        return printable(
            f"{self.drafter_id} ({self.algorithm} {self.draft_model_path or '?'}"
            f"@{self.draft_model_revision or 'default'}, steps {self.num_steps}, topk {self.eagle_topk}, "
            f"draft tokens {self.num_draft_tokens})"
        )

    def columns(self) -> dict[str, Any]:
        return {
            "drafter_id": self.drafter_id,
            "spec_algorithm": self.algorithm,
            "spec_draft_model_path": self.draft_model_path,
            "spec_draft_model_revision": self.draft_model_revision,
            "spec_num_steps": self.num_steps,
            "spec_eagle_topk": self.eagle_topk,
            "spec_num_draft_tokens": self.num_draft_tokens,
        }


def _opt_int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _opt_str(v: Any) -> str | None:
    return str(v) if v not in (None, "") else None


def drafter_of(info: Mapping[str, Any] | None) -> DrafterIdentity | None:
    """The drafter a /server_info names; None when the server does not speculate (or does not say)."""
    algo = _opt_str((info or {}).get("speculative_algorithm"))
    if info is None or algo is None:
        return None
    return DrafterIdentity(
        algorithm=algo,
        draft_model_path=_opt_str(info.get("speculative_draft_model_path")),
        draft_model_revision=_opt_str(info.get("speculative_draft_model_revision")),
        num_steps=_opt_int(info.get("speculative_num_steps")),
        eagle_topk=_opt_int(info.get("speculative_eagle_topk")),
        num_draft_tokens=_opt_int(info.get("speculative_num_draft_tokens")),
    )


def drafter_columns(drafter: DrafterIdentity | None) -> dict[str, Any]:
    """The row's drafter lineage columns (all null for a server that does not speculate)."""
    if drafter is None:
        return {"drafter_id": None, **dict.fromkeys(IDENTITY_COLUMNS)}
    return drafter.columns()


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _is_count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def metric_columns(meta: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The six spec columns as received (null where absent), and which present ones have a type a column
    cannot hold unchanged (they are stored null and named: never cast)."""
    cols: dict[str, Any] = dict.fromkeys(METRIC_KEYS)
    bad: list[str] = []
    for k in FLOAT_KEYS:
        if k in meta:
            v = meta[k]
            cols[k] = float(v) if _is_num(v) else None  # an int 2 is the float 2.0: the same value
            bad += [] if _is_num(v) else [k]
    for k in COUNT_KEYS:
        if k in meta:
            cols[k] = meta[k] if _is_count(meta[k]) else None
            bad += [] if _is_count(meta[k]) else [k]
    if HISTOGRAM_KEY in meta:
        h = meta[HISTOGRAM_KEY]
        ok = isinstance(h, list) and all(_is_count(x) for x in h)
        cols[HISTOGRAM_KEY] = list(h) if ok else None
        bad += [] if ok else [HISTOGRAM_KEY]
    return cols, bad


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=_REL_TOL, abs_tol=1e-12)


def _arithmetic(cols: Mapping[str, Any], completion_tokens: Any, draft_tokens: int | None) -> list[str]:
    """Which of SGLang's own relations between the figures do not hold (each a short name)."""
    out: list[str] = []
    vct, correct, proposed = cols["spec_verify_ct"], cols["spec_num_correct_drafts"], cols["spec_num_proposed_drafts"]
    length, rate, hist = cols["spec_accept_length"], cols["spec_accept_rate"], cols[HISTOGRAM_KEY]
    if vct is not None and vct > 0 and length is not None and _is_count(completion_tokens):
        out += [] if _close(length, completion_tokens / vct) else ["accept_length"]
    if proposed is not None and proposed > 0 and correct is not None and rate is not None:
        out += [] if _close(rate, correct / proposed) else ["accept_rate"]
    if correct is not None and proposed is not None and correct > proposed:
        out.append("correct_gt_proposed")
    if draft_tokens is not None and vct is not None and proposed is not None:
        out += [] if proposed == vct * (draft_tokens - 1) else ["proposed"]
    if hist is not None and vct is not None and sum(hist) != vct:
        out.append("histogram_total")
    if hist is not None and correct is not None and sum(k * n for k, n in enumerate(hist)) != correct:
        out.append("histogram_weighted")
    return out


def _negative(cols: Mapping[str, Any]) -> bool:
    scalars = [cols[k] for k in (*FLOAT_KEYS, *COUNT_KEYS) if cols[k] is not None]
    return any(v < 0 for v in scalars) or any(x < 0 for x in cols[HISTOGRAM_KEY] or ())


def _partial(meta: Mapping[str, Any], drafter: DrafterIdentity | None) -> bool:
    present = {k for k in METRIC_KEYS if k in meta}
    if not present or present == set(METRIC_KEYS):
        return False
    # speculative_num_draft_tokens 1 proposes nothing: SGLang then sends the histogram alone
    return not (present == {HISTOGRAM_KEY} and drafter is not None and drafter.num_draft_tokens == 1)


def spec_row_fields(meta: Mapping[str, Any], drafter: DrafterIdentity | None, violations: list[str]) -> dict[str, Any]:
    """The row's spec columns (metrics as received + the serving drafter); appends to `violations` one
    `spec_metrics_inconsistent:<which>` per broken relation. The ids are never touched here."""
    cols, bad_types = metric_columns(meta)
    found: list[str] = []
    if _partial(meta, drafter):
        found.append("partial")
    found += [f"type_{k}" for k in bad_types]
    if _negative(cols):
        found.append("negative")
    else:
        draft_tokens = drafter.num_draft_tokens if drafter is not None else None
        found += _arithmetic(cols, meta.get("completion_tokens"), draft_tokens)
    if any(k in meta for k in METRIC_KEYS) and drafter is None and not found:
        found.append("no_drafter")  # figures from a server whose /server_info names no drafter
    violations.extend(f"{INCONSISTENT}:{w}" for w in found)
    return {**cols, **drafter_columns(drafter)}


def router_drafter(router: str, per_worker: Mapping[str, DrafterIdentity | None]) -> DrafterIdentity | None:
    """A router's drafter: its workers' when they all run the same one (an answer does not say which worker
    served it). Workers with different drafters: named in a WARNING, and the rows carry no drafter."""
    kinds = set(per_worker.values())
    if len(kinds) == 1:
        return kinds.pop()
    if len(kinds) > 1:
        log.warning(
            "router %s: its workers run different drafters, and an answer does not say which worker served it: "
            "its rows carry no drafter identity: %s",
            router,
            "; ".join(f"{w}: {d.describe() if d else 'no speculative decoding'}" for w, d in per_worker.items()),
        )
    return None


def warn_mixed_fleet(per_endpoint: Mapping[str, DrafterIdentity | None]) -> bool:
    """One WARNING naming every endpoint and its drafter when they do not all run the same one (each row
    still carries its own endpoint's drafter); True when the fleet is mixed."""
    if len(set(per_endpoint.values())) <= 1:
        return False
    log.warning(
        "the endpoints run different drafters: acceptance figures of rows from different endpoints are not "
        "comparable (each row names its drafter_id): %s",
        "; ".join(f"{e}: {d.describe() if d else 'no speculative decoding'}" for e, d in per_endpoint.items()),
    )
    return True


def serving_drafter(endpoints: Any, name: str) -> DrafterIdentity | None:
    """The drafter of the endpoint (by display name) that served an answer; None if it does not speculate."""
    return next((ep.drafter for ep in endpoints if ep.name == name), None)
