"""Record-call input: OpenAI chat messages, their chained hashes and the prefix index.

Each message gets a canonical key: role, name, tool_call_id, tool calls (arguments
re-serialised when they are JSON) and its content as text, NFC-normalised with every
whitespace run collapsed to one space. Content given as a list of parts hashes like the
same text given as a string, so a client that switches between the two forms still
matches. Images and other binary parts enter the key as a digest of their data.

The chained hash of the first k messages is `h_k = blake2b(h_{k-1} || key_k)`, so one
16-byte value names a whole prefix and prefix lookup is a dict hit (PrefixIndex).
Computing the chain is O(total bytes of the request): it reads every message once.
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from memd.errors import InvalidParams
from memd.markdown import Part, clean_text, exchange_block, label, parts_block

ROLES = ("system", "developer", "user", "assistant", "tool", "function")
PREAMBLE_ROLES = frozenset({"system", "developer"})
MAX_CONVERSATION_ID = 256
_TEXT_PARTS = frozenset({"text", "input_text", "output_text"})
_ROOT = b"\0" * 16


class InvalidRecord(InvalidParams, ValueError):
    """Unusable arguments to a record call; an InvalidParams, so JSON-RPC -32602."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message, data={"field": field})
        self.field = field


@dataclass(frozen=True, slots=True)
class Message:
    """A validated chat message: its role and hash key; `parts` renders it for the transcript.

    Rendering is deferred because only the new messages of a request are ever written,
    while every message of a long history is validated and hashed on each request.
    """

    role: str
    key: bytes
    raw: dict[str, Any]

    @property
    def parts(self) -> tuple[Part, ...]:
        return _analyse(self.raw, "message", render=True)[1]


def chain(prev: bytes, message: Message) -> bytes:
    h = hashlib.blake2b(prev, digest_size=16)
    h.update(message.key)
    return h.digest()


def chained_hashes(messages: Sequence[Message]) -> list[bytes]:
    """h_1..h_n for the prefixes of `messages`; O(n) blake2b calls over the canonical keys."""
    out: list[bytes] = []
    prev = _ROOT
    for message in messages:
        prev = chain(prev, message)
        out.append(prev)
    return out


Node = tuple[bytes, int, int, bytes | None]  # hash, conversation, exchange, parent hash
INDEX_CAPACITY = 2_000  # nodes a client keeps in memory when a store backs the index


class NodeStore(Protocol):
    """The committed nodes: what PrefixIndex asks about a hash it no longer holds."""

    def node(self, h: bytes) -> tuple[int, int] | None: ...

    def has_children(self, h: bytes) -> bool: ...


