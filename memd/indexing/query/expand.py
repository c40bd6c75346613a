"""Recall's expand: the whole markdown section a hit's chunk belongs to.

memsearch's rule (its `expand`), computed in memd over lines recall has read already, so
memd never imports `memsearch.cli` (and with it pymilvus). Separate from the search, which
gives only the hit; `memd.recall.shown` asks for the section.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

if TYPE_CHECKING:
    from memd.indexing.query.search import Hit

log = structlog.get_logger()

# memsearch 0.4.23's heading rule (`memsearch.chunker._HEADING_RE`): a chunk's section is
# found by the same rule that cut it. Copied, not imported: `import memsearch.chunker` runs
# memsearch's `__init__`, which imports its core, store and scanner (1.5 MB of memd's PSS
# with the engine's face, issue 29); tests/test_search.py checks it is memsearch's.
HEADING_RE = re.compile(r"^(#{1,6})\s+(.+)$", re.MULTILINE)


@dataclass(frozen=True)
class Section:
    """The full markdown section (heading to next heading of the same level) around a chunk."""

    chunk_hash: str
    source: str
    heading: str
    start_line: int
    end_line: int
    content: str


@functools.lru_cache(maxsize=1024)
def _inside(source: str, root: str) -> bool:
    """Whether `source` resolves to a path under `root`. Remembered: recall asks it of
    every candidate, mostly the same few files, and resolving walks every component
    (~3 ms of a recall's CPU under load, py-spy). Only the owner can write in a client's
    folder, so a path that resolved inside it stays there."""
    return Path(source).resolve().is_relative_to(Path(root).resolve())


def expand_hit(hit: Hit, root: Path | None = None, lines: Sequence[str] | None = None) -> Section:
    """memsearch's expand: from the chunk's heading to the next heading of the same or a
    higher level. Only files under `root` (the client's folder) are read; a caller that
    has the file's lines already (recall reads each file once) passes them."""
    path = Path(hit.source)
    fallback = Section(
        hit.chunk_hash, hit.source, hit.heading, hit.start_line, hit.end_line, hit.content
    )
    if root is not None and not _inside(hit.source, str(root)):
        log.warning("recall.expand_outside_root", source=hit.source, root=str(root))
        return fallback
    if lines is None:
        try:  # memsearch.io's read_utf8_text_replace, without importing memsearch
            lines = path.read_bytes().decode("utf-8", errors="replace").splitlines()
        except OSError:
            return fallback
    if hit.start_line > len(lines):
        return fallback  # the file shrank since it was indexed
    text, start, end = extract_section(lines, hit.start_line, hit.heading_level)
    return Section(hit.chunk_hash, hit.source, hit.heading, start, end, text)


def extract_section(
    lines: Sequence[str], start_line: int, heading_level: int
) -> tuple[str, int, int]:
    """memsearch 0.4.23's `_extract_section` (memsearch.cli), line for line: back from the
    chunk's first line to its heading, forward to the next heading of the same or a higher
    level. Copied, not imported: `memsearch.cli` imports pymilvus (and pandas, pyarrow,
    gRPC), ~90 MB memd does not otherwise need; tests/test_search.py checks it against
    memsearch's own on every kind of section, so an upgrade that changes it is caught."""
    heading = HEADING_RE
    start = start_line - 1
    end = len(lines)
    if heading_level > 0:
        for i in range(min(start_line, len(lines)) - 1, -1, -1):
            m = heading.match(lines[i])
            if m and len(m.group(1)) <= heading_level:
                start = i
                break
        for i in range(start_line, len(lines)):
            m = heading.match(lines[i])
            if m and len(m.group(1)) <= heading_level:
                end = i
                break
    return "\n".join(lines[start:end]), start + 1, end
