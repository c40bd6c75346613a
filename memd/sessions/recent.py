"""What a client holds in memory of an on-disk table: the entries used last, and every
entry not yet on disk.

The prefix index's nodes and the exchange keys (memd.sessions.prefix,
memd.sessions.exchange_keys) live in the state database; memory keeps the `capacity`
entries used last and asks the database for any other. An entry a call adds is in memory
only until its commit, so it must not be evicted before: it would be in neither place,
and a second call deciding meanwhile would miss it (an edit of a long chat taken for a
new conversation; a retried exchange written twice, and its whole batch refused by the
database's unique key). So a call's entries are *unsaved* until the committer reports
its change on disk (`saved`), and only saved entries count against, and are evicted by,
the capacity. Unsaved entries are bounded by the calls in flight, not by the capacity.

Why a small capacity: at 2,000 entries each, the nodes and keys held ~1.1 MB a client,
22 MB of memd at 20 clients after an hour of records (docs/performance.md).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Recent(Generic[K, V]):
    """A mapping that keeps every unsaved entry and the `capacity` saved ones used last
    (all of them when `capacity` is None: nothing backs it on disk)."""

    def __init__(self, capacity: int | None) -> None:
        self._capacity = None if capacity is None else max(1, capacity)
        self._saved: dict[K, V] = {}  # oldest use first
        self._unsaved: dict[K, tuple[V, int]] = {}  # value, commits still awaited

    def __len__(self) -> int:
        return len(self._saved) + len(self._unsaved)

    def __contains__(self, key: K) -> bool:
        return self.get(key) is not None

    def get(self, key: K) -> V | None:
        """The value (and the entry becomes the one used last), or None."""
        pending = self._unsaved.get(key)
        if pending is not None:
            return pending[0]
        value = self._saved.pop(key, None)
        if value is not None:
            self._saved[key] = value
        return value

    def keep(self, key: K, value: V) -> None:
        """Hold an entry that is on disk (read back from it), as the one used last."""
        if key in self._unsaved:
            return  # a write of it is still on its way: that one holds it
        self._saved.pop(key, None)
        self._saved[key] = value
        self._trim()

    def add(self, key: K, value: V) -> None:
        """Hold an entry a call is writing, until `saved` is told of that call's commit."""
        if self._capacity is None:
            self._saved[key] = value
            return
        self._saved.pop(key, None)
        _, waiting = self._unsaved.get(key, (value, 0))
        self._unsaved[key] = (value, waiting + 1)

    def saved(self, keys: Iterable[K]) -> None:
        """One call's entries are on disk: each may now be evicted, as the one used last."""
        if self._capacity is None:
            return
        for key in keys:
            pending = self._unsaved.get(key)
            if pending is None:
                continue
            value, waiting = pending
            if waiting > 1:
                self._unsaved[key] = (value, waiting - 1)
                continue
            del self._unsaved[key]
            self._saved[key] = value
        self._trim()

    def _trim(self) -> None:
        if self._capacity is None:
            return
        while len(self._saved) > self._capacity:
            del self._saved[next(iter(self._saved))]
