"""Session transcript files: the markdown layout, escaping, durable appends, archive, restore.

A session file reads like this (every block ends with one blank line)::

    ---
    client_id: laptop
    session_id: 2026-11-30T02-41-07Z-3f9a
    started: 2026-11-30T02:41:07Z
    ---

    # Conversation 1 (2026-11-30 02:41:07 UTC)

    **System:** a preamble (system/developer prompt) sits under the conversation header

    ## 2026-11-30 02:41:07 UTC · exchange 1 — How do I rotate the API keys?

    **User:** How do I rotate the API keys?

    **Assistant:** the answer

The layout is shaped by memsearch's chunker, which splits only at lines matching
`^#{1,6}\\s` and then by size: one `##` heading per exchange keeps a question and its
answer in one chunk (measured: 62% evidence recall@5 against 46% with separate
`## User` / `## Assistant` headings), and the date in the heading is searchable by
BM25. Every exchange heading ends with the conversation's title (its first user message,
cut to 70 characters) after ` — `, so a follow-up question that never names its topic is
still found by it (bench/quality.py: evidence recall@5 67% without, about 90% with). A
note such as `regenerated reply to exchange 2` sits between the number and the title,
after ` · `; notes never contain ` — `.
A conversation that comes back after another one was written gets its header again
(`# Conversation 1 (..., continued)`); header-only sections carry no text and the
chunker drops them, so repeats cost nothing in the index.

Message text may contain anything. So that it can neither split a chunk nor pass for
structure, a message line that starts with `#`, `---` or a role marker such as
`**User` gets one extra leading backslash (also when it already starts with
backslashes), which `unescape_text` removes again: the round trip is exact. Line breaks
are the one thing normalised: `\\r\\n`, `\\r` and the other separators that
`str.splitlines` honours become `\\n`, because the chunker numbers lines with
`split("\\n")` while memsearch's expand uses `splitlines()`; mixed separators would make
them disagree about where a section starts.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import secrets
import stat
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import structlog

from memd import trust
from memd.layout import ClientLayout

log = structlog.get_logger()

HEADING_TIME = "%Y-%m-%d %H:%M:%S UTC"
SESSION_ID_RE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d-\d\d-\d\dZ-[0-9a-f]{4}$")
TAIL_BYTES = 64

# Longest alternatives first: "Tool call" must win over "Tool".
_LABELS = "Tool call|Function call|User|Assistant|System|Developer|Tool|Function"
_ROLE_WORDS = "User|Assistant|System|Developer|Tool|Function"
_BREAK_CHARS = "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
_BREAKS_RE = re.compile("\r\n|[\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")
_STRUCTURAL = rf"\\*(?:#|---|\*\*(?:{_ROLE_WORDS})\b)"
_ESCAPE_RE = re.compile(rf"^(?={_STRUCTURAL})", re.MULTILINE)
_UNESCAPE_RE = re.compile(rf"^\\(?={_STRUCTURAL})", re.MULTILINE)
_CONV_RE = re.compile(r"^# Conversation (\d+) \((.*)\)$")
_EXCHANGE_TITLE_RE = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC) · exchange (\d+)(?: · (.+?))?(?: — (.*))?$"
)
TITLE_SEP = " — "
TITLE_CHARS = 70
TITLE_SCAN = 4096  # characters of a message a title or label is made from
_MARKER_RE = re.compile(rf"^\*\*((?:{_LABELS})(?: \([^*\n]*\))?):\*\*(?: |$)")
_PLAIN_VALUE_RE = re.compile(r"^[A-Za-z0-9_.:+-]*$")


@dataclass(frozen=True, slots=True)
class Part:
    """One message as written: a role label (`User`, `Tool call (f · id)`, ...) and its text."""

    label: str
    text: str


@dataclass
class ParsedExchange:
    number: int
    when: datetime
    note: str
    parts: list[Part] = field(default_factory=list)
    title: str = ""


@dataclass
class ParsedConversation:
    number: int
    info: str  # what the header says in parentheses: time, "continued ..."
    preamble: list[Part] = field(default_factory=list)
    exchanges: list[ParsedExchange] = field(default_factory=list)


@dataclass
class ParsedTranscript:
    meta: dict[str, str]
    conversations: list[ParsedConversation]


# --- text --------------------------------------------------------------------------------


def clean_text(text: str) -> str:
    """Make text safe to write: one kind of line break, no lone surrogates (invalid UTF-8)."""
    # `in` scans at memchr speed; the regex took 0.75 s over 8 MiB on the event loop.
    if any(ch in text for ch in _BREAK_CHARS):
        text = _sub_in_pieces(_BREAKS_RE, "\n", text)
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def escape_text(text: str) -> str:
    """Demote lines that would read as structure (headings, fences, role markers)."""
    return _sub_in_pieces(_ESCAPE_RE, "\\", text)


SUB_CHUNK = 64 * 1024
_LOOKAHEAD = 256  # characters past a piece a match that starts in it may look at


def _sub_in_pieces(pattern: re.Pattern[str], literal: str, text: str) -> str:
    """`pattern.sub` with a literal replacement, in pieces of SUB_CHUNK characters.

    One `re.sub` never lets go of the GIL: over 8 MiB it held every other thread, the
    event loop included, for most of a second even when run in a worker thread. Here the
    matching runs per piece (`finditer` with pos/endpos keeps `^` true to real line
    starts), so the interpreter can switch threads between pieces.
    """
    if len(text) <= SUB_CHUNK:
        return pattern.sub(literal.replace("\\", "\\\\"), text)
    out: list[str] = []
    last = pos = 0
    size = len(text)
    while pos < size:
        end = min(size, pos + SUB_CHUNK)
        for m in pattern.finditer(text, pos, min(size, end + _LOOKAHEAD)):
            if m.start() >= end:
                break
            out += (text[last : m.start()], literal)
            last = m.end()
        pos = max(end, last)
    out.append(text[last:])
    return "".join(out)


def unescape_text(text: str) -> str:
    """Exact inverse of `escape_text`."""
    return _UNESCAPE_RE.sub("", text)


def label(base: str, detail: str = "") -> str:
    """A part label; the detail (tool name, call id, user name) is made single-line and safe."""
    detail = "".join(
        " " if unicodedata.category(ch)[0] in "CZ" else ch
        for ch in detail[:TITLE_SCAN].replace("*", "").replace("(", "[").replace(")", "]")
    )
    detail = " ".join(detail.split())[:80]
    return f"{base} ({detail})" if detail else base


# --- rendering -----------------------------------------------------------------------------


def new_session_id(started: float) -> str:
    """Sortable by start time, readable, filename-safe: `2026-11-30T02-41-07Z-3f9a`."""
    stamp = datetime.fromtimestamp(started, UTC).strftime("%Y-%m-%dT%H-%M-%SZ")
    return f"{stamp}-{secrets.token_hex(2)}"


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def heading_time(when: datetime) -> str:
    # The year by hand: strftime's %Y gives "999", not "0999", for years before 1000 on
    # glibc, and headings must read back (strptime and the heading pattern want 4 digits).
    when = when.astimezone(UTC)
    return f"{when.year:04d}-" + when.strftime(HEADING_TIME.removeprefix("%Y-"))


def front_matter(client_id: str, session_id: str, started: float) -> str:
    cid = client_id if _PLAIN_VALUE_RE.match(client_id) else json.dumps(client_id)
    return f"---\nclient_id: {cid}\nsession_id: {session_id}\nstarted: {iso(started)}\n---\n\n"


def conversation_header(number: int, when: datetime, note: str = "") -> str:
    info = heading_time(when) + (f", {note}" if note else "")
    return f"# Conversation {number} ({info})\n\n"


def parts_block(parts: Sequence[Part]) -> str:
    return "".join(f"**{p.label}:** {escape_text(p.text)}\n\n" for p in parts)


def conversation_title(text: str) -> str:
    """A conversation's title from its first user message: one line, at most 70 characters.

    Whitespace and control characters collapse to single spaces, so the title can never
    end the heading line; a longer text is cut at a word boundary and ends with `…`. Only
    the first TITLE_SCAN characters are looked at, so the cost does not grow with the
    message (a title of nothing but whitespace in them is empty).
    """
    text = text[:TITLE_SCAN]  # bounded by what is kept: 3 s on the event loop for 8 MiB
    text = "".join(" " if unicodedata.category(ch)[0] in "CZ" else ch for ch in text)
    text = " ".join(text.split())
    if len(text) <= TITLE_CHARS:
        return text
    cut = text[:TITLE_CHARS]
    if text[TITLE_CHARS] != " " and " " in cut:
        cut = cut[: cut.rindex(" ")]
    cut = cut.rstrip()
    if len(cut) >= TITLE_CHARS:
        cut = cut[: TITLE_CHARS - 1].rstrip()
    return cut + "…"


def exchange_block(
    number: int,
    when: datetime,
    parts: Sequence[Part],
    note: str = "",
    title: str = "",
    body: str | None = None,
) -> str:
    """One exchange under its own `##` heading, so question and answer share a chunk.

    The heading carries the conversation's title (made safe with `conversation_title`)
    so that follow-up questions are found by the conversation's topic. `body` is
    `parts_block(parts)` made beforehand (off the event loop, for a big exchange).
    """
    heading = f"{heading_time(when)} · exchange {number}" + (f" · {note}" if note else "")
    title = conversation_title(title)
    if title:
        heading += TITLE_SEP + title
    return f"## {heading}\n\n" + (parts_block(parts) if body is None else body)


# --- parsing -------------------------------------------------------------------------------


def parse_exchange_title(title: str) -> tuple[datetime, int, str] | None:
    """Time, number and note of an exchange heading (chunker heading text, without `## `).

    Recall uses this to filter by time with the precision of one exchange.
    """
    parsed = parse_exchange_heading(title)
    return parsed[:3] if parsed else None


def parse_exchange_heading(title: str) -> tuple[datetime, int, str, str] | None:
    """Time, number, note and conversation title of an exchange heading (without `## `)."""
    m = _EXCHANGE_TITLE_RE.match(title)
    if not m:
        return None
    when = datetime.strptime(m.group(1), HEADING_TIME).replace(tzinfo=UTC)
    return when, int(m.group(2)), m.group(3) or "", m.group(4) or ""


def parse_transcript(text: str) -> ParsedTranscript:
    """Read a session file back into conversations, exchanges and exact message texts.

    Lenient about lines it does not know (a person may have edited the file): they stay
    part of the message text around them. Exchanges before any conversation header land
    in a conversation numbered 0.
    """
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    meta, start = _parse_front_matter(lines)
    convs: list[ParsedConversation] = []
    exchange: ParsedExchange | None = None
    part: tuple[str, list[str], list[Part]] | None = None

    def flush() -> None:
        nonlocal part
        if part is not None:
            name, body, target = part
            if body and body[-1] == "":
                body.pop()  # the blank separator line after every part
            target.append(Part(name, unescape_text("\n".join(body))))
            part = None

    def conversation() -> ParsedConversation:
        if not convs:
            convs.append(ParsedConversation(0, ""))
        return convs[-1]

    for line in lines[start:]:
        if m := _CONV_RE.match(line):
            flush()
            convs.append(ParsedConversation(int(m.group(1)), m.group(2)))
            exchange = None
        elif line.startswith("## ") and (parsed := parse_exchange_heading(line[3:])):
            flush()
            exchange = ParsedExchange(parsed[1], parsed[0], parsed[2], title=parsed[3])
            conversation().exchanges.append(exchange)
        elif m := _MARKER_RE.match(line):
            flush()
            target = exchange.parts if exchange else conversation().preamble
            part = (m.group(1), [line[m.end() :]], target)
        elif part is not None:
            part[1].append(line)
    flush()
    return ParsedTranscript(meta, convs)


def _parse_front_matter(lines: list[str]) -> tuple[dict[str, str], int]:
    if not lines or lines[0] != "---":
        return {}, 0
    meta: dict[str, str] = {}
    for i in range(1, len(lines)):
        if lines[i] == "---":
            return meta, i + 1
        key, _, value = lines[i].partition(":")
        value = value.strip()
        if value.startswith('"'):
            with contextlib.suppress(ValueError):
                value = json.loads(value)
        meta[key.strip()] = value
    return meta, len(lines)


def read_transcript(path: Path) -> ParsedTranscript:
    return parse_transcript(path.read_bytes().decode("utf-8", "replace"))


# --- files ---------------------------------------------------------------------------------


def tail_digest(data: bytes) -> bytes:
    """Fingerprint of the last committed bytes, to tell our own unacknowledged tail from edits."""
    return hashlib.blake2b(data[-TAIL_BYTES:], digest_size=16).digest()


class AppendFile:
    """A transcript opened for appending; every append is fsynced before it returns.

    Not thread-safe: one owner (the client's writer thread) appends. If the path stops
    naming the file we hold open (the user deleted it, or an editor saved by rename),
    the next append reopens the path, so new exchanges never go to an unlinked inode.
    A file that is missing is created again with `header` (the front matter) first.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self._ino: tuple[int, int] | None = None

    def append(self, data: bytes, header: bytes) -> tuple[int, bytes]:
        """Append, fsync, and return the new size and the digest of the file's new tail."""
        fd, created = self._open()
        if created:
            data = header + data
        _write_all(fd, data)
        os.fdatasync(fd)
        if created:
            fsync_dir(self.path.parent)
        size = os.fstat(fd).st_size
        if len(data) >= TAIL_BYTES:
            return size, tail_digest(data)
        return size, tail_digest(os.pread(fd, TAIL_BYTES, max(0, size - TAIL_BYTES)))

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = self._ino = None

    def _open(self) -> tuple[int, bool]:
        try:
            st = os.lstat(self.path)  # a symlink is not our file: never followed (memd.trust)
        except FileNotFoundError:
            st = None
        if self._fd is not None and st is not None and (st.st_dev, st.st_ino) == self._ino:
            return self._fd, False
        if self._fd is not None:
            log.warning("transcript.replaced_reopened", path=str(self.path))
        self.close()
        flags = os.O_RDWR | os.O_APPEND  # read: the tail digest
        if st is None:
            fd = trust.open_nofollow(self.path, flags | os.O_CREAT | os.O_EXCL, 0o600)
        else:
            fd = trust.open_nofollow(self.path, flags | os.O_NONBLOCK)  # a FIFO must not hang
        fst = os.fstat(fd)
        if not stat.S_ISREG(fst.st_mode) or fst.st_uid != os.geteuid():
            os.close(fd)
            raise trust.UntrustedPath(
                self.path,
                "is not a regular file of memd's uid",
                f"move it away: `mv {self.path} {self.path}.old`",
            )
        self._fd, self._ino = fd, (fst.st_dev, fst.st_ino)
        return fd, st is None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def fsync_dir(path: Path) -> None:
    """Make a created, removed or renamed entry durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def reconcile(path: Path, committed: int, digest: bytes | None) -> str:
    """Cut a transcript back to what the state committed, after a crash between the two.

    Bytes past `committed` were written but never acknowledged (the process died before
    the state commit). They are removed only if the committed part still ends with the
    bytes the state remembers and the extra part starts like one of our blocks (a header,
    an exchange, or a message joining the open exchange); anything else is a person's
    edit and is left alone. Returns what was done.
    """
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return "missing"
    if size == committed:
        return "ok"
    if size < committed:
        log.warning(
            "transcript.shorter_than_recorded", path=str(path), size=size, committed=committed
        )
        return "shorter"
    with open(path, "rb") as fh:
        fh.seek(max(0, committed - TAIL_BYTES))
        before = fh.read(committed - max(0, committed - TAIL_BYTES))
        extra = fh.read(16)
    ours = extra.startswith((b"# Conversation ", b"## ", b"**"))  # header, exchange, part
    if not ours or digest is None or tail_digest(before) != digest:
        log.warning("transcript.edited_kept", path=str(path), size=size, committed=committed)
        return "edited"
    with open(path, "r+b") as fh:
        fh.truncate(committed)
        os.fsync(fh.fileno())
    log.info("transcript.tail_removed", path=str(path), removed=size - committed)
    return "truncated"


def is_orphan(path: Path, client_id: str) -> bool:
    """A session file memd created whose first commit never happened (front matter is ours)."""
    if not SESSION_ID_RE.match(path.stem):
        return False
    with open(path, "rb") as fh:
        head = fh.read(512).decode("utf-8", "replace")
    meta, _ = _parse_front_matter(head.split("\n"))
    return meta.get("session_id") == path.stem and meta.get("client_id") == client_id


def restore(layout: ClientLayout, session_id: str) -> Path:
    """Move an archived transcript back into sessions/ (memsearch indexes it again)."""
    return _move(layout.archive_file(session_id), layout.session_file(session_id))


def _move(src: Path, dst: Path) -> Path:
    """Move a transcript between trusted folders: both real folders of ours, the source a
    regular file and the target no symlink (rename replaces a link, but the link's
    presence means someone else's hand was there)."""
    trust.ensure_dir(dst.parent)
    trust.check_dir(src.parent)
    if not trust.check_file(src, tighten=False):
        raise FileNotFoundError(errno.ENOENT, "no such transcript", str(src))
    trust.check_file(dst, tighten=False)
    os.replace(src, dst)
    fsync_dir(dst.parent)
    fsync_dir(src.parent)
    return dst
