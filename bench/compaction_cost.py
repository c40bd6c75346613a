"""What compaction costs over a conversation's life: LLM input characters per recorded one.

    .venv/bin/python bench/compaction_cost.py [--scenario all|daily|continuous|short]
        [--days 30] [--hours 48] [--sessions 100] [--max-request-chars 24000]

Real parts throughout: memd's `ClientSessions` (transcripts, fsyncs, its state store)
wired to a `Compactor` the way the daemon wires them (end -> compaction, resume ->
restore, compacted -> mark), real files, and the fake OpenAI server of
tests/support/fake_llm.py on 127.0.0.1, which logs every prompt. Time is a settable
clock, so 30 days or 48 hours run in seconds; the monitor's `expire()` is called after
every step, and each compaction finishes before the next exchange, as it does when
exchanges are minutes apart.

Scenarios:

- daily: one conversation resumed every day (`--days`), a few exchanges each day, each
  day's session ended by inactivity;
- continuous: one conversation recording an exchange every 10 minutes for `--hours`,
  its session ended by the maximum duration (`--max-minutes`, default 8 h) and resumed
  by the next exchange;
- short: many one-off sessions (`--sessions`) of a few exchanges each.

For each it prints the total characters of every LLM prompt, the characters recorded
(the final transcripts), their ratio, and the issue #17 budget: 1.5 x recorded plus the
size of one base summary per cycle (the summary each resumed cycle starts from). It also
checks that the final summary still names every fact recorded (the fake LLM echoes each
`FACT-...` token it was shown), so a cheaper compaction cannot pass by dropping history.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from memd.compaction import Compactor
from memd.config import CompactionConfig
from memd.layout import ClientLayout
from memd.logs import configure_logging
from memd.sessions import ClientSessions
from tests.support.fake_llm import FakeLLM

T0 = 1_800_000_000.0  # 2027-01-15 08:00:00 UTC
CLIENT = "bench"
_PROSE = (
    "the deploy pipeline needs a retry on flaky network calls so we add backoff "
    "and log every attempt with its duration then check the dashboard for the p99 "
    "latency of the nightly batch which ran long because the index rebuilt twice"
)
WORDS = tuple(_PROSE.split(" "))


class Clock:
    """Epoch seconds that move only when the bench says so."""

    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@dataclass
class Result:
    """One scenario's cost."""

    name: str
    cycles: int = 0  # compactions of the scenario's sessions
    requests: int = 0
    input_chars: int = 0
    output_chars: int = 0
    recorded_chars: int = 0
    base_chars: int = 0  # Σ over resumed cycles of the summary the cycle started from
    facts_kept: bool = True
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        return self.input_chars / max(1, self.recorded_chars)

    @property
    def budget(self) -> float:
        return 1.5 * self.recorded_chars + self.base_chars


class Rig:
    """ClientSessions and a Compactor on one clock, hooked together as memd's runtime does."""

    def __init__(
        self,
        root: Path,
        fake: FakeLLM,
        clock: Clock,
        *,
        inactivity: float,
        max_minutes: float,
        max_request_chars: int,
    ) -> None:
        self.layout = ClientLayout(root, CLIENT)
        self.layout.ensure()
        self.fake = fake
        self.clock = clock
        # No caps: the bench measures cost, a deferral would only move it to a later day.
        config = CompactionConfig(
            enabled=True,
            llm_model="fake",
            base_url=fake.base_url,
            api_key="sk-bench",
            max_input_tokens_per_day=0,
            max_input_tokens_per_day_per_client=0,
        )
        self.compactor = Compactor(
            config, clock=clock, max_request_chars=max_request_chars, on_compacted=self._mark
        )
        self.sessions = ClientSessions(
            self.layout,
            inactivity_minutes=inactivity,
            max_minutes=max_minutes,
            clock=clock,
            on_end=[self.compactor.on_end_hook(self.layout)],
            on_restore=[self._restore],
        )
        self.summary_sizes: dict[str, int] = {}  # the last summary of each session
        self.base_chars = 0
        self.cycles = 0

    async def __aenter__(self) -> Rig:
        await self.compactor.start(schedule=False)
        await self.compactor.open_client(self.layout)
        await self.sessions.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.sessions.close()
        await self.compactor.close()

    async def _restore(self, info: dict[str, Any]) -> None:
        sid = info["session_id"]
        # The cycle that follows may start from this summary: the budget allows one.
        self.base_chars += self.summary_sizes.get(sid, 0)
        await self.compactor.restore(CLIENT, sid)

    async def _mark(self, client_id: str, session_id: str) -> None:
        await self.sessions.mark_compacted(session_id)

    async def say(self, conversation: str, user: str, assistant: str) -> str:
        out = await self.sessions.record_exchange(conversation, user, assistant)
        return out["session_id"]

    async def tick(self) -> None:
        """The monitor's round: end what is due, and let its compaction finish."""
        ended = await self.sessions.expire()
        await self.compactor.drain()
        for info in ended:
            sid = info["session_id"]
            summary = self.layout.summary_file(sid)
            if summary.exists():
                self.cycles += 1
                self.summary_sizes[sid] = len(summary.read_text(encoding="utf-8"))

    def recorded_chars(self) -> int:
        """Characters of every transcript as it stands (archived or live)."""
        paths = list(self.layout.archive.glob("*.md")) + [
            p for p in self.layout.sessions.glob("*.md") if not p.stem.endswith("-summary")
        ]
        return sum(len(p.read_text(encoding="utf-8")) for p in paths)

    def facts_in_summaries(self) -> set[str]:
        text = "".join(
            p.read_text(encoding="utf-8") for p in self.layout.sessions.glob("*-summary.md")
        )
        return {w for w in text.split() if w.startswith("FACT-")}


