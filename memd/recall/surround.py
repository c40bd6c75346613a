"""The exchanges around the best results, shown inside them while the answer stays short.

A conversation says one thing over several turns: the question before an answer, the
detail after it. LoCoMo's evidence for a question is often the exchange right before or
after one that the search found (of the evidence turns missed at recall@5 on the dev
split, about one in six sat there and was not among the top 20 hits itself). Recall
shows such a neighbour inside a result when the neighbour was a hit too
(memd.recall.shown.Neighbours); `surround` then adds the next and the previous exchange
of the results, best result first, each clipped to `SURROUND_CHARS`, as long as the
results' text stays within `[recall] context_chars` (docs/quality.md, round 5: 0.773 to
0.79 recall@5 at under 2,500 characters). An answer that is long already gets nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from memd.indexing import in_range
from memd.markdown import parse_exchange_title
from memd.recall import context
from memd.recall.files import LineCache
from memd.recall.output import Memory
from memd.recall.shown import NEXT_LABEL, PREVIOUS_LABEL, Shown, body_text

SURROUND_CHARS = 400  # of a surrounding exchange's messages (300 finds less, 500 no more)


def surround(
    memories: Sequence[Memory],
    spans: Sequence[tuple[Path, int, int]],
    shown: Shown,
    reader: LineCache,
    target: int,
    period: tuple[datetime | None, datetime | None] = (None, None),
) -> list[Memory]:
    """The memories, each with the exchange after and before it added (in that order, best
    memory first) while their contents stay within `target` characters. `spans`: each
    memory's file and 1-based line span; an exchange shown already (`shown`) or marked
    inside the memory already (a follow-up, a neighbour) is not added again, nor one
    outside the recall's `period` (its `after` and `before`)."""
    out = list(memories)
    used = sum(len(m.content) for m in out)
    if target <= 0 or used >= target:
        return out
    for i, (path, start, end) in enumerate(spans):
        lines = reader.lines(path)
        for label, span in (
            (NEXT_LABEL, context.next_exchange(lines, end)),
            (PREVIOUS_LABEL, context.previous_exchange(lines, start - 1)),
        ):
            if span is None or _marked(out[i].content, label):
                continue
            if not within(lines[span[0]], period):
                continue
            text = context.clip_words(body_text(lines[span[0] : span[1]]), SURROUND_CHARS)
            extra = f"\n\n{label} {text}"
            if not text or used + len(extra) > target:
                continue
            if not shown.add(path, span[0] + 1, span[1]):
                continue
            out[i] = dataclasses.replace(out[i], content=out[i].content + extra)
            used += len(extra)
    return out


def _marked(content: str, label: str) -> bool:
    """Whether that side of the memory is shown already (the follow-up is the next one's)."""
    return label in content or (label == NEXT_LABEL and context.FOLLOW_LABEL in content)


def within(heading: str, period: tuple[datetime | None, datetime | None]) -> bool:
    """Whether the exchange under this heading line (`## ...`) is inside a recall's time
    filter; any exchange is when the recall has none."""
    if period == (None, None):
        return True
    parsed = parse_exchange_title(heading.lstrip("#").strip())
    return parsed is not None and in_range(parsed[0], *period)
