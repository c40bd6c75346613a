"""A bounded memo of what recall computes from a chunk's text, keyed by the text's digest.

Recall analyses every candidate's text (its terms, the dates it says) and the same chunks
come back search after search, so those results are remembered. A `functools.lru_cache`
keyed by the text keeps the text itself alive as its key: ~0.8 KB for an exchange's
chunk, most of what such a cache holds once it is full (measured for issue 29: 3.4 KB an
entry for the term sets, 1.1 KB for the dates, 21.6 MB at capacity, which a long run of
`bench/load.py` reaches). Here the key is the text's 16-byte BLAKE2b digest (a
microsecond or two to compute, and no two texts in practice share one), and the value
is what was computed (docs/performance.md, "memd itself").

Every memo is also listed here, so that `clear_all` can drop them at once when recall has
been idle (memd.recall.caches): full, they are ~5 MB of memd that a quiet daemon does not
need.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from hashlib import blake2b
from typing import Any, Generic, TypeVar

T = TypeVar("T")

_MEMOS: list[TextMemo[Any]] = []  # every memo made, for clear_all


def digest(text: str) -> bytes:
    """16 bytes that stand for `text` as a memo's key."""
    return blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


class TextMemo(Generic[T]):
    """`fn(text, *extra)` remembered for the `maxsize` most recently used keys (the text's
    digest and `extra`, which must be hashable). Thread-safe: recall's lanes share it."""

    def __init__(self, fn: Callable[..., T], maxsize: int) -> None:
        self._fn = fn
        self._maxsize = maxsize
        self._items: OrderedDict[Hashable, T] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0
        _MEMOS.append(self)

    def __call__(self, text: str, *extra: Hashable) -> T:
        key: Hashable = (digest(text), *extra) if extra else digest(text)
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                self.hits += 1
                return self._items[key]
        value = self._fn(text, *extra)  # outside the lock: two threads may both compute
        with self._lock:
            self.misses += 1
            self._items[key] = value
            if len(self._items) > self._maxsize:
                self._items.popitem(last=False)
        return value

    def __len__(self) -> int:
        return len(self._items)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.hits = self.misses = 0


def clear_all() -> int:
    """Empty every memo; how many entries were dropped."""
    dropped = 0
    for memo in _MEMOS:
        dropped += len(memo)
        memo.clear()
    return dropped
