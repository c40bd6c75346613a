"""Repeated log lines are rate-limited, and say how many were dropped (issue 24, item 7)."""

from __future__ import annotations

import json
import logging

import structlog

from memd.logs import BURST, Repeats, configure_logging


def test_a_kind_past_its_burst_is_dropped_and_counted_on_the_next_window() -> None:
    now = [0.0]
    repeats = Repeats(burst=3, window=10.0, clock=lambda: now[0])
    assert [repeats.admit("a") for _ in range(5)] == [0, 0, 0, None, None]
    assert repeats.admit("b") == 0  # another kind has its own budget
    now[0] = 10.0
    assert repeats.admit("a") == 2  # the first line of the next window tells
    assert repeats.admit("a") == 0


def test_a_flood_of_one_line_writes_a_burst_not_the_flood(capsys) -> None:
    configure_logging("info", json_lines=True)
    try:
        log = structlog.get_logger()
        for _ in range(10_000):
            log.warning("child.supervise_failed", error="EMFILE")
            logging.getLogger("asyncio").error("socket.accept() out of system resource")
        log.info("other.event")
        err = capsys.readouterr().err.splitlines()
        events = [json.loads(line)["event"] for line in err if line.startswith("{")]
        assert events.count("child.supervise_failed") == BURST
        assert sum("socket.accept()" in line for line in err) == BURST
        assert "other.event" in events
    finally:
        structlog.reset_defaults()
        logging.getLogger().handlers = [
            h for h in logging.getLogger().handlers if not getattr(h, "memd", False)
        ]
