"""Exits seen at once: one pidfd per live child, read by the event loop (Linux >= 5.3).

With these, the supervisor need not tick to notice a child's death: the pidfd becomes
readable when the process exits, and its reader wakes `Supervisor.run()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Mapping

HAS_PIDFD = hasattr(os, "pidfd_open")


class ExitWatch:
    """The pidfds of the live children, each with `wake` as its reader (loop thread only)."""

    def __init__(self, wake: Callable[[], None]) -> None:
        self._wake = wake
        self._fds: dict[str, tuple[int, int]] = {}  # name -> (pid, pidfd)

    def follow(self, live: Mapping[str, int]) -> None:
        """Watch exactly these children ({name: pid}): new pids added, gone ones dropped."""
        self.drop({n for n, (pid, _) in self._fds.items() if live.get(n) != pid})
        loop = asyncio.get_running_loop()
        for name, pid in live.items():
            if name in self._fds:
                continue
            try:
                fd = os.pidfd_open(pid)
            except OSError:
                continue  # gone already (the next step reaps it) or not allowed
            loop.add_reader(fd, self._wake)
            self._fds[name] = (pid, fd)

    def drop(self, names: set[str] | None = None) -> None:
        """Stop watching these children (None: all of them)."""
        for name in set(self._fds) if names is None else names:
            _, fd = self._fds.pop(name)
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(fd)
            with contextlib.suppress(OSError):
                os.close(fd)
