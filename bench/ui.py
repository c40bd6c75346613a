"""The memory browser through a real browser: time to first byte and full load, and memd's
RSS with the UI on and off.

    .venv/bin/python bench/ui.py              # 2,000-exchange conversation, 15 loads a page
    .venv/bin/python bench/ui.py --quick      # 300 exchanges, 5 loads a page

One real daemon with `[ui]` on port 0 and one client whose one conversation holds
--exchanges exchanges (0.3-1 kB each). Debian's chromium (headless, through Selenium and
/usr/bin/chromedriver) logs in with a token and loads each page --loads times; each load's
Navigation Timing gives the time to first byte (responseStart) and the full load
(loadEventEnd), from the start of the navigation. The login page (no socket call, no
transcript) is the baseline from the same run, and so are the socket calls the
conversation and search pages make, timed over the socket alone. Goal (issue 28): each
page <= 300 ms p50.

RSS: two more daemons, one with the UI off and one with it on, each given the same
workload (200 exchanges, 20 recalls; the UI-on one also serves 20 page loads over HTTP),
then `daemon.status`'s `rss_bytes`. Goal: the UI adds <= 15 MB.
"""

from __future__ import annotations

import argparse
import http.client
import random
import time
import urllib.parse
from pathlib import Path
from typing import Any

from _daemon import Connections, machine, percentile, record_burst, running_daemon, wait_searchable

from memd.ui.tokens import LoginTokens

CLIENT = "bench"
WORDS = [
    "garden",
    "shed",
    "key",
    "ferry",
    "harwich",
    "invoice",
    "budget",
    "plumber",
    "roof",
    "tiles",
    "boiler",
    "service",
    "dentist",
    "friday",
    "passport",
    "renewal",
    "spare",
    "bike",
    "lock",
    "allotment",
    "tomatoes",
    "compost",
]


def exchanges(n: int, seed: int = 7) -> list[dict[str, Any]]:
    rng = random.Random(seed)

    def text(lo: int, hi: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))

    return [
        {"conversation_id": "long", "user": text(30, 80), "assistant": text(30, 100)}
        for _ in range(n)
    ]


def settings(ui: bool) -> dict[str, Any]:
    return {
        "ui": {"enabled": ui, "listen": "127.0.0.1:0"},
        "clients": {CLIENT: {"memory_enabled": True, "mode": "both"}},
    }


def chrome() -> Any:
    from selenium import webdriver

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1100,820"):
        options.add_argument(arg)
    service = webdriver.ChromeService(executable_path="/usr/bin/chromedriver")
    return webdriver.Chrome(options=options, service=service)


def timings(driver: Any, url: str, loads: int) -> tuple[list[float], list[float]]:
    ttfb, full = [], []
    for _ in range(loads):
        driver.get(url)
        nav = driver.execute_script(
            "const n = performance.getEntriesByType('navigation')[0];"
            "return [n.responseStart - n.startTime, n.loadEventEnd - n.startTime];"
        )
        ttfb.append(nav[0])
        full.append(nav[1])
    return ttfb, full


def pages(proc: Any, n: int, loads: int) -> None:
    conns = Connections(proc)
    spent = record_burst(conns, CLIENT, [exchanges(n)])
    print(f"recorded {n} exchanges in one conversation in {spent:.1f} s")
    wait_searchable(proc, CLIENT)
    status = proc.call("daemon.status")
    base = status["ui"]["url"].rstrip("/")
    sid = proc.call("browse.conversations", {"client_id": CLIENT})["sessions"][0]["session_id"]
    token = LoginTokens(Path(status["memory_dir"])).issue()
    driver = chrome()
    try:
        driver.get(f"{base}/login?token={token}")
        last = -(-n // 50)
        rows = [
            ("login page (baseline)", "/login"),
            ("overview", "/"),
            (f"conversation, page 1 of {last}", f"/c/{CLIENT}/s/{sid}/1"),
            (f"conversation, page {last}", f"/c/{CLIENT}/s/{sid}/1?page={last}"),
            ("client (its conversations)", f"/c/{CLIENT}"),
            ("search", f"/c/{CLIENT}/search?q=spare+bike+lock+allotment"),
        ]
        print(f"\n{'page':34} {'TTFB p50':>9} {'p90':>7} {'load p50':>9} {'p90':>7}  (ms)")
        for name, path in rows:
            ttfb, full = timings(driver, base + path, loads)
            print(
                f"{name:34} {percentile(ttfb, 50):9.0f} {percentile(ttfb, 90):7.0f} "
                f"{percentile(full, 50):9.0f} {percentile(full, 90):7.0f}"
            )
        sockets = [
            (
                "socket: browse.conversation",
                "browse.conversation",
                {"client_id": CLIENT, "session_id": sid, "conversation": 1, "limit": 50},
            ),
            (
                "socket: memory.recall",
                "memory.recall",
                {"client_id": CLIENT, "query": "spare bike lock allotment"},
            ),
        ]
        for name, method, params in sockets:
            spent = []
            for _ in range(loads):
                start = time.perf_counter()
                conns.call(method, params)
                spent.append((time.perf_counter() - start) * 1000)
            print(f"{name:34} {percentile(spent, 50):9.0f} {percentile(spent, 90):7.0f}")
    finally:
        driver.quit()
        conns.close()


def rss(ui: bool) -> int:
    with running_daemon(**settings(ui)) as proc:
        conns = Connections(proc)
        record_burst(conns, CLIENT, [exchanges(200, seed=3)])
        wait_searchable(proc, CLIENT)
        for i in range(20):
            conns.call("memory.recall", {"client_id": CLIENT, "query": WORDS[i % len(WORDS)]})
        if ui:
            status = proc.call("daemon.status")
            _serve_pages(status["ui"]["url"], Path(status["memory_dir"]))
        time.sleep(1.0)
        conns.close()
        return int(proc.call("daemon.status")["rss_bytes"])


def _serve_pages(url: str, memory_dir: Path) -> None:
    parts = urllib.parse.urlsplit(url)
    token = LoginTokens(memory_dir).issue()
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port or 0, timeout=60)
    conn.request("GET", f"/login?token={token}", headers={"Host": parts.netloc})
    resp = conn.getresponse()
    resp.read()
    cookie = (resp.getheader("Set-Cookie") or "").split(";")[0]
    for i in range(20):
        path = ("/", f"/c/{CLIENT}", f"/c/{CLIENT}/search?q=garden")[i % 3]
        conn.request("GET", path, headers={"Host": parts.netloc, "Cookie": cookie})
        conn.getresponse().read()
    conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--exchanges", type=int, default=2000)
    parser.add_argument("--loads", type=int, default=15)
    args = parser.parse_args()
    n, loads = (300, 5) if args.quick else (args.exchanges, args.loads)
    print(machine())
    with running_daemon(**settings(True)) as proc:
        pages(proc, n, loads)
    off, on = rss(False), rss(True)
    print(
        f"\nmemd RSS, UI off: {off / 2**20:.1f} MB   UI on: {on / 2**20:.1f} MB   "
        f"difference: {(on - off) / 2**20:+.1f} MB"
    )
    print(f"{machine()} (at the end)")


if __name__ == "__main__":
    main()
