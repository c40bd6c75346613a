"""`memsearch watch`'s file events handled one at a time, and moves understood.

memsearch 0.4.23's watcher handles each file's debounced event in its own timer thread,
and every handler drives the same asyncio loop: when two files change together, one
handler fails ("This event loop is already running") and that file's update is dropped
until it changes again. A summary never changes again, so it would stay out of recall
for good. Serialising `_MarkdownHandler._fire` fixes it.

Its handler also has no `on_moved`, so a rename inside the watched tree was ignored:
`sed -i`, an editor's atomic save (write a temp file, rename it over) and `mv` over a
file all end in one, and the old text stayed searchable until the file next changed
(issue #14). watchdog reports a move out of the tree as a delete and a move in as a
create already; within the tree the handler here turns it into what it means: the
source is dropped (deleted) and the destination re-indexed (modified), each through the
same debounce as every other event. The patched names are private, which is why
memsearch is pinned exactly (`memd.indexing.engine.pins`).
"""

from __future__ import annotations

import os
import threading
from typing import Any

from memd.indexing.engine.registry import Registry

GROUP = "memsearch.watch_events"

_serial = threading.Lock()


def _on_moved(self: Any, event: Any) -> None:
    """A rename within the watched tree: drop the source, re-index the destination."""
    if event.is_directory:
        return  # watchdog follows up with events for the files inside
    src, dest = os.fsdecode(event.src_path), os.fsdecode(event.dest_path)
    if src and self._is_markdown(src):
        self._schedule("deleted", src)
    if dest and self._is_markdown(dest) and self._should_process(dest):
        self._schedule("modified", dest)


def install(registry: Registry) -> None:
    """Serialise the handler's events and give it `on_moved`."""
    from memsearch import watcher

    handler = watcher._MarkdownHandler
    fire = registry.original(handler, "_fire")
    for name in ("_is_markdown", "_schedule", "_should_process"):  # what _on_moved calls
        registry.original(handler, name)

    def fire_one_at_a_time(self: Any, path: str) -> None:
        with _serial:
            fire(self, path)

    registry.replace(GROUP, handler, "_fire", fire_one_at_a_time)
    registry.replace(GROUP, handler, "on_moved", _on_moved)
