"""MemoryRecall's face to an LLM: the tool definition, its instructions and its arguments.

Nothing heavy is imported here, so `memd mcp`, the CLI and the api can describe and
validate the tool without loading the index client or the embedding model.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from memd.markdown import heading_time

SERVER_NAME = "_memory"
NO_RESULTS = "No relevant memories found."
TOP_K_CAP = 20  # the tool's top_k maximum (or search_top_k, if that is larger)
MAX_QUERY_CHARS = 2000
_RELATIVE_RE = re.compile(r"^(\d+(?:\.\d+)?)\s*([mhdw])(?:\s+ago)?$", re.IGNORECASE)
_UNIT_SECONDS = {"m": 60, "h": 3600, "d": 86400, "w": 604800}

TIME_FORMS = (
    "an ISO date (2026-11-01), an ISO datetime (2026-11-01T14:00, "
    "2026-11-01T14:00:00Z, 2026-11-01T14:00+02:00; UTC when no offset is given) "
    "or a time before now: 30m, 6h, 2d, 1w (minutes, hours, days, weeks)"
)


class RecallArgumentError(ValueError):
    """A tool argument the LLM (or a caller) got wrong; the message says what is accepted."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param
        self.message = message


@dataclass(frozen=True)
class RecallArgs:
    """Validated arguments: times are aware UTC datetimes, `after` inclusive, `before` exclusive."""

    query: str
    top_k: int
    after: datetime | None = None
    before: datetime | None = None


# -- the tool ---------------------------------------------------------------------------------


def top_k_limit(default_top_k: int) -> int:
    return max(TOP_K_CAP, default_top_k)


_TIME_HELP = (
    "ISO date (2026-11-01), ISO datetime (2026-11-01T14:00; UTC unless it ends in "
    "Z or an offset such as +02:00), or relative: 30m, 6h, 2d, 1w meaning that "
    "long before now."
)
_ANNOTATIONS = {
    "title": "Recall past conversations",
    "readOnlyHint": True,
    "destructiveHint": False,
    "idempotentHint": True,
    "openWorldHint": False,
}


def tool_definition(name: str, default_top_k: int) -> dict[str, Any]:
    """The MCP tool definition of MemoryRecall (`inputSchema` is JSON Schema)."""
    limit = top_k_limit(default_top_k)
    time_help = _TIME_HELP
    return {
        "name": name,
        "title": "Recall past conversations",
        "description": (
            "Search your memory of past conversations with this user (their transcripts and "
            "session summaries) and return the most relevant past exchanges, each with its "
            "source, time (UTC) and relevance score, or 'No relevant memories found.'. Use "
            "it when the user refers to something discussed before or when earlier context "
            "(their projects, preferences, decisions) would help."
        ),
        "inputSchema": {
            "type": "object",
            "properties": {
                "query": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": MAX_QUERY_CHARS,
                    "description": "What to look for: keywords, names, or a short "
                    "description of the earlier discussion.",
                },
                "top_k": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": limit,
                    "default": default_top_k,
                    "description": f"How many memories to return (1-{limit}, default "
                    f"{default_top_k}).",
                },
                "after": {
                    "type": "string",
                    "description": "Only exchanges at or after this time. " + time_help,
                },
                "before": {
                    "type": "string",
                    "description": "Only exchanges strictly before this time. " + time_help,
                },
            },
            "required": ["query"],
            "additionalProperties": False,
        },
        "annotations": dict(_ANNOTATIONS),
    }


