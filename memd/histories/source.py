"""Open a history file, tell its format, and stream its conversations one at a time.

A ChatGPT or Claude.ai export is one JSON array of conversations, often hundreds of MB:
ijson (yajl2_c) parses it incrementally, so memory holds one conversation at a time.
The file may be the export's `.zip` (its `conversations.json` is read from the archive
without unpacking) or `conversations.json` itself. memd's own export is JSON lines.
The format is told by the first byte (`[` an export, `{` JSON lines) and the first
conversation's keys (`mapping`: ChatGPT, `chat_messages`: Claude.ai); `--format` forces it.
"""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import IO, Any

import ijson

from memd.histories import chatgpt, claude
from memd.histories.model import Conversation, Exchange, HistoryError, Tally, from_iso

FORMATS = ("memd", "chatgpt", "claude")
EXPORT_MEMBER = "conversations.json"
Reader = Callable[[Any, int, Tally], Conversation | None]


class _Counting(io.RawIOBase):
    """Counts the bytes read through it: the progress bar's position and the error's place."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw, self.pos = raw, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.raw.read(len(buffer))
        buffer[: len(data)] = data
        self.pos += len(data)
        return len(data)


@dataclass
class History:
    """An open history: its format, size in bytes, and its conversations as a stream."""

    name: str
    format: str
    size: int | None
    stream: _Counting
    tally: Tally
    handles: list[Any]
    first: list[Any] = field(default_factory=list)  # the conversation peeked at to tell
    items: Iterator[Any] | None = None  # the parser that peeked, to go on with

    @property
    def position(self) -> int:
        return self.stream.pos

    def conversations(self) -> Iterator[Conversation]:
        if self.format == "memd":
            return self._lines()
        return self._array(
            chatgpt.conversation if self.format == "chatgpt" else claude.conversation
        )

    def close(self) -> None:
        for handle in reversed(self.handles):
            handle.close()

    def __enter__(self) -> History:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _array(self, read: Reader) -> Iterator[Conversation]:
        items = self.items or ijson.items(self.stream, "item", use_float=True)
        n = 0
        try:
            for n, raw in enumerate(chain(self.first, items), 1):
                try:
                    conv = read(raw, n, self.tally)
                except (ValueError, KeyError, TypeError, AttributeError) as exc:
                    raise HistoryError(f"{self.name}: {exc}") from None
                if conv is not None:
                    yield conv
        except ijson.JSONError as exc:
            raise HistoryError(
                f"{self.name}: malformed JSON near byte {self.position} "
                f"(after conversation {n}): {_first_line(exc)}"
            ) from None

    def _lines(self) -> Iterator[Conversation]:
        text = io.TextIOWrapper(io.BufferedReader(self.stream), encoding="utf-8")
        current: Conversation | None = None
        try:
            for n, line in enumerate(text, 1):
                if not line.strip():
                    continue
                conv, exchange = _record(line, n, self.name)
                if current is None or (current.session_id, current.conversation_id) != (
                    conv.session_id,
                    conv.conversation_id,
                ):
                    if current is not None:
                        yield current
                    current = conv
                current.exchanges.append(exchange)
        except UnicodeDecodeError as exc:
            raise HistoryError(f"{self.name}: not UTF-8 near byte {self.position}: {exc}") from None
        if current is not None:
            yield current


def _record(line: str, n: int, name: str) -> tuple[Conversation, Exchange]:
    """One `memd export` line: its conversation (keyed by session and number) and exchange."""
    try:
        r = json.loads(line)
        sid, number, exchange = r["session_id"], int(r["conversation"]), int(r["exchange"])
        when = from_iso(r["time"], None)  # type: ignore[arg-type]
        if when is None or not isinstance(r["user"], str) or not isinstance(r["assistant"], str):
            raise ValueError("time, user or assistant is missing or not text")
    except (ValueError, KeyError, TypeError) as exc:
        raise HistoryError(f"{name}: line {n}: not an exported exchange ({exc})") from None
    source = f"{sid}#{number}"
    conv_id = r.get("conversation_id") or f"import:{source}"
    conv = Conversation(conv_id, "", when, session_id=sid)
    ex = Exchange(
        f"import:{source}#{exchange}", when, r["user"], r["assistant"], (number, exchange)
    )
    return conv, ex


def open_history(path: str, fmt: str | None, stdin: IO[bytes] | None = None) -> History:
    """Open `path` ('-': stdin) and tell its format; OSError if it cannot be read,
    HistoryError if it is not a history memd knows."""
    handles: list[Any] = []
    name, size = path, None
    if path == "-":
        assert stdin is not None
        raw: IO[bytes] = stdin
    elif zipfile.is_zipfile(path):
        archive = zipfile.ZipFile(path)
        handles.append(archive)
        member = _member(archive, path)
        raw, name, size = archive.open(member), f"{path}:{member.filename}", member.file_size
    else:
        raw = open(path, "rb")  # noqa: SIM115 - closed by History.close
        size = Path(path).stat().st_size
    handles.append(raw)
    stream = _Counting(raw)
    history = History(name, fmt or "", size, stream, Tally(), handles)
    try:
        _detect(history, fmt)
    except BaseException:
        history.close()
        raise
    return history


def _member(archive: zipfile.ZipFile, path: str) -> zipfile.ZipInfo:
    found = [i for i in archive.infolist() if Path(i.filename).name == EXPORT_MEMBER]
    if not found:
        raise HistoryError(
            f"{path}: a zip without {EXPORT_MEMBER} (not a ChatGPT or Claude export)"
        )
    return min(found, key=lambda i: i.filename.count("/"))


def _detect(history: History, fmt: str | None) -> None:
    """Peek at the start: JSON lines, or an array whose first conversation tells whose."""
    stream = io.BufferedReader(history.stream, 1 << 16)
    history.stream = _Counting(stream)
    history.stream.pos = 0
    head = stream.peek(64).lstrip()[:1]
    if fmt == "memd" or (fmt is None and head == b"{"):
        history.format = "memd"
        return
    if head != b"[":
        raise HistoryError(f"{history.name}: not a ChatGPT or Claude export, nor memd JSON lines")
    items = ijson.items(history.stream, "item", use_float=True)
    try:
        first = next(items, None)
    except ijson.JSONError as exc:
        raise HistoryError(
            f"{history.name}: malformed JSON in the first conversation: {_first_line(exc)}"
        ) from None
    history.first, history.items = ([first] if first is not None else []), items
    if fmt is None:
        keys = first.keys() if isinstance(first, dict) else ()
        fmt = "chatgpt" if "mapping" in keys else "claude" if "chat_messages" in keys else None
        if fmt is None and first is not None:
            raise HistoryError(
                f"{history.name}: a JSON array, but not of ChatGPT or Claude conversations"
            )
    history.format = fmt or "chatgpt"


def _first_line(exc: Exception) -> str:
    """yajl's message, without the lines that draw an arrow at a snippet of the file."""
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
