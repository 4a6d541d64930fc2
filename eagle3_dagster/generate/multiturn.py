"""Regenerate every assistant turn of a conversation on-policy (sources with `regenerate: all_turns`).

Turn k's prompt is the conversation up to the message before assistant turn k, with the model's OWN
turns 1..k-1 (as regenerated) in place of the dataset's, rendered with the model's chat template by
the tokenize stage's renderer (tokenize/render.py `PromptRenderer.render`: native renderer or the
Jinja fallback, the same rules) and ending with the generation prompt. Turn 1's ids are the
tokenized prompt of the conversation (gated by the prompts gate like any prompt).

The regenerated assistant message is built from the output ids exactly as tokenize/parse.py parses a
generation: `reasoning_content`, `content`, `tool_calls` (arguments: the JSON text the model
emitted). The template decides what of it the next prompt shows (Kimi-K2.5: `<think></think>content`
for history turns, the reasoning kept after the last non-tool-call assistant message; Qwen3 its own
rule). Tool results are the dataset's, in order; their `tool_call_id` is mapped onto the regenerated
calls' ids in order.
The tools a turn declares are the prompts row's, or from the last `tools_from` change before it
(BFCL miss_func: a function added at a later turn, ingest/bfcl.py).

A conversation ends early, counted with a reason, when a turn
* finished other than by `stop` (`length`, `abort`: reason `finish_<type>`),
* carries an integrity violation (`integrity_violation`) or fails a critical parse check
  (`no_think_end`, `no_end_of_turn`, `unterminated_tool_call`, ...: the parse problem code),
* makes other tool calls than the dataset's turn (count, names or arguments) with
  `on_tool_mismatch: end` (`tool_call_mismatch`; with `continue` it is only counted),
* or when the next prompt cannot be built (`render_error`, `prompt_too_long`, ...) or its request
  failed (`error_<reason>`).
The turn that ends it is stored (token ids are never dropped); the later turns are not planned.
Counts reconcile: turns_planned = turns_regenerated + sum(turns_not_reached by reason).

Cache keys: a turn's prompt id is a hash of the exact input_ids sent (they hold the whole regenerated
history), and its sample_id the usual `sample_key` of that prompt id (+ model revision, template,
sampling, seed), so an unchanged night replays every stored turn and sends nothing, and a change at
turn k (an edited message, a new template) changes the keys of k and every later turn, and nothing
before. The turns of a probe conversation (a `role: probe` source, probes.py) also hold the fleet's
drafter and the probe seed: a new drafter regenerates every turn of the probe conversations, and each
turn is measured on its own. The lineage (conversation id, turn index) of the current materialization is kept in the
shard's active.parquet, so a turn stored for an earlier version of a conversation gets the current one.

Storage: `generations/shard=NNNN/turns/part-*.parquet` (schemas.TURN_GENERATIONS: a GENERATIONS row
plus the conversation id, the turn index, the exact prompt ids sent and the prompt messages), in
the same atomic chunks and flushes as the final-turn samples (store.py), so a kill redoes at most
one checkpoint batch: the replay finds every stored turn by its key.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from array import array
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, cast

import polars as pl

from .. import schemas
from ..ingest.canonical import canonical_json
from ..ingest.prompts_table import prompt_columns, shard_prompts
from ..profiles import ModelProfile
from ..storage import DataPath, as_data_path, read_parquet
from ..tokenize.parse import parse_generation
from ..tokenize.render import RenderRequest
from .config import sample_key
from .inputs import SampleKeys
from .items import Turn, WorkItem

log = logging.getLogger(__name__)

TURNS_DIR = "turns"
# what conversations_from_prompts reads of a prompts row
CONVERSATION_COLUMNS = ("prompt_id", "source", "shard", "conversation", "tools", "regenerate")


@dataclass(frozen=True, slots=True)
class TurnAnswer:
    """What the replay needs of a turn's answer (just received, or stored by an earlier run)."""

    output_ids: list[int] | None
    finish_reason: str | None
    integrity_violations: list[str] | None


