"""`memsearch watch` as memd runs it: memsearch's own CLI, with memd's patches in place.

The patches (`memd.indexing.engine.prepare_watcher`, applied by the shared start-up
routine): the watcher's file events handled one at a time and moves understood
(`memd.indexing.engine.watcher`), memd's indexing size policy in memsearch's chunker
(`memd.indexing.engine.chunking`: memd cuts a giant exchange for the index when it writes
it, memd.markdown.overflow), a changed chunk stored before its old version is deleted
(`memd.indexing.engine.index_order`), and the client's index lock
(`memd.indexing.index_lock`: not beside memd's catch-up of the same files). Everything
else is memsearch's own CLI.

memsearch computes its global config path (`~/.memsearch/config.toml`) from HOME when it
is imported. A watcher forked from memd's zygote imported it there, under the zygote's
HOME; `main` points it at the watcher's own HOME (memd's empty per-client folder).
"""

from __future__ import annotations

from pathlib import Path

import memsearch.cli
import memsearch.config
from memsearch.cli import cli

from memd.indexing import engine
from memd.indexing.children import startup


def _follow_home() -> None:
    path = Path("~/.memsearch/config.toml").expanduser()
    memsearch.config.GLOBAL_CONFIG_PATH = path
    memsearch.cli.GLOBAL_CONFIG_PATH = path


def main() -> None:
    """memsearch's CLI (it reads sys.argv) after the shared start-up; the watcher's log
    is memsearch's own, so memd's log set-up is left out."""
    startup.start(engine.WATCHER, memd_logging=False)
    _follow_home()
    cli(prog_name="memsearch")


if __name__ == "__main__":
    main()
