"""Incremental summarisation: a base summary plus the exchanges recorded since, in bounded requests.

When the new exchanges fit into one request next to the base, that is the only request
(base + new text + the prompt). Otherwise the new text is summarised on its own with
`llm.summarize` (parts at exchange headings, combined until one is left), and one last
request folds that into the base. Either way the exchanges summarised before are never
sent again, and no prompt is longer than `max_request_chars`.
"""

from __future__ import annotations

import structlog

from memd.compaction import llm

log = structlog.get_logger()

UPDATE_PROMPT = """\
You are updating the long-term memory of a recorded conversation session between a user \
and an AI assistant ({span}). Below is the summary of the session so far, then {what} \
recorded since. In a transcript, each `## ` heading is one exchange (its time and \
number) and **User:** / **Assistant:** mark who said what.

Write one concise markdown summary of the whole session: keep every fact, decision, \
answer, name, number, date, command and code snippet of the summary so far (unless the \
new part corrects it), add what the new part brings, keep open questions, drop \
repetition. Do not invent anything. Use short `##` headings and bullet points, at most \
about {words} words.

Summary so far:
{base}

{label}:
{chunks}"""

_NEW_TEXT = ("the exchanges", "New exchanges")
_NEW_SUMMARY = ("a summary of the exchanges", "Summary of the new exchanges")
_TRUNCATED = "\n[…]"


def words_for(max_request_chars: int) -> int:
    """The length asked for, as `llm.summarize` asks it (so about four fit in a request)."""
    return max(80, min(800, max_request_chars // 24))


def update_prompt(base: str, body: str, span: str, words: int, *, summary: bool = False) -> str:
    what, label = _NEW_SUMMARY if summary else _NEW_TEXT
    # One format call with every field: text inside base or body is never parsed.
    return UPDATE_PROMPT.format(
        span=span, what=what, words=words, base=base, label=label, chunks=body
    )


async def summarize_update(
    base: str,
    text: str,
    call: llm.Complete,
    *,
    span: str,
    max_request_chars: int = llm.DEFAULT_MAX_REQUEST_CHARS,
) -> llm.Summary:
    """The base summary updated with `text` (the transcript's new part)."""
    if max_request_chars < llm.MIN_REQUEST_CHARS:
        raise ValueError(f"max_request_chars must be at least {llm.MIN_REQUEST_CHARS}")
    words = words_for(max_request_chars)
    prompt = update_prompt(base, text, span, words)
    if len(prompt) <= max_request_chars:
        return llm.Summary(
            (await call(prompt)).strip(), parts=1, requests=1, largest_request=len(prompt)
        )
    part = await llm.summarize(text, call, span=span, max_request_chars=max_request_chars)
    base, new = _fit(base, part.text, span, words, max_request_chars)
    prompt = update_prompt(base, new, span, words, summary=True)
    text_out = (await call(prompt)).strip()
    return llm.Summary(
        text_out,
        parts=part.parts,
        requests=part.requests + 1,
        largest_request=max(part.largest_request, len(prompt)),
    )


def _fit(base: str, new: str, span: str, words: int, limit: int) -> tuple[str, str]:
    """Base and new summary, shortened only if an LLM ignored the length it was asked for."""
    room = limit - len(update_prompt("", "", span, words, summary=True))
    if len(base) + len(new) <= room:
        return base, new
    log.warning("compaction.summaries_truncated", count=2)
    for_base = min(len(base), max(room // 2, room - len(new)))
    return _cut(base, for_base), _cut(new, room - for_base)


def _cut(text: str, size: int) -> str:
    return text if len(text) <= size else text[: max(0, size - len(_TRUNCATED))] + _TRUNCATED