def sentence(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "."


def exchange(rng: random.Random, fact: str | None) -> tuple[str, str]:
    """About 250 characters asked and 900 answered, as a working chat goes."""
    user = sentence(rng, 40) + (f" Remember {fact}." if fact else "")
    return user, " ".join(sentence(rng, 25) for _ in range(6))


async def daily(rig: Rig, args: argparse.Namespace, rng: random.Random) -> set[str]:
    facts: set[str] = set()
    for day in range(args.days):
        rig.clock.t = T0 + day * 86_400
        for n in range(args.per_day):
            fact = f"FACT-day{day}" if n == 0 else None
            facts |= {fact} if fact else set()
            await rig.say("daily", *exchange(rng, fact))
            rig.clock.t += 120
            await rig.tick()
        rig.clock.t += (args.inactivity + 1) * 60
        await rig.tick()
    return facts


async def continuous(rig: Rig, args: argparse.Namespace, rng: random.Random) -> set[str]:
    facts: set[str] = set()
    steps = int(args.hours * 6)
    for n in range(steps):
        rig.clock.t = T0 + n * 600
        await rig.tick()
        fact = f"FACT-h{n // 6}" if n % 6 == 0 else None
        facts |= {fact} if fact else set()
        await rig.say("agent", *exchange(rng, fact))
    rig.clock.t += (args.max_minutes + 1) * 60
    await rig.tick()
    return facts


async def short(rig: Rig, args: argparse.Namespace, rng: random.Random) -> set[str]:
    facts: set[str] = set()
    for s in range(args.sessions):
        rig.clock.t = T0 + s * 4 * 3600
        for n in range(3):
            fact = f"FACT-s{s}" if n == 0 else None
            facts |= {fact} if fact else set()
            await rig.say(f"short-{s}", *exchange(rng, fact))
            rig.clock.t += 60
        rig.clock.t += (args.inactivity + 1) * 60
        await rig.tick()
    return facts


SCENARIOS: dict[str, Callable[[Rig, argparse.Namespace, random.Random], Any]] = {
    "daily": daily,
    "continuous": continuous,
    "short": short,
}


async def run(name: str, args: argparse.Namespace) -> Result:
    with tempfile.TemporaryDirectory(prefix="memd-cost-") as tmp, FakeLLM() as fake:
        t0 = time.perf_counter()
        rig = Rig(
            Path(tmp),
            fake,
            Clock(),
            inactivity=args.inactivity,
            max_minutes=args.max_minutes,
            max_request_chars=args.max_request_chars,
        )
        async with rig:
            facts = await SCENARIOS[name](rig, args, random.Random(17))
            prompts = fake.prompts()
            out = Result(
                name,
                cycles=rig.cycles,
                requests=len(prompts),
                input_chars=sum(len(p) for p in prompts),
                output_chars=sum(len(fake.summary(p)) for p in prompts),
                recorded_chars=rig.recorded_chars(),
                base_chars=rig.base_chars,
                facts_kept=facts <= rig.facts_in_summaries(),
            )
            out.extra = rig.compactor.status().get("tokens", {}).get("total", {})
        out.seconds = time.perf_counter() - t0
        return out


def report(res: Result) -> None:
    met = "yes" if res.input_chars <= res.budget else "NO"
    print(f"{res.name}: {res.cycles} compactions, {res.requests} LLM requests, {res.seconds:.1f} s")
    print(f"  recorded          {res.recorded_chars:>12,} chars")
    print(f"  LLM input         {res.input_chars:>12,} chars")
    print(f"  LLM output        {res.output_chars:>12,} chars")
    print(f"  input / recorded  {res.ratio:>12.2f}")
    print(
        f"  budget            {res.budget:>12,.0f} chars (1.5 x recorded + "
        f"{res.base_chars:,} base summary chars)  within: {met}"
    )
    print(f"  every fact in the final summaries: {'yes' if res.facts_kept else 'NO'}")
    if res.extra:  # memd's own count (the fake reports usage as ceil(chars / 4))
        print(
            f"  memd counted      {res.extra['input_tokens']:>12,} input tokens, "
            f"{res.extra['output_tokens']:,} output, {res.extra['requests']} requests "
            f"({res.extra['estimated_requests']} estimated)"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", choices=["all", *SCENARIOS], default="all")
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--per-day", type=int, default=6, help="exchanges per day (daily)")
    ap.add_argument("--hours", type=float, default=48)
    ap.add_argument("--sessions", type=int, default=100)
    ap.add_argument("--inactivity", type=float, default=180, help="minutes")
    ap.add_argument("--max-minutes", type=float, default=480)
    ap.add_argument("--max-request-chars", type=int, default=24_000)
    args = ap.parse_args()
    configure_logging("error")
    names = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    for name in names:
        report(asyncio.run(run(name, args)))


if __name__ == "__main__":
    main()