class PrefixIndex:
    """Every recorded message prefix, by chained hash -> (conversation, exchange written in).

    For a request m_1..m_n plus reply r, the longest recorded prefix k decides (k must
    reach past the leading system/developer messages, else any two chats that share a
    system prompt would merge):

    - no such k: `new` conversation; everything is written.
    - k = n and h(m_1..m_n, r) recorded: `duplicate` (a retried call); nothing is written.
    - node k is a leaf: `continuation`; m_{k+1}..m_n and r are written.
    - k = n, node k has children: `regenerated` (the same request again); only r is
      written, marked as a regenerated reply to the exchange of m_n.
    - k < n, node k has children: `edited` (the user edited or went back to an earlier
      message; `branch` when m_{k+1} is not a user message). The new messages go into
      the same conversation, marked as branching after the exchange of m_k.
    - a changed system prompt shares no prefix: `new`.

    Two chats that open with the same request cannot be told from a regenerate by a
    stateless API: they share one conversation, each continuing from its own leaf, and
    nothing is written twice. A node belongs to the conversation that wrote it last; only
    preamble nodes, which never match on their own, are ever written by two.

    Cost per request: at most n - p probes (two for a usual continuation) and O(new
    messages) to add; nothing per stored message. Memory: ~200 bytes per node kept.

    With a `store` (the committed nodes on disk), memory holds only the `capacity` nodes
    used last: a miss asks the store, and a hit there is kept again. Without one, every
    node stays in memory. Evicted nodes are long committed (capacity >> calls in flight),
    so memory and store together always know every node; a failed commit reloads both.
    """

    def __init__(
        self,
        nodes: Iterable[Node] = (),
        *,
        store: NodeStore | None = None,
        capacity: int = INDEX_CAPACITY,
    ) -> None:
        self._nodes: dict[bytes, tuple[int, int]] = {}  # oldest use first
        self._parents: dict[bytes, None] = {}  # hashes with children, oldest use first
        self._store = store
        self._capacity = max(1, capacity) if store is not None else None
        for h, conv, exchange, parent in nodes:
            self._keep(h, (conv, exchange))
            if parent is not None:
                self._keep_parent(parent)

    def __len__(self) -> int:
        """Nodes held in memory (not those only the store has)."""
        return len(self._nodes)

    def _get(self, h: bytes) -> tuple[int, int] | None:
        hit = self._nodes.get(h)
        if hit is None and self._store is not None:
            hit = self._store.node(h)
            if hit is not None:
                self._keep(h, hit)
        return hit

    def _has_children(self, h: bytes) -> bool:
        if h in self._parents:
            return True
        if self._store is not None and self._store.has_children(h):
            self._keep_parent(h)
            return True
        return False

    def _keep(self, h: bytes, value: tuple[int, int]) -> None:
        self._nodes.pop(h, None)  # re-insert: the most recently used come last
        self._nodes[h] = value
        if self._capacity is not None and len(self._nodes) > self._capacity:
            del self._nodes[next(iter(self._nodes))]

    def _keep_parent(self, h: bytes) -> None:
        self._parents.pop(h, None)
        self._parents[h] = None
        if self._capacity is not None and len(self._parents) > self._capacity:
            del self._parents[next(iter(self._parents))]

    def classify(
        self, msgs: Sequence[Message], hashes: Sequence[bytes]
    ) -> tuple[int, str, int | None, int]:
        """(k, kind, conversation key, exchange of node k) for `prepare`'s output."""
        n = len(msgs)
        for k in range(n, preamble_length(msgs), -1):
            hit = self._get(hashes[k - 1])
            if hit is None:
                continue
            conv, ref = hit
            if k == n and self._get(hashes[n]) is not None:
                return k, "duplicate", conv, ref
            if not self._has_children(hashes[k - 1]):
                return k, "continuation", conv, ref
            if k == n:
                return k, ("branch" if msgs[-1].role == "assistant" else "regenerated"), conv, ref
            return k, ("edited" if msgs[k].role == "user" else "branch"), conv, ref
        return 0, "new", None, 0

    def add(
        self, hashes: Sequence[bytes], k: int, exchanges: Sequence[int], conv: int
    ) -> list[Node]:
        """Index hashes[k:] (the new messages and the reply) under `conv`; rows to persist."""
        parent = hashes[k - 1] if k else None
        rows: list[Node] = []
        for h, exchange in zip(hashes[k:], exchanges, strict=True):
            rows.append((h, conv, exchange, parent))
            self._keep(h, (conv, exchange))
            if parent is not None:
                self._keep_parent(parent)
            parent = h
        return rows


@dataclass(frozen=True, slots=True)
class RenderPlan:
    """What `render` is asked for, decided before it runs (maybe in another thread)."""

    new: Sequence[Message]
    exchanges: int
    when: datetime
    note: str
    preamble: bool
    join_open: bool


def render(
    new: Sequence[Message],
    exchanges: int,
    when: datetime,
    note: str,
    *,
    preamble: bool,
    join_open: bool,
    title: str = "",
    index_chars: int | None = None,
) -> tuple[str, list[int], int]:
    """Markdown for new messages, one `##` exchange per user turn.

    `exchanges` is how many the conversation has so far. Returns the text, the exchange
    number of each message (for the prefix index) and the new exchange count. A new
    conversation's leading system/developer prompts go under its header (exchange 0).
    With `join_open`, leading non-user messages (tool results, a continued reply) join
    the exchange written last, so one turn stays in one chunk. `title` (the conversation's
    first user message) goes into every exchange heading. `index_chars` bounds what of
    each block is indexed (memd.markdown.overflow).
    """
    out: list[str] = []
    numbers: list[int] = []
    i = 0
    lead: list[Part] = []
    while preamble and new[i].role in PREAMBLE_ROLES:  # the reply always ends it
        lead.extend(new[i].parts)
        numbers.append(0)
        i += 1
    while join_open and i < len(new) and new[i].role != "user":
        lead.extend(new[i].parts)
        numbers.append(exchanges)
        i += 1
    if lead:
        out.append(parts_block(lead, index_chars))
    group: list[Part] = []
    talked = False
    for message in new[i:]:
        if message.role == "user" and talked:
            exchanges += 1
            out.append(exchange_block(exchanges, when, group, note, title, index_chars=index_chars))
            note, group, talked = "", [], False
        talked = talked or message.role in ("user", "assistant")
        group.extend(message.parts)
        numbers.append(exchanges + 1)
    if group:
        exchanges += 1
        out.append(exchange_block(exchanges, when, group, note, title, index_chars=index_chars))
    return "".join(out), numbers, exchanges


def first_user_text(messages: Sequence[Message]) -> str | None:
    """The text of the first user message (a conversation's title), None without one."""
    for message in messages:
        if message.role == "user":
            return " ".join(p.text for p in message.parts)
    return None


