"""The speculative-decoding drafter an endpoint runs, and what SGLang says about its acceptance per answer.

SGLang (`managers/tokenizer_manager.py`, `_calculate_spec_decoding_metrics`) adds to a finished answer's
`meta_info`, only when the server speculates (`--speculative-algorithm`) and the request had at least one
verify step:

- `spec_verify_ct`: verify steps; the draft tokens the target accepted (`spec_num_correct_drafts`);
- the drafts proposed (`spec_num_proposed_drafts`) = spec_verify_ct x (speculative_num_draft_tokens - 1);
- `spec_accept_rate` = correct / proposed; `spec_accept_length` = completion_tokens / spec_verify_ct
  (tokens per verify step, the bonus token included);
- a histogram: index k = how many verify steps accepted k draft tokens (so it adds up to spec_verify_ct,
  and its k-weighted sum is the correct drafts).

The releases name the counts and the histogram differently (RELEASE_NAMES; read in each release's source,
checked against it by tests/generate/test_sglang_spec_shapes.py): every name is read into one column
(NAMES), and a release that sends two names for one figure (0.5.12 to 0.5.22 send the 0.5.11 names as
aliases) must send the same value under both. 0.5.18 and later add, in DSpark's ragged-verify modes,
`spec_cap_length`, `spec_block_accept_length` and `spec_cap_lens_histogram` (EXTRA_KEYS): stored when sent.

The five scalars come together (the source sets them in one block, only when proposed > 0); the
histogram comes with them whenever it is non-empty. The server's `/server_info` carries the drafter:
`speculative_algorithm`, `speculative_draft_model_path`, `speculative_draft_model_revision`,
`speculative_num_steps`, `speculative_eagle_topk`, `speculative_num_draft_tokens` (flat keys: SGLang's
ServerArgs assembles its namespaces into one record and serves `resolved_dict()`), and its `version`.
A draft model path may be a URI with credentials (`s3://user:pw@bucket/drafter`, a presigned URL): they
are redacted where the identity is read (`drafter_of`, `redact_draft_path`), so no row, probe result,
comparison, log line or metadata holds them, and the drafter_id is a digest of the redacted identity (two
servers whose drafter paths differ only in the credentials run the same drafter).

These figures are the server's claims: they are stored as received and checked against each other, the
drafter and what SGLang can produce at all (more verify steps than tokens, a histogram longer than the
draft tokens); a row whose figures fail keeps its ids and is flagged (`spec_metrics_inconsistent:<which>`
in integrity_violations), and its figures feed nothing downstream (generate/group_acceptance.py). A count
an int64 column cannot hold is stored null and flagged (`exceeds_int64_<field>`), never written as is. A
speculating endpoint whose answers carry none of the names any release uses is named in one WARNING
(unread_spec_keys, SpecNamesWatch): its rows' figures would otherwise be silent nulls.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from ..secret import REDACTED, printable, redact

log = logging.getLogger(__name__)

FLOAT_KEYS = ("spec_accept_length", "spec_accept_rate")
COUNT_KEYS = ("spec_verify_ct", "spec_num_correct_drafts", "spec_num_proposed_drafts")
HISTOGRAM_KEY = "spec_correct_drafts_histogram"
METRIC_KEYS = (*FLOAT_KEYS, *COUNT_KEYS, HISTOGRAM_KEY)
# column -> the names releases send it under, newest first (each release's managers/tokenizer_manager.py):
# 0.5.12 and later name them as the columns, 0.5.11 by the second names, 0.5.9 and 0.5.10 by the third;
# 0.5.12 to 0.5.22 send the 0.5.11 names too, as aliases. The other figures keep their name in every release.
NAMES: dict[str, tuple[str, ...]] = {
    "spec_num_correct_drafts": ("spec_num_correct_drafts", "spec_accepted_drafts", "spec_accept_token_num"),
    "spec_num_proposed_drafts": ("spec_num_proposed_drafts", "spec_proposed_drafts", "spec_draft_token_num"),
    HISTOGRAM_KEY: (HISTOGRAM_KEY, "spec_accept_histogram"),
}
# 0.5.18 and later, in DSpark's ragged-verify modes (SGLANG_RAGGED_VERIFY_MODE cap-accept / compact): the
# mean verify length a step was capped at, the mean accepted block (cap-accept only), the cap histogram
EXTRA_FLOAT_KEYS = ("spec_cap_length", "spec_block_accept_length")
EXTRA_HISTOGRAM_KEY = "spec_cap_lens_histogram"
EXTRA_KEYS = (*EXTRA_FLOAT_KEYS, EXTRA_HISTOGRAM_KEY)
# every meta_info key a release sends a figure under
KNOWN_KEYS = frozenset({*FLOAT_KEYS, *COUNT_KEYS, *(n for names in NAMES.values() for n in names), *EXTRA_KEYS})
# row column -> the /server_info key it is read from
IDENTITY_COLUMNS = {
    "spec_algorithm": "speculative_algorithm",
    "spec_draft_model_path": "speculative_draft_model_path",
    "spec_draft_model_revision": "speculative_draft_model_revision",
    "spec_num_steps": "speculative_num_steps",
    "spec_eagle_topk": "speculative_eagle_topk",
    "spec_num_draft_tokens": "speculative_num_draft_tokens",
}
ROW_COLUMNS = (*METRIC_KEYS, *EXTRA_KEYS, "drafter_id", *IDENTITY_COLUMNS)
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
        """Short and stable: the algorithm plus a digest of every field (same drafter, same id, any run). Read
        from a server (`drafter_of`), the fields are redacted: the digest never depends on a credential."""
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


# a URI's parts where credentials hide: the user info, the query, the fragment
_URI = re.compile(
    r"(?is)^(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<user>[^/?#]*@)?(?P<rest>[^?#]*)(?:\?(?P<query>[^#]*))?(?P<frag>#.*)?$"
)


def _redacted_query(query: str) -> str:
    """Each value of a URI query `[redacted]` (a presigned URL's signature, a token), its names kept."""
    parts = [p for p in query.split("&") if p]
    return "&".join(f"{p.split('=', 1)[0]}={REDACTED}" if "=" in p else REDACTED for p in parts)


def redact_draft_path(path: str | None) -> str | None:
    """A draft model path without the credentials a URI carries: its whole user info (`user:password@`, or a
    token given as the user name) and every query value become `[redacted]`, the fragment too, and then
    whatever `secret.redact` removes (a registered key, `sk-` keys, `token=...`). Local paths and hub ids
    (`org/drafter`) come back unchanged, so their drafter_id is what it always was."""
    if not path:
        return path
    uri = _URI.match(path)
    if uri:
        path = uri["scheme"] + (f"{REDACTED}@" if uri["user"] else "") + uri["rest"]
        path += f"?{_redacted_query(uri['query'])}" if uri["query"] is not None else ""
        path += f"#{REDACTED}" if uri["frag"] else ""
    return redact(path)


def drafter_of(info: Mapping[str, Any] | None) -> DrafterIdentity | None:
    """The drafter a /server_info names, credentials redacted (`redact_draft_path`: the id is the redacted
    identity's); None when the server does not speculate (or does not say)."""
    algo = _opt_str((info or {}).get("speculative_algorithm"))
    if info is None or algo is None:
        return None
    revision = _opt_str(info.get("speculative_draft_model_revision"))
    return DrafterIdentity(
        algorithm=algo,
        draft_model_path=redact_draft_path(_opt_str(info.get("speculative_draft_model_path"))),
        draft_model_revision=redact(revision) if revision else None,
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
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:  # an int too large for any float
        return False


def _is_count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _names(col: str) -> tuple[str, ...]:
    return NAMES.get(col, (col,))


@dataclass
class _Read:
    """The spec columns of one answer as received: values (null where absent or of a type a column cannot
    hold unchanged: never cast), the present keys of a wrong type, the columns whose two names disagree."""

    cols: dict[str, Any]
    bad_types: list[str]
    aliases_disagree: list[str]


def _read_one(
    meta: Mapping[str, Any], col: str, ok: Callable[[Any], bool], as_column: Callable[[Any], Any]
) -> tuple[bool, Any, bool]:
    """(present, value, the names that disagree with the newest) of one column."""
    sent = [n for n in _names(col) if n in meta]
    if not sent:
        return False, None, False
    v = meta[sent[0]]  # under the newest name the answer carries
    return True, (as_column(v) if ok(v) else _BAD), any(meta[n] != v for n in sent[1:])


def _is_histogram(h: Any) -> bool:
    return isinstance(h, list) and all(_is_count(x) for x in h)


def metric_columns(meta: Mapping[str, Any]) -> _Read:
    """The spec columns (METRIC_KEYS, EXTRA_KEYS) read from any release's names (NAMES)."""
    read = _Read(dict.fromkeys((*METRIC_KEYS, *EXTRA_KEYS)), [], [])
    for col in read.cols:
        ok: Callable[[Any], bool]
        as_column: Callable[[Any], Any]
        if col in COUNT_KEYS:
            ok, as_column = _is_count, _same
        elif col in (HISTOGRAM_KEY, EXTRA_HISTOGRAM_KEY):
            ok, as_column = _is_histogram, list
        else:
            ok, as_column = _is_num, float  # an int 2 is the float 2.0: the same value
        present, v, disagree = _read_one(meta, col, ok, as_column)
        if v is _BAD:
            read.bad_types.append(col)
        elif present:
            read.cols[col] = v
        if disagree:
            read.aliases_disagree.append(col)
    return read


def _same(v: Any) -> Any:
    return v


_BAD = object()  # a value of a type its column cannot hold unchanged


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


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _unstorable(cols: dict[str, Any]) -> list[str]:
    """Counts an int64 column cannot hold (a histogram with such an entry): set to null in `cols` and named,
    decided before the write (a value the chunk write cannot encode would fail the whole shard's step)."""
    out: list[str] = []
    for k in COUNT_KEYS:
        if cols[k] is not None and not INT64_MIN <= cols[k] <= INT64_MAX:
            cols[k] = None
            out.append(f"exceeds_int64_{k}")
    for k in (HISTOGRAM_KEY, EXTRA_HISTOGRAM_KEY):
        if cols[k] is not None and any(not INT64_MIN <= x <= INT64_MAX for x in cols[k]):
            cols[k] = None
            out.append(f"exceeds_int64_{k}")
    return out


def _impossible(cols: Mapping[str, Any], completion_tokens: Any, draft_tokens: int | None) -> list[str]:
    """Figures SGLang cannot produce even when they agree with each other (each a short name):

    - `length_below_1`: more verify steps than answer tokens (every verify step yields at least its bonus
      token), or an accept length below 1;
    - `histogram_length`: a histogram longer than `speculative_num_draft_tokens`, or ending in 0. SGLang
      (`Req.update_spec_correct_drafts_histogram`, every release since 0.5.10) grows the list only as far as
      the largest count of drafts one step accepted, and a step accepts at most num_draft_tokens - 1."""
    out: list[str] = []
    vct, length, hist = cols["spec_verify_ct"], cols["spec_accept_length"], cols[HISTOGRAM_KEY]
    if (vct is not None and _is_count(completion_tokens) and vct > completion_tokens) or (
        length is not None and length < 1
    ):
        out.append("length_below_1")
    if hist and ((draft_tokens is not None and len(hist) > draft_tokens) or hist[-1] == 0):
        out.append("histogram_length")
    return out


def _negative(cols: Mapping[str, Any]) -> bool:
    scalars = [cols[k] for k in (*FLOAT_KEYS, *COUNT_KEYS, *EXTRA_FLOAT_KEYS) if cols[k] is not None]
    lists = (*(cols[HISTOGRAM_KEY] or ()), *(cols[EXTRA_HISTOGRAM_KEY] or ()))
    return any(v < 0 for v in scalars) or any(x < 0 for x in lists)


def _partial(meta: Mapping[str, Any], drafter: DrafterIdentity | None) -> bool:
    present = {k for k in METRIC_KEYS if any(n in meta for n in _names(k))}
    if not present or present == set(METRIC_KEYS):
        return False
    # speculative_num_draft_tokens 1 proposes nothing: SGLang then sends the histogram alone
    return not (present == {HISTOGRAM_KEY} and drafter is not None and drafter.num_draft_tokens == 1)


def spec_row_fields(meta: Mapping[str, Any], drafter: DrafterIdentity | None, violations: list[str]) -> dict[str, Any]:
    """The row's spec columns (metrics as received + the serving drafter); appends to `violations` one
    `spec_metrics_inconsistent:<which>` per broken relation. The ids are never touched here."""
    read = metric_columns(meta)
    cols = read.cols
    found: list[str] = []
    if _partial(meta, drafter):
        found.append("partial")
    found += [f"type_{k}" for k in read.bad_types]
    found += [f"alias_{k}" for k in read.aliases_disagree]  # two names of one figure, two values
    found += _unstorable(cols)
    if _negative(cols):
        found.append("negative")
    else:
        draft_tokens = drafter.num_draft_tokens if drafter is not None else None
        found += _arithmetic(cols, meta.get("completion_tokens"), draft_tokens)
        found += _impossible(cols, meta.get("completion_tokens"), draft_tokens)
    if any(k in meta for k in KNOWN_KEYS) and drafter is None and not found:
        found.append("no_drafter")  # figures from a server whose /server_info names no drafter
    violations.extend(f"{INCONSISTENT}:{w}" for w in found)
    return {**cols, **drafter_columns(drafter)}


def router_drafter(per_worker: Mapping[str, DrafterIdentity | None]) -> DrafterIdentity | None:
    """A router's drafter for an answer that does not say which worker served it: its workers' when they all
    run the same one, else None (warn_unattributed names them, once an answer comes without its worker)."""
    kinds = set(per_worker.values())
    return kinds.pop() if len(kinds) == 1 else None


def warn_unattributed(router: str, per_worker: Mapping[str, DrafterIdentity | None]) -> None:
    """The WARNING for a router whose workers run different drafters and whose answers do not name the
    worker that served them (sglang-router; smg names it in x-smg-routed-worker-id)."""
    log.warning(
        "router %s: its workers run different drafters, and an answer does not say which worker served it: "
        "its rows carry no drafter identity: %s",
        router,
        "; ".join(f"{w}: {d.describe() if d else 'no speculative decoding'}" for w, d in per_worker.items()),
    )


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


def unread_spec_keys(meta: Mapping[str, Any], drafter: DrafterIdentity | None) -> list[str] | None:
    """For an answer of a speculating server that carries none of the names any release sends the figures
    under (KNOWN_KEYS) although they were due: the `spec_*` keys it does carry (maybe none). None when it
    carries figures, or none were due (no drafter; a one-token answer has no verify step)."""
    if drafter is None or any(k in meta for k in KNOWN_KEYS):
        return None
    other = sorted(k for k in meta if isinstance(k, str) and k.startswith("spec_"))
    tokens = meta.get("completion_tokens")
    due = isinstance(tokens, int) and not isinstance(tokens, bool) and tokens >= 2
    return other if other or due else None


class SpecNamesWatch:
    """Rows of speculating servers whose answers carry no figure under a known name, per serving server;
    the first such answer of each server is named in one WARNING (a release that renamed them again would
    otherwise leave every row's acceptance null, silently)."""

    def __init__(self) -> None:
        self.rows: dict[str, int] = {}

    def note(self, server: str, version: str | None, drafter: DrafterIdentity, keys: list[str]) -> None:
        self.rows[server] = self.rows.get(server, 0) + 1
        if self.rows[server] > 1:
            return
        log.warning(
            "%s (SGLang %s) speculates (%s) but its answers carry none of the names SGLang releases send the "
            "acceptance figures under (%s): %s; their rows keep null figures. A release that renamed them: add "
            "its names to generate/drafter.py NAMES (docs/drafter.md)",
            server,
            version or "version not reported",
            drafter.describe(),
            ", ".join(sorted(KNOWN_KEYS - {*FLOAT_KEYS, "spec_verify_ct"})),
            f"the answer's spec_* keys are {', '.join(keys)}" if keys else "the answers carry no spec_* key at all",
        )