@dataclass(frozen=True)
class Conversation:
    conversation_id: str  # the conversation's prompt_id (prompts table)
    messages: list[dict[str, Any]]  # the whole normalized conversation, dataset assistant turns included
    tools: list[dict[str, Any]] | None
    tools_json: str | None  # canonical JSON text of `tools` (the renderer's tools cache key)
    turns: list[int]  # planned turn positions in `messages` (len(messages): the trailing answer)
    first_ids: list[int]  # turn 1's prompt ids, from the tokenize stage
    on_tool_mismatch: str = "end"
    source: str | None = None
    shard: int | None = None
    template_hash: str | None = None
    tools_from: tuple[tuple[int, str], ...] = ()  # BFCL miss_func: (message position, tools JSON from there on)

    def tools_at(self, pos: int) -> tuple[list[dict[str, Any]] | None, str | None]:
        """The tools the prompt of the turn at `pos` declares: the last change before it, else the row's."""
        text = next((t for p, t in reversed(self.tools_from) if p <= pos), None)
        return (self.tools, self.tools_json) if text is None else (json.loads(text), text)


def conversations_from_prompts(prompts: pl.DataFrame, tokenized: pl.DataFrame) -> list[Conversation]:
    """The all_turns conversations among PROMPTS rows whose turn-1 prompt was tokenized (the others were
    rejected by the tokenize stage, with their reason, and are not planned)."""
    if "regenerate" not in prompts.columns or prompts.height == 0:
        return []
    conv = prompts.filter(pl.col("regenerate").is_not_null())
    if conv.height == 0:
        return []
    first = {
        r["prompt_id"]: (r["input_ids"], r.get("template_hash"))
        for r in tokenized.filter(pl.col("prompt_id").is_in(conv["prompt_id"].to_list()))
        .select("prompt_id", "input_ids", *(["template_hash"] if "template_hash" in tokenized.columns else []))
        .iter_rows(named=True)
    }
    out = []
    for r in conv.select("prompt_id", "source", "shard", "conversation", "tools", "regenerate").iter_rows(named=True):
        if r["prompt_id"] not in first:
            continue
        opts = json.loads(r["regenerate"])
        ids, th = first[r["prompt_id"]]
        out.append(
            Conversation(
                conversation_id=r["prompt_id"],
                messages=json.loads(r["conversation"]),
                tools=json.loads(r["tools"]) if r["tools"] is not None else None,
                tools_json=r["tools"],
                turns=[int(t) for t in opts["turns"]],
                first_ids=list(ids),
                on_tool_mismatch=opts.get("on_tool_mismatch") or "end",
                source=r["source"],
                shard=r["shard"],
                template_hash=th,
                tools_from=tuple((int(p), canonical_json(t)) for p, t in opts.get("tools_from") or ()),
            )
        )
    return out


def turn_prompt_id(input_ids: list[int]) -> str:
    """Identity of a turn's prompt: the exact ids sent, which hold the whole (regenerated) history.

    Not the conversation id: a dataset edit at turn k changes the conversation's id, yet turns
    before k have the same prompts and must not be sent again. Two conversations that reach the
    same prompt share its one stored sample (counted as `turns_shared`)."""
    h = hashlib.sha256(b"all_turns|")
    h.update(array("q", input_ids).tobytes())
    return h.hexdigest()[:32]


