"""The prefix index: every recorded message prefix of a client's chats, by chained hash.

The chained hash of the first k messages is `h_k = blake2b(h_{k-1} || key_k)`, so one
16-byte value names a whole prefix and prefix lookup is a dict hit (PrefixIndex).
Computing the chain is O(total bytes of the request): it reads every message once.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Protocol

from memd.sessions.messages import Message
from memd.sessions.recent import Recent

PREAMBLE_ROLES = frozenset({"system", "developer"})
_ROOT = b"\0" * 16


def chain(prev: bytes, message: Message) -> bytes:
    h = hashlib.blake2b(prev, digest_size=16)
    h.update(message.key)
    return h.digest()


def chained_hashes(messages: Sequence[Message], base: bytes | None = None) -> list[bytes]:
    """h_1..h_n for the prefixes of `messages`; O(n) blake2b calls over the canonical keys.

    From `base` (a recorded prefix's hash) the chain goes on from there: the same hashes
    the whole history would give, without the history."""
    out: list[bytes] = []
    prev = _ROOT if base is None else base
    for message in messages:
        prev = chain(prev, message)
        out.append(prev)
    return out


Node = tuple[bytes, int, int, bytes | None]  # hash, conversation, exchange, parent hash
INDEX_CAPACITY = 256  # committed nodes a client keeps in memory when a store backs the index


class NodeStore(Protocol):
    """The committed nodes: what PrefixIndex asks about a hash it no longer holds."""

    def node(self, h: bytes) -> tuple[int, int] | None: ...

    def has_children(self, h: bytes) -> bool: ...


class PrefixIndex:
    """Every recorded message prefix, by chained hash -> (conversation, exchange written in).

    For a request m_1..m_n plus reply r, the longest recorded prefix k decides (k must
    reach past the leading system/developer messages, else any two chats that share a
    system prompt would merge):

    - no such k: `new` conversation; everything is written.
    - k = n and h(m_1..m_n, r) recorded: `duplicate` (a retried call); nothing is written.
    - node k is a leaf: `continuation`; m_{k+1}..m_n and r are written.
    - k = n, node k has children: `regenerated` (the same request again); only r is
      written, marked as a regenerated reply to the exchange of m_n.
    - k < n, node k has children: `edited` (the user edited or went back to an earlier
      message; `branch` when m_{k+1} is not a user message). The new messages go into
      the same conversation, marked as branching after the exchange of m_k.
    - a changed system prompt shares no prefix: `new`.

    Two chats that open with the same request cannot be told from a regenerate by a
    stateless API: they share one conversation, each continuing from its own leaf, and
    nothing is written twice. A node belongs to the conversation that wrote it last; only
    preamble nodes, which never match on their own, are ever written by two.

    Cost per request: at most n - p probes (two for a usual continuation) and O(new
    messages) to add; nothing per stored message. Memory: ~200 bytes per node kept.

    With a `store` (the committed nodes on disk), memory holds the `capacity` nodes used
    last and every node not yet committed (`saved` is told of each commit): a miss asks
    the store, and a hit there is kept again. Without one, every node stays in memory.
    So memory and store together always know every node; a failed commit reloads both.
    """

    def __init__(
        self,
        nodes: Iterable[Node] = (),
        *,
        store: NodeStore | None = None,
        capacity: int = INDEX_CAPACITY,
    ) -> None:
        limit = capacity if store is not None else None
        self._nodes: Recent[bytes, tuple[int, int]] = Recent(limit)
        self._parents: Recent[bytes, bool] = Recent(limit)  # hashes with children
        self._store = store
        for h, conv, exchange, parent in nodes:
            self._nodes.keep(h, (conv, exchange))
            if parent is not None:
                self._parents.keep(parent, True)

    def __len__(self) -> int:
        """Nodes held in memory (not those only the store has)."""
        return len(self._nodes)

    def _get(self, h: bytes) -> tuple[int, int] | None:
        hit = self._nodes.get(h)
        if hit is None and self._store is not None:
            hit = self._store.node(h)
            if hit is not None:
                self._nodes.keep(h, hit)
        return hit

    def _has_children(self, h: bytes) -> bool:
        if h in self._parents:
            return True
        if self._store is not None and self._store.has_children(h):
            self._parents.keep(h, True)
            return True
        return False

    def classify(
        self, msgs: Sequence[Message], hashes: Sequence[bytes], base: bytes | None = None
    ) -> tuple[int, str, int | None, int]:
        """(k, kind, conversation key, exchange of node k) for `prepare`'s output; with a
        `base`, `msgs` follow that recorded prefix (k = 0 is the base itself)."""
        n = len(msgs)
        low = preamble_length(msgs) if base is None else -1
        for k in range(n, low, -1):
            at = hashes[k - 1] if k else base
            hit = self._get(at) if at is not None else None
            if at is None or hit is None:
                continue
            conv, ref = hit
            if k == n and self._get(hashes[n]) is not None:
                return k, "duplicate", conv, ref
            if not self._has_children(at):
                return k, "continuation", conv, ref
            if k == n:
                return k, ("branch" if msgs[-1].role == "assistant" else "regenerated"), conv, ref
            return k, ("edited" if msgs[k].role == "user" else "branch"), conv, ref
        return 0, "new", None, 0

    def add(
        self,
        hashes: Sequence[bytes],
        k: int,
        exchanges: Sequence[int],
        conv: int,
        base: bytes | None = None,
    ) -> list[Node]:
        """Index hashes[k:] (the new messages and the reply) under `conv`; rows to persist."""
        parent = hashes[k - 1] if k else base
        rows: list[Node] = []
        for h, exchange in zip(hashes[k:], exchanges, strict=True):
            rows.append((h, conv, exchange, parent))
            self._nodes.add(h, (conv, exchange))
            if parent is not None:
                self._parents.add(parent, True)
            parent = h
        return rows

    def saved(self, rows: Iterable[Node]) -> None:
        """`add`'s rows are on disk: memory may let them go (memd.sessions.recent)."""
        rows = list(rows)
        self._nodes.saved(h for h, _, _, _ in rows)
        self._parents.saved(parent for _, _, _, parent in rows if parent is not None)


def preamble_length(messages: Sequence[Message]) -> int:
    """How many leading messages are system/developer prompts."""
    n = 0
    while n < len(messages) and messages[n].role in PREAMBLE_ROLES:
        n += 1
    return n