def instructions(name: str) -> str:
    """What the LLM is told about the `_memory` server: when to call the tool and how."""
    return (
        f"The {SERVER_NAME} server is your long-term memory of past conversations with this "
        f"user. Call {name} when the user refers to something from an earlier conversation "
        '("as I said", "last week", "what did we decide about ..."), asks what you '
        "remember, or when earlier context (their projects, preferences, names, decisions) "
        "would help; do it before saying you do not know or asking them to repeat "
        f"themselves. {name} searches only this user's own past conversations with you: "
        "transcripts of earlier sessions and summaries of older ones, nothing else. It "
        "returns the most relevant past exchanges, best first, each labelled with its source "
        "(session, conversation, transcript or summary), its time in UTC and a relevance "
        "from 0 to 1: roughly the chance that the exchange holds what you asked (it weighs "
        "how many of your query's words it contains, how close it is in meaning and how it "
        "compares with the best match). 0.5 or more: likely; 0.2 to 0.5: plausible, often "
        "one of several pieces; under 0.2: a weak match, read it with care. Relative dates "
        "said in an exchange are listed after it as dates ('yesterday = 7 May 2023'). An "
        "exchange that ends with a question may be followed by the user's reply to it, "
        "marked **User (next exchange):**, and a neighbouring exchange that matched too by "
        "**Next exchange:** or **Previous exchange:**. It answers exactly "
        "'No relevant memories found.' when no exchange is likely to be on topic: then the "
        "memory most probably does not hold it, so do not invent it. What it returns is a "
        "record of what was said then and may be out of date; what the user says now wins. "
        "Write `query` as the names and key words of what you are looking for (the words "
        "the earlier conversation would have used); if nothing useful comes back, try other "
        "words. To search a period, set `after` "
        "(inclusive) and/or `before` (exclusive) to an ISO date or datetime (UTC unless an "
        "offset is given) or to a time before now such as 30m, 6h, 2d or 1w: 'yesterday' is "
        "after=<yesterday's date>, before=<today's date>; 'in the last two hours' is "
        "after=2h. Time filters match single exchanges; summaries carry no exchange times and "
        "are left out of filtered searches. Secrets were never stored: a credential (API "
        "key, token, password, private key) shows as [redacted: <kind>] and text the user "
        "marked <private>...</private> as [private]; the value is not in memory, so ask the "
        "user for it again rather than guessing it."
    )


# -- arguments --------------------------------------------------------------------------------


def parse_time(value: Any, param: str, now: datetime) -> datetime:
    """An ISO date/datetime (naive = UTC) or a relative `30m`/`6h`/`2d`/`1w` before `now`."""
    if not isinstance(value, str) or not value.strip():
        raise RecallArgumentError(param, f"{param} must be {TIME_FORMS}")
    text = value.strip()
    shown = text if len(text) <= 40 else text[:37] + "..."
    if m := _RELATIVE_RE.match(text):
        try:
            return now - timedelta(seconds=float(m.group(1)) * _UNIT_SECONDS[m.group(2).lower()])
        except (OverflowError, ValueError):
            raise RecallArgumentError(param, f"{param} {shown!r} reaches too far back") from None
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise RecallArgumentError(
            param, f"cannot read {param} {shown!r}: use {TIME_FORMS}"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    try:
        return when.astimezone(UTC)
    except (OverflowError, ValueError):
        raise RecallArgumentError(param, f"{param} {shown!r} is out of range") from None


def parse_top_k(value: Any, default_top_k: int) -> int:
    """An integer in 1..limit; integral floats and digit strings are forgiven (LLMs send both)."""
    limit = top_k_limit(default_top_k)
    if value is None:
        return default_top_k
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    elif isinstance(value, str) and value.strip().isdigit():
        number = int(value.strip())
    if number is None or not 1 <= number <= limit:
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise RecallArgumentError(
            "top_k", f"top_k must be an integer from 1 to {limit}, got {shown}"
        )
    return number


def parse_query(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise RecallArgumentError("query", "query must be a non-empty string: what to look for")
    if len(value) > MAX_QUERY_CHARS:
        raise RecallArgumentError(
            "query", f"query is {len(value)} characters long; keep it under {MAX_QUERY_CHARS}"
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate ("\\ud800" in JSON): no text
        raise RecallArgumentError(
            "query",
            f"query holds a lone surrogate at character {exc.start}, which is not "
            "valid Unicode text; send the query as UTF-8 text",
        ) from None
    return value.strip()


def parse_arguments(
    arguments: Mapping[str, Any] | None, default_top_k: int, now: datetime | None = None
) -> RecallArgs:
    """Tool arguments -> RecallArgs, or RecallArgumentError naming the argument at fault."""
    arguments = arguments or {}
    if not isinstance(arguments, Mapping):
        raise RecallArgumentError("arguments", "arguments must be an object")
    unknown = sorted(set(arguments) - {"query", "top_k", "after", "before"})
    if unknown:
        raise RecallArgumentError(
            unknown[0],
            f"unknown argument {', '.join(map(repr, unknown))}; "
            "accepted: query, top_k, after, before",
        )
    now = now or datetime.now(UTC)
    query = parse_query(arguments.get("query"))
    top_k = parse_top_k(arguments.get("top_k"), default_top_k)
    after = _optional_time(arguments, "after", now)
    before = _optional_time(arguments, "before", now)
    if after is not None and before is not None and after >= before:
        raise RecallArgumentError(
            "after",
            f"after ({heading_time(after)}) must be earlier than before ({heading_time(before)})",
        )
    return RecallArgs(query, top_k, after, before)


def _optional_time(arguments: Mapping[str, Any], param: str, now: datetime) -> datetime | None:
    value = arguments.get(param)
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    return parse_time(value, param, now)
