"""Recall quality on LoCoMo (ACL 2024), through the real daemon and socket.

    .venv/bin/python bench/locomo.py                      # the five dev conversations
    .venv/bin/python bench/locomo.py --conversations 26,30  # a quick subset
    MEMD_LOCOMO_DIR=/path/to/locomo-dev .venv/bin/python bench/locomo.py

The data is not part of this repository (its licence is non-commercial): it is read at
run time from --data, $MEMD_LOCOMO_DIR, or `shared/bench/locomo-dev` next to the
checkout. The protocol is the one in that folder's README:

1. each conversation is one memd client (`mcp_via_llm`), each LoCoMo session one memd
   session (`conversation_id = "session_N"`, `timestamp` = the session's date, closed
   with `sessions.close`); a run of the first speaker's turns is the `user` side of an
   exchange, the following run of the second speaker's turns the `assistant` side, each
   line `"<speaker>: <text>"` (a shared photo appended as `[shares a photo: ...]`);
2. once indexed, every question with evidence is asked through `memory.recall` with
   top_k 5 and 10;
3. a question scores the share of its evidence turns whose text (letters and digits,
   lower-cased, first 200 characters) appears in the concatenated `content` of the
   results; recall@k is the mean, reported beside the mean length of that content;
4. the baseline, in the same run: BM25 over single turns (plain lower-cased words, no
   stemming), taking turns best first until the same mean character budget is used.

It also asks each conversation's questions against the *next* conversation's client
(other people: the answer is not there) and reports the share answered with
"No relevant memories found." (abstention), and the recall latency over the socket.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from _daemon import (
    Connections,
    IndexView,
    machine,
    record_burst,
    running_daemon,
    wait_indexed,
    wait_searchable,
)
from locomo_report import report

from memd.config import load_config
from memd.layout import ClientLayout

REPO = Path(__file__).resolve().parents[1]
DEFAULT_IDS = ("26", "30", "41", "42", "43")
_SESSION_RE = re.compile(r"^session_(\d+)$")
_WORD_RE = re.compile(r"\w+")


# -- the data -----------------------------------------------------------------------------


def data_dir(explicit: str | None) -> Path:
    """--data, $MEMD_LOCOMO_DIR, or shared/bench/locomo-dev beside the checkout."""
    candidates = [explicit, os.environ.get("MEMD_LOCOMO_DIR")]
    candidates += [str(p / "shared" / "bench" / "locomo-dev") for p in REPO.parents[:3]]
    for c in candidates:
        if c and (Path(c) / "26.json").is_file():
            return Path(c)
    sys.exit("LoCoMo dev data not found: pass --data DIR or set MEMD_LOCOMO_DIR")


@dataclass(frozen=True)
class Turn:
    dia_id: str
    speaker: str
    text: str  # with the photo caption, as recorded

    @property
    def line(self) -> str:
        return f"{self.speaker}: {self.text}"


@dataclass(frozen=True)
class Question:
    text: str
    category: int
    evidence: tuple[str, ...]  # normalised evidence texts


@dataclass
class Conversation:
    name: str
    sessions: list[tuple[int, datetime, list[Turn]]]
    questions: list[Question]

    @property
    def client_id(self) -> str:
        return f"locomo-{self.name}"

    @property
    def turns(self) -> list[Turn]:
        return [t for _, _, turns in self.sessions for t in turns]


def normalise(text: str) -> str:
    return "".join(ch for ch in text.lower() if ch.isalnum())


def turn_text(raw: dict[str, Any]) -> str:
    text = str(raw.get("text", ""))
    if raw.get("blip_caption"):
        text += f" [shares a photo: {raw['blip_caption']}]"
    return text


def load(folder: Path, name: str) -> Conversation:
    data = json.loads((folder / f"{name}.json").read_text(encoding="utf-8"))
    sessions = []
    for key, value in data.items():
        if (m := _SESSION_RE.match(key)) and value:
            when = datetime.strptime(data[f"{key}_date_time"], "%I:%M %p on %d %B, %Y")
            turns = [Turn(t["dia_id"], t["speaker"], turn_text(t)) for t in value]
            sessions.append((int(m.group(1)), when, turns))
    sessions.sort(key=lambda s: s[0])
    by_id = {t.dia_id: t for _, _, turns in sessions for t in turns}
    questions = []
    for qa in data["qa"]:
        ids = [i.strip() for e in qa.get("evidence") or [] for i in str(e).split(";")]
        texts = tuple(normalise(by_id[i].text)[:200] for i in ids if i in by_id)
        if texts:
            questions.append(Question(str(qa["question"]), int(qa["category"]), texts))
    conv = Conversation(name, sessions, questions)
    conv.speakers = (data["speaker_a"], data["speaker_b"])  # type: ignore[attr-defined]
    return conv


def exchanges(conv: Conversation) -> list[list[dict[str, Any]]]:
    """Per session, its exchanges: a run of speaker A's turns, then a run of speaker B's."""
    speaker_a = conv.speakers[0]  # type: ignore[attr-defined]
    out = []
    for number, when, turns in conv.sessions:
        pairs: list[dict[str, Any]] = []
        user: list[str] = []
        assistant: list[str] = []
        for turn in turns:
            if turn.speaker == speaker_a and assistant:
                pairs.append(_exchange(number, when, user, assistant))
                user, assistant = [], []
            (user if turn.speaker == speaker_a else assistant).append(turn.line)
        if user or assistant:
            pairs.append(_exchange(number, when, user, assistant))
        out.append(pairs)
    return out


def _exchange(number: int, when: datetime, user: list[str], assistant: list[str]) -> dict:
    return {
        "conversation_id": f"session_{number}",
        "user": "\n".join(user),
        "assistant": "\n".join(assistant),
        "timestamp": when.isoformat(),
    }


# -- the baseline: BM25 over single turns -------------------------------------------------


class TurnBM25:
    """Okapi BM25 (k1 1.2, b 0.75) over lower-cased word tokens of single turns."""

    def __init__(self, turns: Sequence[Turn], k1: float = 1.2, b: float = 0.75) -> None:
        self.turns = list(turns)
        self.docs = [Counter(_WORD_RE.findall(t.line.lower())) for t in self.turns]
        self.lengths = [sum(d.values()) for d in self.docs]
        self.avgdl = sum(self.lengths) / max(len(self.docs), 1)
        df: Counter[str] = Counter(w for d in self.docs for w in d)
        n = len(self.docs)
        self.idf = {w: math.log(1 + (n - f + 0.5) / (f + 0.5)) for w, f in df.items()}
        self.k1, self.b = k1, b

    def ranked(self, query: str) -> list[Turn]:
        terms = [w for w in _WORD_RE.findall(query.lower()) if w in self.idf]
        scores = []
        for i, doc in enumerate(self.docs):
            norm = self.k1 * (1 - self.b + self.b * self.lengths[i] / self.avgdl)
            s = sum(
                self.idf[w] * doc[w] * (self.k1 + 1) / (doc[w] + norm) for w in terms if w in doc
            )
            scores.append((s, -i))
        order = sorted(range(len(scores)), key=lambda i: scores[i], reverse=True)
        return [self.turns[i] for i in order]

    def content(self, query: str, budget: float) -> str:
        """Turns best first while they fit in `budget` characters (the first always)."""
        picked: list[str] = []
        used = 0
        for turn in self.ranked(query):
            if picked and used + len(turn.line) > budget:
                break
            picked.append(turn.line)
            used += len(turn.line) + 1
        return "\n".join(picked)


def score(question: Question, content: str) -> float:
    found = normalise(content)
    return sum(e in found for e in question.evidence) / len(question.evidence)


# -- running it -----------------------------------------------------------------------------


@dataclass
class Tally:
    """Scores of one conversation's questions at one top_k."""

    scores: list[float] = field(default_factory=list)
    chars: list[int] = field(default_factory=list)
    categories: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    contents: list[str] = field(default_factory=list)
    questions: list[Question] = field(default_factory=list)
    results: list[list[dict[str, Any]]] = field(default_factory=list)


