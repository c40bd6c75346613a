"""Text a user removes from a transcript stays removed (issue #14, finding 2).

memd keeps a conversation's title (its first user message) outside the transcript, in
`.memd/state.sqlite3`, and writes it into every exchange heading. After a person edits
the file, the next exchange must take the title from what the file now says, whether
the edit replaced the file (`sed -i`), rewrote it in place, or happened while memd was
not running.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from memd.markdown import read_transcript
from tests.support.sessions import Clock, open_sessions, run

SECRET = "7777"


def sed(path: Path, expr: str) -> None:
    subprocess.run(["sed", "-i", expr, str(path)], check=True)


def rewrite_in_place(path: Path, old: str, new: str) -> None:
    """An editor that truncates and rewrites the same inode."""
    text = path.read_text(encoding="utf-8").replace(old, new)
    with open(path, "r+", encoding="utf-8") as fh:
        fh.seek(0)
        fh.write(text)
        fh.truncate()


def titles(path: Path) -> list[str]:
    parsed = read_transcript(path)
    return [ex.title for conv in parsed.conversations for ex in conv.exchanges]


def test_mcp_title_follows_sed_i(tmp_path: Path) -> None:
    clock = Clock()

    async def main() -> None:
        async with open_sessions(tmp_path, clock) as cs:
            out = await cs.record_exchange("c1", f"Hello. My PIN is {SECRET}", "Noted.")
            path = Path(out["path"])
            sed(path, f"s/ My PIN is {SECRET}//")
            assert SECRET not in path.read_text()
            clock.advance(1)
            await cs.record_exchange("c1", "What else?", "Nothing.")
            text = path.read_text()
            assert SECRET not in text, text
            assert titles(path) == ["Hello.", "Hello."]

    run(main)


def test_mcp_title_follows_an_in_place_rewrite(tmp_path: Path) -> None:
    clock = Clock()

    async def main() -> None:
        async with open_sessions(tmp_path, clock) as cs:
            out = await cs.record_exchange("c1", f"My PIN is {SECRET}", "Noted.")
            path = Path(out["path"])
            rewrite_in_place(path, f"My PIN is {SECRET}", "My PIN is gone")
            clock.advance(1)
            await cs.record_exchange("c1", "Anything else?", "No.")
            assert SECRET not in path.read_text()
            assert titles(path)[-1] == "My PIN is gone"

    run(main)


def test_chat_title_follows_an_edit_made_while_memd_was_stopped(tmp_path: Path) -> None:
    """`both` mode resends the history; the title comes from the file, not the request."""
    clock = Clock()
    first = {"role": "user", "content": f"My PIN is {SECRET}, keep it"}
    reply = {"role": "assistant", "content": "Kept."}

    async def record_first() -> Path:
        async with open_sessions(tmp_path, clock) as cs:
            out = await cs.record_chat([first], reply)
            return Path(out["path"])

    async def continue_it(path: Path) -> None:
        async with open_sessions(tmp_path, clock) as cs:
            out = await cs.record_chat(
                [first, reply, {"role": "user", "content": "And?"}],
                {"role": "assistant", "content": "Done."},
            )
            assert out["match"] == "continuation"
            assert Path(out["path"]) == path

    path: Path | None = None

    async def main() -> None:
        nonlocal path
        path = await record_first()

    run(main)
    assert path is not None
    sed(path, f"s/My PIN is {SECRET}, keep it/(removed)/")
    clock.advance(1)
    run(lambda: continue_it(path))
    text = path.read_text()
    assert SECRET not in text, text
    assert titles(path)[-1] == "(removed)"


def test_a_removed_first_exchange_takes_its_title_along(tmp_path: Path) -> None:
    """With the first exchange deleted, the next remaining user message names the rest."""
    clock = Clock()

    async def main() -> None:
        async with open_sessions(tmp_path, clock) as cs:
            out = await cs.record_exchange("c1", f"PIN {SECRET}", "ok")
            path = Path(out["path"])
            clock.advance(1)
            await cs.record_exchange("c1", "Second question", "ok")
            text = path.read_text()
            start = text.index("## ")
            end = text.index("## ", start + 3)
            tmp = path.with_name(".edit.tmp")
            tmp.write_text(text[:start] + text[end:], encoding="utf-8")
            os.replace(tmp, path)
            clock.advance(1)
            await cs.record_exchange("c1", "Third question", "ok")
            text = path.read_text()
            assert SECRET not in text[text.rindex("## ") :]  # the new exchange's heading
            assert titles(path)[-1] == "Second question"

    run(main)