def _args(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def tool_calls_differ(regenerated: list[dict[str, Any]], dataset: list[dict[str, Any]]) -> bool:
    """Count, names or arguments (compared as JSON values) differ."""
    if len(regenerated) != len(dataset):
        return True
    for a, b in zip(regenerated, dataset):
        fa, fb = a.get("function") or {}, b.get("function") or {}
        if fa.get("name") != fb.get("name") or _args(fa.get("arguments")) != _args(fb.get("arguments")):
            return True
    return False


@dataclass
class TurnStats:
    conversations: int = 0
    completed: int = 0
    ended_early: Counter[str] = field(default_factory=Counter)  # conversations, by reason
    turns_planned: int = 0
    turns_regenerated: int = 0  # stored turns on the conversations' current paths (sent now + cached)
    turns_cached: int = 0  # of those, found stored (sent in an earlier run)
    turns_shared: int = 0  # of those, the same prompt as another conversation's turn (one stored sample)
    turns_sent: int = 0  # requests answered in this run
    turns_failed: int = 0  # requests that failed in this run (the conversation ends: error_<reason>)
    turns_not_reached: Counter[str] = field(default_factory=Counter)  # planned turns after an early end
    tool_call_mismatch_continued: int = 0
    rows_by_turn: Counter[int] = field(default_factory=Counter)  # regenerated turns per turn index (1-based)

    @property
    def reconciles(self) -> bool:
        return self.turns_planned == self.turns_regenerated + sum(self.turns_not_reached.values()) and (
            self.conversations == self.completed + sum(self.ended_early.values())
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "conversations": self.conversations,
            "conversations_completed": self.completed,
            "conversations_ended_early": dict(sorted(self.ended_early.items())),
            "turns_planned": self.turns_planned,
            "turns_regenerated": self.turns_regenerated,
            "turns_cached": self.turns_cached,
            "turns_shared": self.turns_shared,
            "turns_sent": self.turns_sent,
            "turns_failed": self.turns_failed,
            "turns_not_reached": dict(sorted(self.turns_not_reached.items())),
            "tool_call_mismatch_continued": self.tool_call_mismatch_continued,
            "rows_by_turn": {str(k): v for k, v in sorted(self.rows_by_turn.items())},
            "reconciles": self.reconciles,
        }


@dataclass
class _State:
    conv: Conversation
    k: int = 0  # 0-based index of the turn being regenerated
    history: list[dict[str, Any]] = field(default_factory=list)  # messages before the next dataset slice
    id_map: dict[str, str] = field(default_factory=dict)  # dataset tool-call id -> regenerated id


class TurnDriver:
    """Feeds the shard's workers the next turn of each conversation as soon as its previous turn is in.

    `take()` gives a ready turn (or None), `done()` / `failed()` report it back; `busy` says whether a
    turn may still become ready, `wait()` blocks until something changed. One event loop, no locks.
    """

    def __init__(
        self,
        conversations: list[Conversation],
        *,
        renderer: Any,
        profile: ModelProfile,
        max_new_tokens: int,
        stored: dict[str, TurnAnswer],
        keys: SampleKeys,
    ) -> None:
        self.renderer = renderer
        self.keys = keys  # a probe conversation's turn keys hold the fleet's drafter (keys.probes, probes.py)
        self.profile = profile
        self.tokenizer = renderer.tokenizer
        self.max_new_tokens = max_new_tokens
        self.stored = stored
        self.stats = TurnStats()
        self.ready: deque[WorkItem] = deque()
        self.in_flight = 0
        # (sample_id, turn prompt id, conversation_id, turn_index) on the current paths, one per sample
        self.active_sample_ids: list[tuple[str, str, str, int]] = []
        self._active: set[str] = set()
        self._states: dict[str, _State] = {}
        self._changed: asyncio.Event | None = None
        self._conversations = conversations

    # -- the workers' side ------------------------------------------------------------------
    def start(self) -> None:
        """Replay every conversation through its stored turns; queue the first turn not stored."""
        for conv in self._conversations:
            self.stats.conversations += 1
            self.stats.turns_planned += len(conv.turns)
            st = _State(conv)
            self._states[conv.conversation_id] = st
            self._queue_next(st, first=True)

    def take(self) -> WorkItem | None:
        if not self.ready:
            return None
        self.in_flight += 1
        return self.ready.popleft()

    @property
    def busy(self) -> bool:
        return bool(self.ready) or self.in_flight > 0

    @property
    def pending(self) -> int:
        """Conversations that still need a request (the most turns that can run at once)."""
        return len(self.ready) + self.in_flight

    async def wait(self) -> None:
        if self._changed is None:
            self._changed = asyncio.Event()
        self._changed.clear()
        await self._changed.wait()

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()

    def done(self, item: WorkItem, answer: TurnAnswer) -> None:
        """A turn was answered (its row is in the write buffer): queue the conversation's next turn."""
        self.in_flight -= 1
        self.stats.turns_sent += 1
        self.stored[item.sample_id] = answer  # another conversation reaching this prompt replays it
        st = self._states[_conversation_of(item)]
        self._record(st, item, answer)
        self._notify()

    def failed(self, item: WorkItem, reason: str) -> None:
        self.in_flight -= 1
        self.stats.turns_failed += 1
        st = self._states[_conversation_of(item)]
        self._end(st, f"error_{reason}", not_reached=len(st.conv.turns) - st.k)
        self._notify()

    # -- the conversation logic --------------------------------------------------------------
    def _end(self, st: _State, reason: str, *, not_reached: int) -> None:
        self.stats.ended_early[reason] += 1
        if not_reached:
            self.stats.turns_not_reached[reason] += not_reached
        if self.stats.ended_early[reason] == 1:
            log.info("conversation %s ended early at turn %d: %s", st.conv.conversation_id, st.k + 1, reason)

    def _queue_next(self, st: _State, *, first: bool = False) -> None:
        """Build turn st.k's request; while it is stored, replay it and go on; else queue it.

        A conversation's next turn goes to the FRONT of the queue (depth first): conversations
        finish early instead of all waiting for the last round, so the shard does not end on a
        tail of dependent turns with the server's slots half empty (bench/multiturn.py)."""
        while True:
            item = self._build(st)
            if item is None:
                return
            cached = self.stored.get(item.sample_id)
            if cached is None:
                if first:
                    self.ready.append(item)
                else:
                    self.ready.appendleft(item)
                return
            self.stats.turns_cached += 1
            if not self._advance(st, item, cached):
                return

    def _record(self, st: _State, item: WorkItem, answer: TurnAnswer) -> None:
        if self._advance(st, item, answer):
            self._queue_next(st)

    def _advance(self, st: _State, item: WorkItem, answer: TurnAnswer) -> bool:
        """Turn st.k is stored: account for it and decide whether the conversation goes on."""
        conv, k = st.conv, st.k
        self.stats.turns_regenerated += 1
        self.stats.rows_by_turn[k + 1] += 1
        if item.sample_id in self._active:
            self.stats.turns_shared += 1
        else:
            self._active.add(item.sample_id)
            self.active_sample_ids.append((item.sample_id, item.prompt_id, conv.conversation_id, k + 1))
        later = len(conv.turns) - (k + 1)
        fr = answer.finish_reason
        reason: str | None = None
        if fr != "stop":
            reason = f"finish_{fr or 'unknown'}"
        elif answer.integrity_violations:
            reason = "integrity_violation"
        if reason is not None:  # not parsed: a flagged turn's ids may be no tokens at all (a negative id)
            self._end(st, reason, not_reached=later)
            return False
        parsed = parse_generation(list(answer.output_ids or []), self.profile, self.tokenizer)
        if parsed.problems:
            reason = parsed.problems[0]
        if reason is None and later > 0:
            pos = conv.turns[k]
            ds_msg = conv.messages[pos] if pos < len(conv.messages) else {}
            ds = ds_msg.get("tool_calls") or []
            # a slot (BFCL: {"generate": true}) has no dataset answer to compare with
            if not ds_msg.get("generate") and tool_calls_differ(parsed.tool_calls, ds):
                if conv.on_tool_mismatch == "end":
                    reason = "tool_call_mismatch"
                else:
                    self.stats.tool_call_mismatch_continued += 1
            for a, b in zip(ds, parsed.tool_calls):
                if a.get("id") and b.get("id"):
                    st.id_map[a["id"]] = b["id"]
        if reason is not None:  # stored and kept; a last turn that fails a check also counts as ended early
            self._end(st, reason, not_reached=later)
            return False
        if later == 0:
            self.stats.completed += 1
            return False
        st.history = json.loads(_turn_of(item).prompt_messages) + [parsed.assistant_message()]
        st.k += 1
        return True

    def _build(self, st: _State) -> WorkItem | None:
        """Turn st.k's request item, or None (the conversation ended: the reason is counted)."""
        conv, k = st.conv, st.k
        pos = conv.turns[k]
        start = conv.turns[k - 1] + 1 if k > 0 else 0
        new = []
        for m in conv.messages[start:pos]:
            if m.get("role") == "tool" and m.get("tool_call_id") in st.id_map:
                m = {**m, "tool_call_id": st.id_map[m["tool_call_id"]]}
            new.append(m)
        messages = st.history + new
        tools, tools_json = conv.tools_at(pos)
        if k == 0:
            ids = list(conv.first_ids)
        else:
            # the tokenize stage's render path (native renderer, else the chat template through Jinja)
            result = self.renderer.render_batch([RenderRequest(messages, tools, tools_key=tools_json)])[0]
            if not result.ok:
                self._end(st, result.reason or "render_error", not_reached=len(conv.turns) - k)
                return None
            ids = list(result.input_ids)
            from ..tokenize.pipeline import PROMPT_TOO_LONG, prompt_length_problem

            if prompt_length_problem(len(ids), self.profile, self.max_new_tokens):
                self._end(st, PROMPT_TOO_LONG, not_reached=len(conv.turns) - k)
                return None
        pid = turn_prompt_id(ids)
        keys = self.keys
        probe = keys.probes.tag(conv.source) if keys.probes is not None else None
        sid = sample_key(pid, keys.model_revision, conv.template_hash or "", keys.s_hash, keys.regen_seed, probe)
        return WorkItem(
            sample_id=sid,
            prompt_id=pid,
            input_ids=ids,
            source=conv.source,
            shard=conv.shard,
            template_hash=conv.template_hash,
            turn=Turn(
                conversation_id=conv.conversation_id,
                turn_index=k + 1,
                prompt_messages=json.dumps(messages, ensure_ascii=False, sort_keys=True),
                tools=tools_json,
            ),
        )


def _turn_of(item: WorkItem) -> Turn:
    if item.turn is None:
        raise ValueError(f"{item.sample_id}: a prompt's sample, not a conversation's turn")
    return item.turn


def _conversation_of(item: WorkItem) -> str:
    return _turn_of(item).conversation_id


# -- reading the stored turns ------------------------------------------------------------------


def turns_dir(gen_dir: Any) -> DataPath:
    return as_data_path(gen_dir) / TURNS_DIR


def read_turn_rows(gen_dir: Any, columns: list[str] | None = None) -> pl.DataFrame:
    """Every stored turn row of a shard (schemas.TURN_GENERATIONS), one row per sample_id."""
    files = turns_dir(gen_dir).glob("part-*.parquet")
    if not files:
        df = cast(pl.DataFrame, pl.from_arrow(schemas.TURN_GENERATIONS.empty_table()))
        return df.select(columns) if columns else df
    df = read_parquet(files, columns=columns)
    if columns is None:  # chunks written before a column was added (e.g. `worker`): null there, not an error
        empty = cast(pl.DataFrame, pl.from_arrow(schemas.TURN_GENERATIONS.empty_table()))
        missing = [n for n in empty.columns if n not in df.columns]
        df = df.with_columns(pl.lit(None, dtype=empty.schema[n]).alias(n) for n in missing)
    return df.unique(subset="sample_id", keep="first", maintain_order=True)


def stored_turns(gen_dir: Any) -> dict[str, TurnAnswer]:
    """sample_id -> what the replay needs of a stored turn (finish, violations, output ids)."""
    df = read_turn_rows(gen_dir, ["sample_id", "output_ids", "finish_reason", "integrity_violations"])
    rows = df.select("sample_id", "output_ids", "finish_reason", "integrity_violations").iter_rows()
    return {sid: TurnAnswer(ids, fr, viol) for sid, ids, fr, viol in rows}


def turn_generations(turns: pl.DataFrame) -> pl.DataFrame:
    """The turn rows as GENERATIONS rows (their prompt_id is the turn's prompt id)."""
    return turns.select(schemas.GENERATIONS.names)


def turn_prompt_view(turns: pl.DataFrame, *, tail: int) -> pl.DataFrame:
    """Like generate.inputs.prompt_view, for the turns' prompts."""
    return turns.select(
        pl.col("prompt_id").cast(pl.String),
        pl.col("template_hash").cast(pl.String),
        pl.col("source").cast(pl.String),
        pl.col("prompt_ids").list.len().cast(pl.Int32).alias("prompt_len"),
        pl.col("prompt_ids").list.tail(tail).cast(pl.List(pl.Int32)).alias("input_ids"),
    )


def turn_tokenized(turns: pl.DataFrame, *, profile_name: str, tokenizer_fingerprint: str) -> pl.DataFrame:
    """The turns' prompts as TOKENIZED_PROMPTS rows: the exact ids sent for each turn."""
    df = turns.select(
        "prompt_id",
        "source",
        "shard",
        pl.col("prompt_ids").cast(pl.List(pl.Int32)).alias("input_ids"),
        pl.col("prompt_ids").list.len().cast(pl.Int32).alias("prompt_len"),
        pl.lit(profile_name, pl.String).alias("profile"),
        pl.lit(tokenizer_fingerprint, pl.String).alias("tokenizer_fingerprint"),
        "template_hash",
        pl.lit(False).alias("control_text_in_content"),  # tokenize quarantined such prompts (default policy)
    )
    return df.unique("prompt_id", keep="first", maintain_order=True)


def turn_prompt_rows(turns: pl.DataFrame) -> pl.DataFrame:
    """prompt_id -> the turn's prompt messages (regenerated history) and tools, as parse_generations reads them."""
    return turns.select("prompt_id", pl.col("prompt_messages").alias("messages"), "tools").unique(
        "prompt_id", keep="first", maintain_order=True
    )


def turn_lineage(turns: pl.DataFrame) -> pl.DataFrame:
    return turns.select("sample_id", "conversation_id", pl.col("turn_index").cast(pl.Int32))


@dataclass
class MultiTurn:
    """What generate_shard needs to run a shard's all_turns conversations next to its final-turn prompts."""

    conversations: list[Conversation]
    renderer: Any  # tokenize.render.PromptRenderer of the profile (the tokenize stage's render path)
    profile: ModelProfile
    max_new_tokens: int

    @property
    def conversation_ids(self) -> frozenset[str]:
        return frozenset(c.conversation_id for c in self.conversations)

    def driver(self, *, stored: dict[str, TurnAnswer], keys: SampleKeys) -> TurnDriver:
        """The conversations' driver; `keys` (without a row_hash: a turn is never context-fitted) key each turn."""
        return TurnDriver(
            self.conversations,
            renderer=self.renderer,
            profile=self.profile,
            max_new_tokens=self.max_new_tokens,
            stored=stored,
            keys=keys,
        )


# -- what the Dagster steps call (defs/generate.py, defs/train.py stay thin) ----------------------


def load_multiturn(
    prompts_file: Any, shard: int, tokenized: Any, *, renderer: Any, profile: ModelProfile, max_new_tokens: int
) -> MultiTurn | None:
    """The shard's all_turns conversations (prompts table) with their tokenized turn-1 prompts, or None."""
    from .inputs import prompts_by_id

    path = as_data_path(prompts_file)
    if not path.exists():
        return None
    if "regenerate" not in prompt_columns(path):
        return None  # a prompts table written before the option existed: all final_turn
    batches = shard_prompts(path, shard, columns=CONVERSATION_COLUMNS)
    found = [c for b in batches if (c := b.filter(pl.col("regenerate").is_not_null())).height]
    if not found:
        return None
    conv = pl.concat(found)
    first = prompts_by_id(tokenized, conv["prompt_id"].to_list())
    return MultiTurn(
        conversations_from_prompts(conv, first), renderer=renderer, profile=profile, max_new_tokens=max_new_tokens
    )


def current_turns(gen_dir: Any, active: pl.DataFrame) -> pl.DataFrame:
    """The stored turn rows whose sample_id is in `active` (the latest generations materialization),
    with the lineage of that materialization (a stored turn may have been made for an earlier
    version of the conversation: same prompt, older conversation id)."""
    turns = read_turn_rows(gen_dir)
    if turns.height == 0 or "turn_index" not in active.columns:
        return turns.clear()
    lineage = active.filter(pl.col("turn_index").is_not_null()).select(
        "sample_id", "conversation_id", pl.col("turn_index").cast(pl.Int32)
    )
    return turns.drop("conversation_id", "turn_index").join(lineage, on="sample_id", how="inner")


def active_turn_ids(turn_sample_ids: list[tuple[str, str, str, int]]) -> pl.DataFrame:
    """active.parquet rows of the turns: sample_id, prompt_id + their lineage in this materialization."""
    return pl.DataFrame(
        {
            "sample_id": [t[0] for t in turn_sample_ids],
            "prompt_id": [t[1] for t in turn_sample_ids],
            "conversation_id": [t[2] for t in turn_sample_ids],
            "turn_index": [t[3] for t in turn_sample_ids],
        },
        schema={"sample_id": pl.String, "prompt_id": pl.String, "conversation_id": pl.String, "turn_index": pl.Int32},
    )


def turns_summary(turns: pl.DataFrame) -> dict[str, Any]:
    """Rows per turn index and per conversation, for metadata."""
    if turns.height == 0:
        return {}
    by_turn = dict(turns.group_by("turn_index").len().sort("turn_index").iter_rows())
    return {
        "conversations": int(turns["conversation_id"].n_unique()),
        "rows_by_turn": {str(k): int(v) for k, v in by_turn.items()},
    }


TURNS_SUMMARY_FILE = "turns.json"  # generations/shard=NNNN/turns.json: the last run's TurnStats (quality report)


def write_turns_summary(gen_dir: Any, turns: dict[str, Any] | None) -> None:
    """The shard's conversation counts for the quality report; removed when the shard has no conversations."""
    f = as_data_path(gen_dir) / TURNS_SUMMARY_FILE
    if turns is None:
        f.unlink(missing_ok=True)
        return
    f.write_text(json.dumps(turns, indent=1, sort_keys=True))