def ask(conns: Connections, client_id: str, questions: Sequence[Question], top_k: int) -> Tally:
    out = Tally()
    for q in questions:
        start = time.perf_counter()
        found = conns.call(
            "memory.recall", {"client_id": client_id, "query": q.text, "top_k": top_k}
        )
        out.seconds.append(time.perf_counter() - start)
        content = "\n".join(r["content"] for r in found["results"])
        out.scores.append(score(q, content))
        out.chars.append(len(content))
        out.categories.append(q.category)
        out.contents.append(found["text"])
        out.questions.append(q)
        out.results.append(found["results"])
    return out


def ingest(memd: Any, conns: Connections, conv: Conversation) -> int:
    """Record the conversation (unless a reused folder holds it already), wait until indexed."""
    wait_searchable(memd, conv.client_id)
    sessions = ClientLayout(load_config(memd.config_path).memory_dir, conv.client_id).sessions
    if not any(sessions.glob("*.md")):
        record_burst(conns, conv.client_id, exchanges(conv), threads=1)  # in order
    chunks, _, _ = wait_indexed(
        memd, IndexView.of(memd, conv.client_id), conv.client_id, progress=False
    )
    return chunks


_BM25_CACHE: dict[str, TurnBM25] = {}


def _bm25s(convs: Sequence[Conversation]) -> list[tuple[Conversation, TurnBM25]]:
    for c in convs:
        if c.name not in _BM25_CACHE:
            _BM25_CACHE[c.name] = TurnBM25(c.turns)
    return [(c, _BM25_CACHE[c.name]) for c in convs]


