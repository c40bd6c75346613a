"""Shared by the supervision tests (test_supervisor_procs.py, test_zygote.py): waiting on
real processes with a bound, ticking a supervisor meanwhile, and telling a gone one."""

from __future__ import annotations

import time
from collections.abc import Callable

import psutil

from memd.supervision.supervisor import Supervisor


def wait_until(
    predicate: Callable[[], bool], timeout: float = 30.0, sup: Supervisor | None = None
) -> None:
    """Poll (ticking the supervisor) until predicate holds; a bound, not a speed check."""
    deadline = time.monotonic() + timeout
    while True:
        if sup is not None:
            sup.step()
        if predicate():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(0.02)


def gone(pid: int) -> bool:
    """Dead, or a zombie (this container's pid 1 may not reap orphans)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
