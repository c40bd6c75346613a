"""The daemon process: wiring, signals, readiness, hot reload and the runtime in force."""

from __future__ import annotations

from typing import TYPE_CHECKING

from memd import public_face

if TYPE_CHECKING:
    from memd.daemon.process import run_daemon

__all__ = [
    "run_daemon",
]

__getattr__ = public_face(
    __name__,
    {
        "process": ("run_daemon",),
    },
)