def preamble_length(messages: Sequence[Message]) -> int:
    """How many leading messages are system/developer prompts."""
    n = 0
    while n < len(messages) and messages[n].role in PREAMBLE_ROLES:
        n += 1
    return n


def prepare(messages: Any, response: Any) -> tuple[list[Message], Message, list[bytes]]:
    """Validate a record_chat call; return messages, response and h_1..h_n, h_response."""
    msgs = parse_messages(messages)
    resp = parse_response(response)
    hashes = chained_hashes(msgs)
    hashes.append(chain(hashes[-1], resp))
    return msgs, resp, hashes


def parse_messages(raw: Any) -> list[Message]:
    if not isinstance(raw, list) or not raw:
        raise InvalidRecord("messages must be a non-empty list of chat messages", "messages")
    return [parse_message(m, f"messages[{i}]") for i, m in enumerate(raw)]


def parse_response(raw: Any) -> Message:
    if isinstance(raw, dict) and "choices" in raw and "role" not in raw:
        raise InvalidRecord(
            "response must be the assistant message (choices[0].message), not the whole completion",
            "response",
        )
    if isinstance(raw, dict) and raw.get("role", "assistant") != "assistant":
        raise InvalidRecord("response.role must be 'assistant'", "response.role")
    if isinstance(raw, dict) and "role" not in raw:
        raw = {**raw, "role": "assistant"}
    return parse_message(raw, "response")


def parse_message(raw: Any, where: str) -> Message:
    if not isinstance(raw, dict):
        raise InvalidRecord(f"{where} must be an object", where)
    key = _analyse(raw, where, render=False)[0]  # checks the role first
    return Message(raw["role"], key, raw)


def _analyse(raw: dict[str, Any], where: str, *, render: bool) -> tuple[bytes, tuple[Part, ...]]:
    """Validate; the hash key, and (with `render`) the readable parts."""
    role = raw.get("role")
    if role not in ROLES:
        raise InvalidRecord(f"{where}.role must be one of {', '.join(ROLES)}", f"{where}.role")
    name = _optional_str(raw, "name", where)
    call_id = _optional_str(raw, "tool_call_id", where)
    shown, hashed = _content(raw.get("content"), f"{where}.content", render)
    calls_key, call_parts = _calls(raw, where, render) if role == "assistant" else ("", [])
    if name is None and call_id is None and not calls_key:
        head = role
    else:
        head = json.dumps([role, name, call_id, calls_key], ensure_ascii=False)
    key = (head + "\n" + _normalise(hashed)).encode("utf-8", "surrogatepass")
    if not render:
        return key, ()
    return key, tuple(_parts(role, name, call_id, shown, call_parts))


def _parts(
    role: str, name: str | None, call_id: str | None, shown: str, call_parts: list[Part]
) -> list[Part]:
    if role == "tool":
        detail = " · ".join(x for x in (name, call_id) if x)
        return [Part(label("Tool", detail), shown)]
    base = {
        "user": "User",
        "system": "System",
        "developer": "Developer",
        "assistant": "Assistant",
        "function": "Function",
    }[role]
    parts = [Part(label(base, name or ""), shown)] if shown or not call_parts else []
    return parts + call_parts


def _calls(raw: dict[str, Any], where: str, render: bool) -> tuple[str, list[Part]]:
    """Canonical key text and readable parts of an assistant's tool_calls / function_call."""
    calls = raw.get("tool_calls")
    keys: list[Any] = []
    parts: list[Part] = []
    if calls is not None:
        if not isinstance(calls, list):
            raise InvalidRecord(f"{where}.tool_calls must be a list", f"{where}.tool_calls")
        for i, call in enumerate(calls):
            at = f"{where}.tool_calls[{i}]"
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise InvalidRecord(f"{at} must have a function with a name", at)
            call_id = _optional_str(call, "id", at)
            args_key, args_shown = _arguments(
                fn.get("arguments"), f"{at}.function.arguments", render
            )
            keys.append([call_id, call.get("type", "function"), fn["name"], args_key])
            detail = " · ".join(x for x in (fn["name"], call_id) if x)
            parts.append(Part(label("Tool call", detail), args_shown))
    legacy = raw.get("function_call")
    if legacy is not None:
        if not isinstance(legacy, dict) or not isinstance(legacy.get("name"), str):
            raise InvalidRecord(f"{where}.function_call must have a name", f"{where}.function_call")
        args_key, args_shown = _arguments(legacy.get("arguments"), f"{where}.function_call", render)
        keys.append(["function_call", legacy["name"], args_key])
        parts.append(Part(label("Function call", legacy["name"]), args_shown))
    return (json.dumps(keys, ensure_ascii=False) if keys else ""), parts


