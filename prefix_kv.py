"""The prefix cache of TorchEngine's eager path: the KV of finished rows, kept for later requests that extend them
(PrefixCache), so such a request prefills only its new tokens. engines.py restores and fills it."""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch


@dataclass
class _Entry:
    """One cached sequence: its token ids and their KV (layers, 2, Hkv, n, D), positions 0..n-1."""
    id: int
    adapter: str | None
    ids: list[int]
    kv: torch.Tensor
    keys: list


class PrefixCache:
    """The KV of finished rows, kept for later requests that extend them, so such a request prefills only its
    new tokens: a researcher's next round, a ReAct step after a tool call, a refiner's second turn under the
    same adapter.

    An entry is one finished row under one adapter (None = base): its prompt + completion less the
    last sampled token (whose KV was never computed), with their KV at positions 0..n-1 (RoPE counts
    from the start of the real prompt, so an entry can be restored at any cache column).
    lookup() finds the longest prefix of a prompt that some entry of the same adapter shares: entries
    are indexed by a chained hash of each of their full blocks of BLOCK tokens, a walk over the
    prompt's blocks finds the longest block-aligned match, and the tokens past it are compared one
    by one. The matched prefix is compared token by token, so a hash collision costs a miss, never a
    wrong KV. Memory: an LRU over entries holding at most `max_tokens` tokens in all (0 = off).
    The entries are only valid for the weights they were computed with: the engine clears them when
    the weights change.
    """
    BLOCK = 16

    def __init__(self, max_tokens: int):
        self.max_tokens, self.tokens, self._next = max_tokens, 0, 0
        self.entries: OrderedDict[int, _Entry] = OrderedDict()  # least recently used first
        self.index: dict[tuple, dict[int, _Entry]] = {}  # (adapter, chained block hash) -> entries with that prefix

    def clear(self):
        self.entries.clear()
        self.index.clear()
        self.tokens = 0

    def _keys(self, adapter, ids, n_blocks):
        """The index keys of the first n_blocks full blocks of ids, lazily (a lookup stops at a miss)."""
        h, B = 0, self.BLOCK
        for k in range(n_blocks):
            h = hash((h, tuple(ids[k * B:(k + 1) * B])))
            yield adapter, h

    def lookup(self, adapter, ids: list[int], limit: int) -> tuple[_Entry | None, int]:
        """The longest prefix of ids[:limit] that an entry of `adapter` holds -> (entry, length), or (None, 0)."""
        found, n = None, 0
        for key in self._keys(adapter, ids, limit // self.BLOCK):
            if key not in self.index:
                break
            found, n = self.index[key], n + self.BLOCK
        if found is None:
            return None, 0
        e = next(reversed(found.values()))  # the newest entry with this prefix
        if e.ids[:n] != ids[:n]:  # a hash collision
            return None, 0
        m = min(len(e.ids), limit)
        while n < m and e.ids[n] == ids[n]:  # fewer than BLOCK tokens past the last matched block
            n += 1
        self.entries.move_to_end(e.id)
        return e, n

    def put(self, adapter, ids: list[int], kv, replaces: _Entry | None = None):
        """Keep ids and their KV (layers, 2, Hkv, len(ids), D); `replaces` (the entry the row started
        from) goes if ids extend it, as it can serve nothing the new entry cannot."""
        if replaces is not None and replaces.id in self.entries and ids[:len(replaces.ids)] == replaces.ids:
            self._drop(replaces)
        if not self.BLOCK <= len(ids) <= self.max_tokens:  # shorter than a block: never found
            return
        while self.tokens + len(ids) > self.max_tokens:
            self._drop(next(iter(self.entries.values())))  # least recently used
        e = _Entry(self._next, adapter, list(ids), kv, list(self._keys(adapter, ids, len(ids) // self.BLOCK)))
        self._next += 1
        self.entries[e.id] = e
        self.tokens += len(ids)
        for key in e.keys:
            self.index.setdefault(key, {})[e.id] = e

    def _drop(self, e: _Entry):
        del self.entries[e.id]
        self.tokens -= len(e.ids)
        for key in e.keys:
            d = self.index[key]
            del d[e.id]
            if not d:
                del self.index[key]
