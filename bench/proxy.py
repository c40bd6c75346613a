"""What the proxy adds: per non-streamed call, and to time to first token of a streamed one.

Same run, same fake upstream (tests/support/fake_openai.py, aiohttp on 127.0.0.1), same
openai SDK client: calls straight to the upstream, then the same calls through the proxy
of a real `memd run`, for a client with memory on and recall off (every answer recorded
through memory.record_chat), one with memory off (forwarded only), and one with recall on
(the tool and instructions added; the fake does not call it). Calls alternate between the
routes so that load on the machine hits them alike. Goal: <= 5 ms p50 added without recall.

    .venv/bin/python bench/proxy.py [--calls 200]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import openai

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._daemon import running_daemon
from memd.cli.client import MemdClient
from memd.proxy.keys import KeyStore
from tests.support.fake_openai import FakeUpstream

CLIENTS = {
    "recorded": {"memory_enabled": True, "mode": "both", "inject_recall": False},
    "recall": {"memory_enabled": True, "mode": "both"},
    "off": {"memory_enabled": False, "mode": "both"},
}


def plain(client: openai.OpenAI, i: int) -> float:
    start = time.perf_counter()
    client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": f"benchmark message number {i} about nothing"}],
    )
    return (time.perf_counter() - start) * 1000


def first_token(client: openai.OpenAI, i: int) -> float:
    start = time.perf_counter()
    stream = client.chat.completions.create(
        model="m",
        stream=True,
        messages=[{"role": "user", "content": f"streamed benchmark message {i} about nothing"}],
    )
    ttft = 0.0
    for chunk in stream:
        if not ttft and chunk.choices and chunk.choices[0].delta.content:
            ttft = (time.perf_counter() - start) * 1000
    return ttft


def measure(
    routes: dict[str, openai.OpenAI], call: Callable[[openai.OpenAI, int], float], calls: int
) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in routes}
    for client in routes.values():  # warm up connections and code paths
        for i in range(5):
            call(client, -1 - i)
    for i in range(calls):
        for name, client in routes.items():
            times[name].append(call(client, i))
    return times


def report(title: str, times: dict[str, list[float]]) -> None:
    base = statistics.median(times["direct"])
    print(f"\n{title}")
    print(f"  {'route':<24}{'p50 ms':>9}{'p90 ms':>9}{'added p50':>11}")
    for name, values in times.items():
        p50 = statistics.median(values)
        p90 = statistics.quantiles(values, n=10)[-1]
        added = "" if name == "direct" else f"{p50 - base:+.2f}"
        print(f"  {name:<24}{p50:>9.2f}{p90:>9.2f}{added:>11}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    with (
        FakeUpstream() as upstream,
        running_daemon(
            clients=CLIENTS, proxy={"listen": "127.0.0.1:0", "upstream_base_url": upstream.base_url}
        ) as memd,
    ):
        with MemdClient(memd.socket) as rpc:
            status = rpc.call("daemon.status")
        keys = KeyStore(Path(status["memory_dir"]))
        url = status["proxy"]["url"]

        def sdk(base_url: str, key: str) -> openai.OpenAI:
            return openai.OpenAI(base_url=base_url, api_key=key, max_retries=0)

        routes = {"direct": sdk(upstream.base_url, "x")}
        for cid, label in (
            ("recorded", "proxy, recorded"),
            ("off", "proxy, memory off"),
            ("recall", "proxy, recall tool on"),
        ):
            routes[label] = sdk(url, keys.ensure(cid)[0])
        report(
            f"non-streamed call, {args.calls} calls per route", measure(routes, plain, args.calls)
        )
        report(
            f"streamed call, time to first token, {args.calls} calls per route",
            measure(routes, first_token, args.calls),
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with MemdClient(memd.socket) as rpc:
                proxy = rpc.call("daemon.status")["proxy"]
            if proxy["recorded"] + proxy["record_failures"] >= 4 * (args.calls + 5):
                break
            time.sleep(0.2)
        print(
            f"\nrecorded {proxy['recorded']} exchanges of {4 * (args.calls + 5)}, "
            f"{proxy['record_failures']} record failures, {proxy['upstream_errors']} upstream "
            f"errors, {proxy['requests']} proxied requests"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