def _arguments(value: Any, where: str, render: bool) -> tuple[str, str]:
    """Tool-call arguments: JSON re-serialised canonically for the key, as given for reading."""
    if value is None:
        return "", ""
    if isinstance(value, str):
        shown = clean_text(value) if render else ""
        try:
            parsed = json.loads(value)
            return _canonical(parsed), shown
        except (ValueError, RecursionError):  # not JSON, or nested too deeply: plain text
            return _normalise(value), shown
    if isinstance(value, dict | list):
        try:
            shown = clean_text(json.dumps(value, ensure_ascii=False)) if render else ""
            return _canonical(value), shown
        except RecursionError:
            raise InvalidRecord(f"{where} is nested too deeply", where) from None
    raise InvalidRecord(f"{where} must be a string or an object", where)


def _canonical(parsed: Any) -> str:
    return json.dumps(parsed, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _content(value: Any, where: str, render: bool) -> tuple[str, str]:
    """(text for the transcript if `render`, text for the hash key) of a message's content."""
    if value is None:
        return "", ""
    if isinstance(value, str):
        return (clean_text(value) if render else ""), value
    if not isinstance(value, list):
        raise InvalidRecord(f"{where} must be a string, null or a list of parts", where)
    shown: list[str] = []
    hashed: list[str] = []
    for i, part in enumerate(value):
        s, h = _content_part(part, f"{where}[{i}]", render)
        shown.append(s)
        hashed.append(h)
    return "\n".join(shown), "\n".join(hashed)


def _content_part(part: Any, where: str, render: bool) -> tuple[str, str]:
    if not isinstance(part, dict) or not isinstance(part.get("type"), str):
        raise InvalidRecord(f"{where} must be an object with a type", where)
    kind = part["type"]
    if kind in _TEXT_PARTS or kind == "refusal":
        text = part.get("refusal" if kind == "refusal" else "text")
        if not isinstance(text, str):
            raise InvalidRecord(f"{where} must carry a string", where)
        return (clean_text(text) if render else ""), text
    if kind == "image_url":
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, dict) else image
        if not isinstance(url, str):
            raise InvalidRecord(f"{where}.image_url.url must be a string", where)
        web = url.startswith(("http://", "https://")) and len(url) <= 300
        return (f"[image: {clean_text(url)}]" if web else "[image]"), f"[image {_digest(url)}]"
    if kind == "file":
        given = part.get("file")
        file = given if isinstance(given, dict) else {}
        name = file.get("filename")
        shown = f"[file: {clean_text(name)}]" if isinstance(name, str) else "[file]"
        return shown, f"[file {_digest(json.dumps(file, sort_keys=True, default=str))}]"
    body = json.dumps(part, sort_keys=True, default=str)
    return f"[{clean_text(kind)}]", f"[{kind} {_digest(body)}]"


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def _normalise(text: str) -> str:
    """Whitespace runs to one space, NFC: what a resending client may change, ignored."""
    return " ".join(unicodedata.normalize("NFC", text).split())


def _optional_str(raw: dict[str, Any], key: str, where: str) -> str | None:
    value = raw.get(key)
    if value is not None and not isinstance(value, str):
        raise InvalidRecord(f"{where}.{key} must be a string", f"{where}.{key}")
    return value


# --- the other record arguments ------------------------------------------------------------


def require_text(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise InvalidRecord(f"{field} must be a string", field)
    return clean_text(value)


def check_conversation_id(value: Any) -> str:
    """An MCP session id is opaque data (never used in a path), but it must be sane."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidRecord("conversation_id must be a non-empty string", "conversation_id")
    if len(value) > MAX_CONVERSATION_ID:
        raise InvalidRecord(
            f"conversation_id is longer than {MAX_CONVERSATION_ID} characters", "conversation_id"
        )
    if any(unicodedata.category(ch) in ("Cc", "Cs") for ch in value):
        raise InvalidRecord(
            "conversation_id must not contain control characters", "conversation_id"
        )
    return value


def parse_timestamp(value: Any) -> datetime | None:
    """ISO 8601 (for imports) as an aware UTC datetime; a time without an offset is UTC."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip() or len(value) > 64:
        raise InvalidRecord("timestamp must be an ISO 8601 string", "timestamp")
    try:
        when = datetime.fromisoformat(value.strip())
    except ValueError:
        raise InvalidRecord(f"timestamp {value!r} is not ISO 8601", "timestamp") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    try:
        return when.astimezone(UTC)
    except (OverflowError, ValueError):
        raise InvalidRecord(f"timestamp {value!r} is out of range", "timestamp") from None