def main() -> None:
    args = arguments()
    folder = data_dir(args.data)
    convs = [load(folder, name.strip()) for name in args.conversations.split(",") if name]
    extra = {k: json.loads(v) for k, v in (item.split("=", 1) for item in args.config)}
    print(machine())
    print(f"data: {folder}; conversations {', '.join(c.name for c in convs)}")
    clients = {c.client_id: {"memory_enabled": True, "mode": "mcp_via_llm"} for c in convs}
    keep = Path(args.reuse) if args.reuse else None
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
    with running_daemon(keep, clients=clients, **extra) as memd:
        conns = Connections(memd)
        start = time.monotonic()
        with ThreadPoolExecutor(len(convs)) as pool:
            chunks = sum(pool.map(lambda c: ingest(memd, conns, c), convs))
        seconds = time.monotonic() - start
        runs = {k: [ask(conns, c.client_id, c.questions, k) for c in convs] for k in (5, 10)}
        cross = (
            []
            if args.no_cross or len(convs) < 2
            else [
                ask(conns, convs[(i + 1) % len(convs)].client_id, c.questions, 5)
                for i, c in enumerate(convs)
            ]
        )
        conns.close()
    bm25_only = bm25_run(keep, clients, extra, convs) if args.bm25_only and keep else None
    summary = report(
        convs, _bm25s(convs), runs, cross, chunks, seconds, args.label, bm25_only, score
    )
    print(f"at the end: {machine()}")
    if args.dump:
        dump(Path(args.dump), convs, runs, cross)
    if args.json:
        with open(args.json, "a", encoding="utf-8") as out:
            out.write(json.dumps(summary) + "\n")


def bm25_run(
    keep: Path, clients: dict[str, Any], extra: dict[str, Any], convs: Sequence[Conversation]
) -> dict[int, list[Tally]]:
    """The same questions on the same index, served with BM25 alone (`bm25_weight` 1)."""
    recall = {**extra.get("recall", {}), "bm25_weight": 1.0}
    with running_daemon(keep, clients=clients, **{**extra, "recall": recall}) as memd:
        conns = Connections(memd)
        for conv in convs:
            wait_searchable(memd, conv.client_id)
        runs = {k: [ask(conns, c.client_id, c.questions, k) for c in convs] for k in (5, 10)}
        conns.close()
    return runs


def dump(
    path: Path, convs: Sequence[Conversation], runs: dict[int, list[Tally]], cross: list[Tally]
) -> None:
    """Every question's top-5 results (own memory and the next client's), as JSON lines."""
    with path.open("w", encoding="utf-8") as out:
        for i, (conv, tally) in enumerate(zip(convs, runs[5], strict=True)):
            other = cross[i] if cross else None
            for j, q in enumerate(tally.questions):
                row = {
                    "conversation": conv.name,
                    "question": q.text,
                    "category": q.category,
                    "evidence": q.evidence,
                    "score": tally.scores[j],
                    "score10": runs[10][i].scores[j],
                    "results": tally.results[j],
                    "cross": other.results[j] if other else None,
                }
                out.write(json.dumps(row) + "\n")


def arguments() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", help="folder with the dev conversations (26.json, ...)")
    ap.add_argument(
        "--conversations",
        default=",".join(DEFAULT_IDS),
        help="comma-separated conversation names (default: all five)",
    )
    ap.add_argument("--no-cross", action="store_true", help="skip the abstention run")
    ap.add_argument("--label", default="memd", help="name of this run in --json output")
    ap.add_argument("--json", help="append the headline figures as one JSON line here")
    ap.add_argument("--dump", help="write every question's results here (JSON lines)")
    ap.add_argument(
        "--reuse",
        metavar="DIR",
        help="run memd in DIR and keep it; a client whose transcripts are there already "
        "is not recorded again (only indexed), so a second run asks at once",
    )
    ap.add_argument(
        "--bm25-only",
        action="store_true",
        help="also ask every question with BM25 alone (bm25_weight 1) on the same index "
        "(a second daemon on the same folder; needs --reuse)",
    )
    ap.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="KEY=JSON",
        help="extra memd config (top-level key = JSON value), e.g. "
        "'recall={\"min_score\": 0.3}'; may be repeated",
    )
    return ap.parse_args()


if __name__ == "__main__":
    main()
