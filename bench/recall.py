"""Recall latency at ~10k exchanges: memd's `memory.recall` against `memsearch search` + `expand`.

    .venv/bin/python bench/recall.py             # 10,000 exchanges, 200 queries
    .venv/bin/python bench/recall.py --quick     # 1,000 exchanges, 60 queries: a smoke run
    .venv/bin/python bench/recall.py --questions # LoCoMo questions, one 10k-exchange session

One client, one real daemon. The exchanges (synthetic, varied, 0.3-3 kB each, 100 per
session, `sessions.close` between sessions) are recorded through the socket in one burst
(8 calls in flight); the bench waits until the client's index holds exactly the chunks
of the files on disk and measures at once:

1. `memory.recall` right after the burst (search + expand + formatting, over the socket);
2. `memory.recall`, the queries again and again, while --during more exchanges are
   recorded into one session at --rate a second (and indexed as they come);
3. on the same data, the same queries through the `memsearch` command line the watcher
   runs (same provider, model, endpoint, Milvus URI, collection and environment, read
   from the watcher's /proc entry): `memsearch search -j` and one `memsearch expand -j`
   per result, each a new process, as an agent using memsearch's CLI would run them;
   memd's latency for those same queries is measured next to it for the ratio;
4. `memory.recall` once more, minutes after the last write (settled), for comparison.

Prints tables only; targets (p50 <= 50 ms, p99 <= 200 ms) are checked by people.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import recall_questions
from _daemon import (
    Connections,
    IndexView,
    MemsearchCli,
    lost_watch_events,
    machine,
    percentile,
    record_burst,
    running_daemon,
    wait_indexed,
    wait_searchable,
)

CLIENT = "bench"

NAMES = [
    "Amelia",
    "Bruno",
    "Chiara",
    "Dmitri",
    "Esther",
    "Farid",
    "Greta",
    "Hiroshi",
    "Ines",
    "Jonas",
    "Kamala",
    "Lukas",
    "Maren",
    "Nikolai",
    "Olga",
    "Pablo",
    "Quentin",
    "Rosa",
    "Sven",
    "Tamsin",
    "Ulrike",
    "Viktor",
    "Wanda",
    "Xavier",
    "Yusuf",
    "Zofia",
]
PLACES = [
    "Lisbon",
    "Kyoto",
    "Valparaíso",
    "Tromsø",
    "Marrakesh",
    "Ljubljana",
    "Oaxaca",
    "Tbilisi",
    "Hobart",
    "Bergen",
    "Cusco",
    "Hanoi",
    "Galway",
    "Zanzibar",
    "Porto",
    "Riga",
    "Bruges",
    "Salzburg",
    "Montréal",
    "Cádiz",
]
FOODS = [
    "lentils",
    "aubergine",
    "chickpeas",
    "miso",
    "saffron",
    "buckwheat",
    "fennel",
    "halloumi",
    "tamarind",
    "sourdough",
    "kimchi",
    "polenta",
    "cardamom",
    "quince",
]
TECH = [
    "Python",
    "Rust",
    "PostgreSQL",
    "Kubernetes",
    "Terraform",
    "React",
    "Go",
    "SQLite",
    "Nginx",
    "Redis",
    "Kafka",
    "systemd",
    "Docker",
    "TypeScript",
    "Haskell",
    "Elixir",
]
TASKS = [
    "profile a slow endpoint",
    "set up connection pooling",
    "write an integration test",
    "rotate the logs",
    "debug a memory leak",
    "add a retry with backoff",
    "migrate the schema",
    "cache the expensive query",
    "stream a large file",
    "configure TLS",
    "parse a CSV file",
    "limit the request rate",
    "handle SIGTERM",
]
HOBBIES = [
    "bouldering",
    "watercolour painting",
    "sea kayaking",
    "chess openings",
    "bird watching",
    "pottery",
    "trail running",
    "bread baking",
    "astronomy",
    "beekeeping",
    "woodworking",
    "salsa dancing",
]
THINGS = [
    "bike lock code",
    "gym locker number",
    "dentist appointment",
    "wifi password hint",
    "passport expiry",
    "library card number",
    "parking spot",
    "insurance number",
]
MONTHS = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]
FILLER = [
    "It usually helps to write down what you tried so far and what changed.",
    "Start small, measure, and only then decide whether the extra complexity pays off.",
    "Most people find the second attempt much easier once the basics are in place.",
    "Keep a short checklist; it saves time when you come back to this in a few weeks.",
    "The documentation has a good section on this, with examples for the common cases.",
    "If the weather turns, have an indoor alternative ready so the day is not lost.",
    "Budget a little more time than you think; the last step always takes longest.",
    "Ask someone who has done it before; an hour of advice can save a weekend.",
    "Write the result down somewhere you will find it again.",
    "There are trade-offs either way, and the right choice depends on your constraints.",
]


def _paragraphs(rng: random.Random, n: int) -> str:
    return "\n\n".join(" ".join(rng.sample(FILLER, 3)) for _ in range(n))


def make_exchange(rng: random.Random) -> tuple[str, str]:
    """One (user, assistant) pair on a random topic, 0.3-3 kB."""
    kind = rng.randrange(6)
    name, place, month = rng.choice(NAMES), rng.choice(PLACES), rng.choice(MONTHS)
    tech, task = rng.choice(TECH), rng.choice(TASKS)
    food, food2, hobby = rng.choice(FOODS), rng.choice(FOODS), rng.choice(HOBBIES)
    if kind == 0:
        user = f"How do I {task} in {tech}? It has bitten me twice this week."
        answer = (
            f"To {task} in {tech}, start from the smallest failing case, then add the "
            f"change step by step. In {tech} the usual tool for this is built in."
        )
    elif kind == 1:
        user = f"My friend {name} is visiting {place} in {month}. What should we do there?"
        answer = (
            f"In {place} in {month} you could go {hobby} in the morning and try the "
            f"local {food} dishes in the evening; {name} will like the old town."
        )
    elif kind == 2:
        user = f"Can you suggest a weeknight recipe with {food} and {food2}?"
        answer = (
            f"Roast the {food} with olive oil, then simmer it with the {food2}, garlic "
            f"and a squeeze of lemon for twenty minutes. Serve with rice."
        )
    elif kind == 3:
        user = f"I want to get better at {hobby} by {month}. Where do I start?"
        answer = (
            f"For {hobby}, book a beginner session, practise twice a week, and keep a "
            f"log. By {month} you will notice a real difference."
        )
    elif kind == 4:
        tech2 = rng.choice(TECH)
        user = f"What's the practical difference between {tech} and {tech2} for a small team?"
        answer = (
            f"{tech} and {tech2} overlap less than it seems: pick {tech} if you need "
            f"its ecosystem, {tech2} if the team already knows it."
        )
    else:
        thing = rng.choice(THINGS)
        value = f"{rng.randrange(1000, 99999)}-{rng.choice(PLACES).lower()}"
        user = f"Please remember that my {thing} is {value}."
        answer = f"Noted: your {thing} is {value}."
    extra = rng.choice([0, 0, 1, 1, 2, 4])
    if extra:
        answer += "\n\n" + _paragraphs(rng, extra)
    return user, answer


def make_sessions(
    n: int, per_session: int, start: datetime, span: timedelta, seed: int
) -> list[list[dict[str, Any]]]:
    """n exchanges in sessions of per_session, spread evenly over `span` from `start`."""
    rng = random.Random(seed)
    count = max(1, -(-n // per_session))
    sessions = []
    for s in range(count):
        first = start + span * s / count
        exchanges = []
        for j in range(min(per_session, n - s * per_session)):
            user, assistant = make_exchange(rng)
            exchanges.append(
                {
                    "conversation_id": f"s{s}-c{j // 10}",
                    "user": user,
                    "assistant": assistant,
                    "timestamp": (first + timedelta(minutes=2 * j)).isoformat(),
                }
            )
        sessions.append(exchanges)
    return sessions


@dataclass(frozen=True)
class Query:
    params: dict[str, Any]


def make_queries(n: int, start: datetime, span: timedelta, seed: int) -> list[Query]:
    """Keyword, question and entity queries; some with a time filter, some with top_k 10."""
    rng = random.Random(seed + 1)
    forms = [
        lambda: f"{rng.choice(TASKS)} {rng.choice(TECH)}",
        lambda: f"what did we say about {rng.choice(FOODS)} recipes",
        lambda: f"{rng.choice(NAMES)} visiting {rng.choice(PLACES)}",
        lambda: f"how to get better at {rng.choice(HOBBIES)}",
        lambda: f"my {rng.choice(THINGS)}",
        lambda: f"difference between {rng.choice(TECH)} and {rng.choice(TECH)}",
        lambda: rng.choice(PLACES),
        lambda: f"trip in {rng.choice(MONTHS)}",
        lambda: "that thing we discussed about the weather and an indoor plan",
    ]
    queries = []
    for _ in range(n):
        params: dict[str, Any] = {"query": rng.choice(forms)()}
        roll = rng.random()
        if roll < 0.1:
            params["after"] = "2w"
        elif roll < 0.2:
            lo = start + span * rng.random() * 0.8
            params["after"] = lo.strftime("%Y-%m-%dT%H:%M")
            params["before"] = (lo + timedelta(days=7)).strftime("%Y-%m-%d")
        if rng.random() < 0.1:
            params["top_k"] = 10
        queries.append(Query(params))
    return queries


# -- measuring ----------------------------------------------------------------------------


@dataclass
class Run:
    label: str
    seconds: list[float]
    chars: list[int]

    def row(self) -> str:
        ms = [s * 1000 for s in self.seconds]
        chars = f"{sum(self.chars) / len(self.chars):,.0f}" if self.chars else "–"
        return (
            f"| {self.label} | {len(ms)} | {percentile(ms, 50):.1f} | "
            f"{percentile(ms, 99):.1f} | {max(ms):.1f} | {chars} |"
        )


def measure_memd(conns: Connections, queries: Sequence[Query], label: str) -> Run:
    seconds, chars = [], []
    for q in queries:
        t0 = time.perf_counter()
        out = conns.call("memory.recall", {"client_id": CLIENT, **q.params})
        seconds.append(time.perf_counter() - t0)
        chars.append(len(out["text"]))
    return Run(label, seconds, chars)


def measure_during_writes(
    conns: Connections,
    queries: Sequence[Query],
    more: Sequence[dict[str, Any]],
    threads: int,
    rate: int,
) -> Run:
    """Queries, round after round, while `more` is recorded at `rate` exchanges a second.

    The writes come in one batch a second (`threads` in flight), so the watcher indexes
    the session file about once a second while the queries run; its 300 ms debounce
    would hold indexing back for as long as writes came more often than that.
    """
    done = threading.Event()

    def writer() -> None:
        try:
            with ThreadPoolExecutor(threads) as pool:
                for at in range(0, len(more), rate):
                    t0 = time.monotonic()
                    calls = [
                        pool.submit(
                            conns.call, "memory.record_exchange", {"client_id": CLIENT, **ex}
                        )
                        for ex in more[at : at + rate]
                    ]
                    for call in calls:
                        call.result()
                    time.sleep(max(0.0, 1.0 - (time.monotonic() - t0)))
        finally:
            done.set()

    thread = threading.Thread(target=writer)
    thread.start()
    seconds: list[float] = []
    chars: list[int] = []
    try:
        while not done.is_set():
            run = measure_memd(conns, queries[:20], "")
            seconds += run.seconds
            chars += run.chars
    finally:
        thread.join()
    return Run(f"memd `memory.recall`, during writes ({rate}/s)", seconds, chars)


def _run_cli(cli: MemsearchCli, command: str, *args: str) -> Any:
    done = subprocess.run(
        cli.argv(command, *args),
        env=cli.env,
        cwd=cli.cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0:
        raise RuntimeError(f"memsearch {command} failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout)


def measure_cli(cli: MemsearchCli, queries: Sequence[Query]) -> tuple[Run, Run]:
    """`memsearch search -j` then `memsearch expand -j` for each result, one process each.

    The CLI has no time filters: a query's after/before is left out (so it does less).
    """
    total, search_only, chars = [], [], []
    for q in queries:
        top_k = str(q.params.get("top_k", 5))
        t0 = time.perf_counter()
        hits = _run_cli(cli, "search", q.params["query"], "--top-k", top_k, "-j")
        t1 = time.perf_counter()
        text = 0
        for hit in hits:
            text += len(_run_cli(cli, "expand", hit["chunk_hash"], "-j")["content"])
        total.append(time.perf_counter() - t0)
        search_only.append(t1 - t0)
        chars.append(text)
    return (
        Run("CLI `memsearch search` + `expand` per result", total, chars),
        Run("CLI `memsearch search` alone", search_only, []),
    )


# -- main ---------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--exchanges", type=int, default=10_000)
    ap.add_argument("--per-session", type=int, default=100)
    ap.add_argument("--threads", type=int, default=8, help="record calls in flight")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument(
        "--during",
        type=int,
        default=600,
        help="exchanges recorded while the second round of queries runs",
    )
    ap.add_argument(
        "--rate", type=int, default=20, help="exchanges a second recorded during the second round"
    )
    ap.add_argument(
        "--cli-queries",
        type=int,
        default=20,
        help="queries sent through the memsearch CLI (each is 1 + top_k processes)",
    )
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="1,000 exchanges, a smoke run")
    ap.add_argument(
        "--questions",
        action="store_true",
        help="LoCoMo dev questions over its exchanges cycled into one session "
        "(bench/recall_questions.py): settled and right after --burst records",
    )
    ap.add_argument("--burst", type=int, default=200, help="records before the second round")
    ap.add_argument("--settle", type=float, default=30.0, help="seconds before the first round")
    ap.add_argument(
        "--shared-index", action="store_true", help="supervision.shared_index_server = true"
    )
    args = ap.parse_args()
    if args.questions:
        recall_questions.run(args.exchanges, args.queries, args.burst, args.settle, args.seed)
        return
    if args.quick:
        args.exchanges, args.queries, args.during, args.cli_queries = 1_000, 60, 100, 5
    now = datetime.now(UTC).replace(microsecond=0)
    span = timedelta(days=60)
    start = now - span - timedelta(days=1)
    data = make_sessions(args.exchanges, args.per_session, start, span, args.seed)
    [more] = make_sessions(
        args.during, args.during, now - timedelta(hours=12), timedelta(hours=11), args.seed + 100
    )
    queries = make_queries(args.queries, start, span, args.seed)
    print(machine())
    clients = {CLIENT: {"memory_enabled": True, "mode": "mcp_via_llm"}}
    supervision = {"shared_index_server": args.shared_index}
    with running_daemon(clients=clients, supervision=supervision) as memd:
        wait_searchable(memd, CLIENT)
        conns = Connections(memd)
        view = IndexView.of(memd, CLIENT)
        print(
            f"recording {args.exchanges} exchanges in {len(data)} sessions, "
            f"{args.threads} calls in flight ...",
            flush=True,
        )
        took = record_burst(conns, CLIENT, data, args.threads)
        print(f"  recorded in {took:.1f} s ({args.exchanges / took:,.0f} exchanges/s)", flush=True)
        chunks, lag, restarts = wait_indexed(memd, view, CLIENT)
        print(f"  index complete {lag:.1f} s after the burst: {chunks} chunks", flush=True)
        if restarts:
            print(f"  (after {restarts} watcher restart(s): the timing above includes them)")
        runs = [measure_memd(conns, queries, "memd `memory.recall`, right after the burst")]
        runs.append(measure_during_writes(conns, queries, more, args.threads, args.rate))
        chunks, lag, restarts = wait_indexed(memd, view, CLIENT)
        print(
            f"  second burst indexed {lag:.1f} s after the queries: {chunks} chunks"
            + (f" (after {restarts} watcher restart(s))" if restarts else "")
        )
        subset = queries[: args.cli_queries]
        print(f"memsearch CLI: {len(subset)} queries ...", flush=True)
        same = measure_memd(conns, subset, "memd `memory.recall`, same queries as the CLI")
        cli_total: Run | None
        cli_search: Run | None
        try:
            cli_total, cli_search = measure_cli(MemsearchCli.of_watcher(memd, CLIENT), subset)
        except (ValueError, RuntimeError) as exc:  # a forked watcher's /proc shows the zygote's
            print(f"  memsearch CLI comparison skipped: {str(exc)[-300:]}", flush=True)
            cli_total = cli_search = None
        settled = measure_memd(conns, queries, "memd `memory.recall`, settled (after the CLI runs)")
        conns.close()
        lost = lost_watch_events(memd, CLIENT)
    runs += [settled, same, *(r for r in (cli_total, cli_search) if r is not None)]
    print()
    print(
        f"{chunks} chunks ({args.exchanges + args.during} exchanges), latency in ms, "
        "chars = characters returned"
    )
    print()
    print("| path | queries | p50 | p99 | max | mean chars |")
    print("| --- | --- | --- | --- | --- | --- |")
    for run in runs:
        print(run.row())
    if cli_total is not None and cli_search is not None:
        ratio = percentile(cli_total.seconds, 50) / percentile(same.seconds, 50)
        ratio_s = percentile(cli_search.seconds, 50) / percentile(same.seconds, 50)
        print()
        print(f"CLI / memd at p50: {ratio:.0f}x (search + expand), {ratio_s:.0f}x (search alone)")
    first = [x * 1000 for x in runs[0].seconds]
    print(
        f"right after the burst, in order: queries 1-20 p50 {percentile(first[:20], 50):.1f}"
        f" max {max(first[:20]):.1f} ms; the rest p50 {percentile(first[20:], 50):.1f} "
        f"max {max(first[20:] or [0]):.1f} ms"
    )
    print(f"events dropped by memsearch watch: {lost}")
    print(f"at the end: {machine()}")


if __name__ == "__main__":
    main()
