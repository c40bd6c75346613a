"""structlog configuration, done once by the entry point and nowhere else.

Repeated lines are rate-limited (`Repeats`): a flood of one failure (1,100 idle
connections once made asyncio log `socket.accept() out of system resource` with its
traceback 219,459 times, 90 MB in 45 s) must not fill the disk or hide everything else.
Per kind of line (structlog: level and event; stdlib logging: logger and message
template), `BURST` lines pass per `WINDOW` seconds; the rest are dropped and counted, and
the next line of that kind that passes says how many were (`suppressed`).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Hashable, MutableMapping
from typing import Any

import structlog

BURST = 20
WINDOW = 10.0
MAX_KINDS = 4096  # kinds tracked at once; the oldest are forgotten past that


class Repeats:
    """How many lines of each kind passed in the current window, and how many were dropped."""

    def __init__(
        self,
        burst: int = BURST,
        window: float = WINDOW,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.burst = burst
        self.window = window
        self.clock = clock
        self._kinds: dict[Hashable, list[float | int]] = {}  # kind -> [start, passed, dropped]
        self._lock = threading.Lock()

    def admit(self, kind: Hashable) -> int | None:
        """None: drop this line. Else the count of lines of its kind dropped before it."""
        now = self.clock()
        with self._lock:
            entry = self._kinds.get(kind)
            if entry is None or now - entry[0] >= self.window:
                dropped = int(entry[2]) if entry is not None else 0
                if entry is None and len(self._kinds) >= MAX_KINDS:
                    self._kinds.pop(next(iter(self._kinds)))
                self._kinds[kind] = [now, 1, 0]
                return dropped
            if entry[1] < self.burst:
                entry[1] += 1
                return 0
            entry[2] += 1
            return None


def rate_limit(repeats: Repeats) -> structlog.typing.Processor:
    """A structlog processor that drops a kind's lines past the burst (see the docstring)."""

    def processor(
        logger: Any, method: str, event_dict: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        dropped = repeats.admit((method, event_dict.get("event")))
        if dropped is None:
            raise structlog.DropEvent
        if dropped:
            event_dict["suppressed"] = dropped
        return event_dict

    return processor


class RepeatFilter(logging.Filter):
    """The same for stdlib logging (asyncio's and aiohttp's own lines)."""

    def __init__(self, repeats: Repeats) -> None:
        super().__init__()
        self.repeats = repeats

    def filter(self, record: logging.LogRecord) -> bool:
        dropped = self.repeats.admit((record.name, record.levelno, str(record.msg)))
        if dropped is None:
            return False
        if dropped:
            record.msg = f"{record.msg} [{dropped} similar lines suppressed]"
        return True


def configure_logging(level: str = "info", json_lines: bool | None = None) -> None:
    """Structured lines on stderr: JSON for journald/launchd, readable ones on a terminal."""
    if json_lines is None:
        json_lines = not sys.stderr.isatty()
    renderer: structlog.typing.Processor
    if json_lines:
        renderer = structlog.processors.JSONRenderer()
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=False)
    repeats = Repeats()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            rate_limit(repeats),
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    _stdlib(repeats)


def _stdlib(repeats: Repeats) -> None:
    """stdlib logging to stderr at WARNING, as Python's last-resort handler did, plus the
    rate limit; once per process (a second call replaces the handler)."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "memd", False):
            root.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.memd = True  # type: ignore[attr-defined]
    handler.setLevel(logging.WARNING)
    handler.addFilter(RepeatFilter(repeats))
    root.addHandler(handler)
