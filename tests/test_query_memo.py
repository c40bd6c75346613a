"""Recall's memo of what it computes from a chunk's text (memd.indexing.query.memo): the
same answers as computing afresh, bounded, and it does not keep the texts alive."""

from __future__ import annotations

import gc
import weakref
from datetime import UTC, datetime
from threading import Thread

from memd.indexing.query import dates, ranking
from memd.indexing.query.memo import TextMemo, digest


class Text(str):
    """A str that a weak reference can follow (plain str cannot)."""


def test_a_memo_answers_as_the_function_and_computes_each_text_once() -> None:
    calls: list[str] = []

    def upper(text: str, suffix: str = "") -> str:
        calls.append(text)
        return text.upper() + suffix

    memo: TextMemo[str] = TextMemo(upper, maxsize=8)
    assert [memo("a"), memo("b"), memo("a"), memo("a", "!")] == ["A", "B", "A", "A!"]
    assert calls == ["a", "b", "a"]  # "a" again only with another extra argument
    assert (memo.hits, memo.misses, len(memo)) == (1, 3, 3)


def test_a_memo_forgets_the_least_recently_used_beyond_its_size() -> None:
    calls: list[str] = []
    memo: TextMemo[str] = TextMemo(lambda t: calls.append(t) or t, maxsize=2)
    memo("a"), memo("b"), memo("a"), memo("c")  # "b" is the least recently used
    assert len(memo) == 2
    memo("a"), memo("b")
    assert calls == ["a", "b", "c", "b"]


def test_a_memo_keeps_no_text_alive() -> None:
    """The key is the text's digest: a chunk's text is not held once recall is done
    with it (an lru_cache keyed by the text kept ~0.8 KB a chunk, issue 29)."""
    memo: TextMemo[int] = TextMemo(len, maxsize=8)
    text = Text("a chunk's text " * 50)
    gone = weakref.ref(text)
    assert memo(text) == len(text)
    del text
    gc.collect()
    assert gone() is None
    assert memo("a chunk's text " * 50) == 750 and memo.hits == 1


def test_digests_tell_texts_apart() -> None:
    texts = {f"exchange {i}" for i in range(10_000)} | {"", "é", "\ud800"}
    assert len({digest(t) for t in texts}) == len(texts)
    assert len(digest("x")) == 16


def test_threads_sharing_a_memo_get_the_functions_answers() -> None:
    memo: TextMemo[str] = TextMemo(str.upper, maxsize=64)
    wrong: list[str] = []

    def run(k: int) -> None:
        for i in range(2_000):
            text = f"t{(i * k) % 100}"
            if memo(text) != text.upper():
                wrong.append(text)

    threads = [Thread(target=run, args=(k,)) for k in (1, 3, 7, 11)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong and len(memo) <= 64


def test_recalls_memos_answer_as_computing_afresh() -> None:
    """Coverage and the dates a chunk says, remembered or not, are the same."""
    when = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)
    text = "Yesterday she was running two marathons; next Saturday another one."
    ranking._term_set.clear()
    dates._said_memo.clear()
    first = (ranking.coverage(["run", "marathon", "kayak"], text), dates.said_dates(text, when))
    again = (ranking.coverage(["run", "marathon", "kayak"], text), dates.said_dates(text, when))
    assert first == again and first[0] == 2 / 3 and len(first[1]) == 2
    assert ranking._term_set.hits == 1 and dates._said_memo.hits == 1
