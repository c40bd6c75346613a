"""Conversation titles that follow the transcript file, so removed text never comes back.

A conversation's title (its first user message, cut to 70 characters) is written into
every exchange heading and kept in the state database. If the state were the source,
a person who removed "My PIN is 7777" from the file with `sed -i` would see the next
exchange write it back (issue #14). So the file is the source: before each append the
store asks `Titles.check` whether the file is still exactly what memd last wrote (same
inode, size and mtime); if not (edited, replaced, deleted, or not yet seen since the
store opened or the session was reopened), the titles of that session's conversations
are taken again from what the file says (`markdown.first_user_titles`). Rows and freshly
rendered headings carrying an out-of-date title are then corrected (`fix`) before
anything is written, in the store's one IO thread. One `os.stat` per transcript per
commit when nothing changed; one parse of the file after an edit.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import structlog

from memd.markdown import conversation_title, first_user_titles, retitle

log = structlog.get_logger()

Stamp = tuple[int, int, int, int]  # st_dev, st_ino, st_size, st_mtime_ns
_TITLE = 7  # the title's place in a conversation row (store.Conv.row)


def _stamp(path: Path) -> Stamp | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class Titles:
    """Every conversation's current title, and how each transcript looked when last written."""

    def __init__(self, convs: Iterable[Any]) -> None:
        self._title: dict[int, str | None] = {}
        # session id -> conversation number -> key: `check` looks at one session's
        # conversations, not at every conversation the client ever had
        self._at: dict[str | None, dict[int, int]] = {}
        for conv in convs:
            self._learn(conv.row())
        self._seen: dict[str, Stamp | None] = {}

    def _learn(self, row: tuple[Any, ...]) -> None:
        key, session_id, number = row[0], row[3], row[4]
        self._at.setdefault(session_id, {})[number] = key
        self._title.setdefault(key, row[_TITLE])

    def forget_file(self, session_id: str) -> None:
        """The file changed hands (resumed, cut by forget): read it again before the next write."""
        self._seen.pop(session_id, None)

    def check(self, session_id: str, path: Path) -> dict[int, str]:
        """Re-derive the session's titles if its file is not as memd left it; what changed."""
        if session_id in self._seen and self._seen[session_id] == _stamp(path):
            return {}
        try:
            text = path.read_bytes().decode("utf-8", "replace")
        except FileNotFoundError:
            text = ""
        found = first_user_titles(text)
        changed: dict[int, str] = {}
        for number, key in self._at.get(session_id, {}).items():
            title = found.get(number, "")
            old = self._title.get(key)
            if old is not None and conversation_title(old) != title:
                changed[key] = title
                self._title[key] = title
        if changed and session_id in self._seen:
            log.info("titles.rederived", session=session_id, conversations=len(changed))
        return changed

    def seen(self, session_id: str, path: Path) -> None:
        """memd just wrote the file: this is how it looks now."""
        self._seen[session_id] = _stamp(path)

    def fix(
        self, conv_rows: list[tuple[Any, ...]], data: bytes | None
    ) -> tuple[list[tuple[Any, ...]], bytes | None]:
        """Rows (and the one conversation's freshly rendered text) with current titles.

        A conversation not seen before brings its title (it was just set from its first
        message); for every other one the title held here wins over the row's.
        """
        rows: list[tuple[Any, ...]] = []
        for row in conv_rows:
            key = row[0]
            held = self._title.get(key)
            current = row[_TITLE] if held is None else held
            self._at.setdefault(row[3], {})[row[4]] = key
            self._title[key] = current
            if current != row[_TITLE]:
                if data is not None and len(conv_rows) == 1:
                    data = retitle(data.decode("utf-8"), current or "").encode("utf-8")
                row = (*row[:_TITLE], current)
            rows.append(row)
        return rows, data
