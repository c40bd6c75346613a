"""`memsearch watch`, with its file events handled one at a time.

memsearch 0.4.23's watcher handles each file's debounced event in its own timer thread,
and every handler drives the same asyncio loop: when two files change together, one
handler fails ("This event loop is already running") and that file's update is dropped
until it changes again. A summary never changes again, so it would stay out of recall
for good. Serialising `_MarkdownHandler._fire` fixes it; everything else is memsearch's
own CLI. The patched name is private, which is why memsearch is pinned exactly.
"""

from __future__ import annotations

import threading

from memsearch import watcher
from memsearch.cli import cli

from memd import heap

_serial = threading.Lock()
_fire = watcher._MarkdownHandler._fire


def _fire_one_at_a_time(self: watcher._MarkdownHandler, path: str) -> None:
    with _serial:
        _fire(self, path)


def main() -> None:
    heap.tune()  # each indexing batch frees its chunks and vectors: see memd/heap.py
    watcher._MarkdownHandler._fire = _fire_one_at_a_time
    cli(prog_name="memsearch")


if __name__ == "__main__":
    main()
