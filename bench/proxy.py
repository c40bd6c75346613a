"""What the proxy adds: per non-streamed call, and to time to first token of a streamed one.

For each API (Chat Completions, Responses, Anthropic Messages): same run, same fake
upstream (tests/support/fake_apis.py, aiohttp on 127.0.0.1), same official SDK client
(openai, anthropic): calls straight to the upstream, then the same calls through the proxy
of a real `memd run`, for a client with memory on and recall off (every answer recorded
through memory.record_chat), one with memory off (forwarded only), and one with recall on
(the tool and instructions added; the fake does not call it). Calls alternate between the
routes so that load on the machine hits them alike. Goal: <= 5 ms p50 added without recall.

    .venv/bin/python bench/proxy.py [--calls 200] [--api chat responses messages]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import openai

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._daemon import running_daemon
from memd.cli.client import MemdClient
from memd.proxy.keys import KeyStore
from tests.support.fake_apis import FakeApis

CLIENTS = {
    "recorded": {"memory_enabled": True, "mode": "both", "inject_recall": False},
    "recall": {"memory_enabled": True, "mode": "both"},
    "off": {"memory_enabled": False, "mode": "both"},
}


def chat_plain(client: Any, i: int) -> float:
    start = time.perf_counter()
    client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": f"benchmark message number {i} about nothing"}],
    )
    return (time.perf_counter() - start) * 1000


def chat_first_token(client: Any, i: int) -> float:
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


def responses_plain(client: Any, i: int) -> float:
    start = time.perf_counter()
    client.responses.create(model="m", input=f"benchmark message number {i} about nothing")
    return (time.perf_counter() - start) * 1000


def responses_first_token(client: Any, i: int) -> float:
    start = time.perf_counter()
    stream = client.responses.create(
        model="m", input=f"streamed benchmark message {i} about nothing", stream=True
    )
    ttft = 0.0
    for event in stream:
        if not ttft and event.type == "response.output_text.delta":
            ttft = (time.perf_counter() - start) * 1000
    return ttft


def messages_plain(client: Any, i: int) -> float:
    start = time.perf_counter()
    client.messages.create(
        model="m",
        max_tokens=50,
        messages=[{"role": "user", "content": f"benchmark message number {i} about nothing"}],
    )
    return (time.perf_counter() - start) * 1000


def messages_first_token(client: Any, i: int) -> float:
    start = time.perf_counter()
    stream = client.messages.create(
        model="m",
        max_tokens=50,
        stream=True,
        messages=[{"role": "user", "content": f"streamed benchmark message {i} about nothing"}],
    )
    ttft = 0.0
    for event in stream:
        if not ttft and event.type == "content_block_delta":
            ttft = (time.perf_counter() - start) * 1000
    return ttft


Call = Callable[[Any, int], float]
APIS: dict[str, tuple[Call, Call]] = {
    "chat": (chat_plain, chat_first_token),
    "responses": (responses_plain, responses_first_token),
    "messages": (messages_plain, messages_first_token),
}


def measure(routes: dict[str, Any], call: Call, calls: int) -> dict[str, list[float]]:
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


def routes_for(api: str, upstream: FakeApis, url: str, keys: KeyStore) -> dict[str, Any]:
    """The SDK clients of one API: straight to the fake, and through the proxy per client."""

    def sdk(direct: bool, key: str) -> Any:
        if api == "messages":
            base = upstream.anthropic_url if direct else url.removesuffix("/v1")
            return anthropic.Anthropic(base_url=base, api_key=key, max_retries=0)
        base = upstream.base_url if direct else url
        return openai.OpenAI(base_url=base, api_key=key, max_retries=0)

    routes = {"direct": sdk(True, "x")}
    for cid, label in (
        ("recorded", "proxy, recorded"),
        ("off", "proxy, memory off"),
        ("recall", "proxy, recall tool on"),
    ):
        routes[label] = sdk(False, keys.ensure(cid)[0])
    return routes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--api", nargs="+", choices=list(APIS), default=list(APIS))
    args = parser.parse_args()
    with (
        FakeApis() as upstream,
        running_daemon(
            clients=CLIENTS,
            proxy={
                "listen": "127.0.0.1:0",
                "upstream_base_url": upstream.base_url,
                "anthropic_base_url": upstream.anthropic_url,
            },
        ) as memd,
    ):
        with MemdClient(memd.socket) as rpc:
            status = rpc.call("daemon.status")
        keys = KeyStore(Path(status["memory_dir"]))
        url = status["proxy"]["url"]
        for api in args.api:
            routes = routes_for(api, upstream, url, keys)
            plain, first_token = APIS[api]
            report(
                f"{api}: non-streamed call, {args.calls} calls per route",
                measure(routes, plain, args.calls),
            )
            report(
                f"{api}: streamed call, time to first token, {args.calls} calls per route",
                measure(routes, first_token, args.calls),
            )
        expected = 4 * (args.calls + 5) * len(args.api)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with MemdClient(memd.socket) as rpc:
                proxy = rpc.call("daemon.status")["proxy"]
            if proxy["recorded"] + proxy["record_failures"] >= expected:
                break
            time.sleep(0.2)
        print(
            f"\nrecorded {proxy['recorded']} exchanges of {expected}, "
            f"{proxy['record_failures']} record failures, {proxy['upstream_errors']} upstream "
            f"errors, {proxy['requests']} proxied requests"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
