"""`memsearch watch`, with its file events handled one at a time and moves understood.

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
same debounce as every other event. Everything else is memsearch's own CLI. The patched
names are private, which is why memsearch is pinned exactly.

memd cuts a giant exchange for the index when it writes it (memd.markdown.overflow):
`chunking.install` makes memsearch chunk only what memd indexes of a transcript.

memsearch computes its global config path (`~/.memsearch/config.toml`) from HOME when it
is imported. A watcher forked from memd's zygote imported it there, under the zygote's
HOME; `main` points it at the watcher's own HOME (memd's empty per-client folder).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import memsearch.cli
import memsearch.config
from memsearch import watcher
from memsearch.cli import cli

from memd import heap
from memd.indexing import chunking, index_lock

_serial = threading.Lock()
_fire = watcher._MarkdownHandler._fire


def _fire_one_at_a_time(self: watcher._MarkdownHandler, path: str) -> None:
    with _serial:
        _fire(self, path)


def _on_moved(self: watcher._MarkdownHandler, event: Any) -> None:
    """A rename within the watched tree: drop the source, re-index the destination."""
    if event.is_directory:
        return  # watchdog follows up with events for the files inside
    src, dest = os.fsdecode(event.src_path), os.fsdecode(event.dest_path)
    if src and self._is_markdown(src):
        self._schedule("deleted", src)
    if dest and self._is_markdown(dest) and self._should_process(dest):
        self._schedule("modified", dest)


def patch() -> None:
    """Install the fixes and the indexing size policy into memsearch (idempotent)."""
    watcher._MarkdownHandler._fire = _fire_one_at_a_time
    watcher._MarkdownHandler.on_moved = _on_moved
    chunking.install()


def _follow_home() -> None:
    path = Path("~/.memsearch/config.toml").expanduser()
    memsearch.config.GLOBAL_CONFIG_PATH = path
    memsearch.cli.GLOBAL_CONFIG_PATH = path


def main() -> None:
    heap.tune()  # each indexing batch frees its chunks and vectors: see memd/heap.py
    _follow_home()
    patch()
    index_lock.install_from_env()  # not beside memd's catch-up of the same files
    cli(prog_name="memsearch")


if __name__ == "__main__":
    main()
