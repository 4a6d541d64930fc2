"""What the generation engine passes around per request: a work item.

An item is one request to make: a prompt's sample (inputs.iter_pending, in the shard's order) or a turn of an
all_turns conversation (multiturn.TurnDriver, when the turn before it is in). It carries what the request
sends (the ids), what its key is (sample_id and the sampling hash it was made with) and what its stored row
names (prompt, source, shard, template; a turn's conversation). rows.py turns its answer into the stored row.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Turn:
    """The conversation a turn item belongs to: stored on its row (schemas.TURN_GENERATIONS)."""

    conversation_id: str  # the conversation's prompt_id (prompts table)
    turn_index: int  # 1-based
    prompt_messages: str  # JSON: the messages rendered into this turn's prompt (the model's own earlier turns)
    tools: str | None  # JSON tools the turn's prompt declares, or None


@dataclass(frozen=True, slots=True)
class WorkItem:
    """One request of a shard's run: its key, the ids it sends, and the lineage its row keeps."""

    sample_id: str
    prompt_id: str
    input_ids: list[int]
    source: str | None = None
    shard: int | None = None
    template_hash: str | None = None
    sampling_hash: str | None = (
        None  # the hash of what is sent for this row (a context-fitted prompt's); None: the run's
    )
    turn: Turn | None = None  # a conversation's turn; None: a prompt's sample

    @property
    def is_turn(self) -> bool:
        return self.turn is not None
