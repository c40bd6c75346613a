"""Record-call input: OpenAI chat messages, their chained hashes, the prefix index, rendering.

Messages are checked and keyed in memd.sessions.messages, matched against what was
recorded before in memd.sessions.prefix; this module prepares a call and renders its new
messages, and names the pieces under the names memd has always used (`chat.PrefixIndex`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from memd.markdown import Part, exchange_block, parts_block
from memd.sessions.messages import (
    MAX_CONVERSATION_ID,
    ROLES,
    InvalidRecord,
    Message,
    check_conversation_id,
    parse_message,
    parse_messages,
    parse_response,
    parse_timestamp,
    require_text,
)
from memd.sessions.prefix import (
    INDEX_CAPACITY,
    PREAMBLE_ROLES,
    Node,
    NodeStore,
    PrefixIndex,
    chain,
    chained_hashes,
    preamble_length,
)

__all__ = [
    "INDEX_CAPACITY",
    "MAX_CONVERSATION_ID",
    "PREAMBLE_ROLES",
    "ROLES",
    "InvalidRecord",
    "Message",
    "Node",
    "NodeStore",
    "PrefixIndex",
    "RenderPlan",
    "chain",
    "chained_hashes",
    "check_conversation_id",
    "first_user_text",
    "parse_after",
    "parse_message",
    "parse_messages",
    "parse_response",
    "parse_timestamp",
    "preamble_length",
    "prepare",
    "render",
    "require_text",
]


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


def parse_after(value: Any) -> bytes | None:
    """record_chat's `after`: the `head` an earlier call returned (32 hex digits)."""
    if value is None:
        return None
    try:
        base = bytes.fromhex(value) if isinstance(value, str) else b""
    except ValueError:
        base = b""
    if len(base) != 16:
        raise InvalidRecord("after must be the `head` an earlier record_chat returned", "after")
    return base


def first_user_text(messages: Sequence[Message]) -> str | None:
    """The text of the first user message (a conversation's title), None without one."""
    for message in messages:
        if message.role == "user":
            return " ".join(p.text for p in message.parts)
    return None


def prepare(
    messages: Any, response: Any, base: bytes | None = None
) -> tuple[list[Message], Message, list[bytes]]:
    """Validate a record_chat call; return messages, response and h_1..h_n, h_response
    (chained on from `base`, the recorded prefix the messages follow, if given)."""
    msgs = parse_messages(messages)
    resp = parse_response(response)
    hashes = chained_hashes(msgs, base)
    hashes.append(chain(hashes[-1], resp))
    return msgs, resp, hashes
