"""The simulator's prompt prefix cache (a stand-in for SGLang's radix cache): how many prompt tokens are cached."""

from __future__ import annotations

from collections.abc import Sequence


class PrefixTrie:
    """Prompt prefix cache (radix-cache stand-in): longest common prefix with earlier prompts."""

    def __init__(self, max_nodes: int) -> None:
        self.root: dict[int, dict] = {}
        self.nodes = 0
        self.max_nodes = max_nodes
        self.evictions = 0

    def match_and_insert(self, ids: Sequence[int]) -> int:
        node, matched, inserting = self.root, 0, False
        if self.nodes + len(ids) > self.max_nodes:
            self.clear()  # crude whole-cache eviction under memory pressure
            self.evictions += 1
        for t in ids:
            nxt = None if inserting else node.get(t)
            if nxt is None:
                inserting = True
                nxt = node[t] = {}
                self.nodes += 1
            else:
                matched += 1
            node = nxt
        return matched

    def clear(self) -> None:
        self.root = {}
        self.nodes = 0
