"""The daemon process: wiring, signals, readiness, hot reload and the runtime in force."""

from __future__ import annotations

from typing import TYPE_CHECKING

from memd import lazy_face

if TYPE_CHECKING:
    from memd.daemon.process import run_daemon
else:
    __getattr__ = lazy_face(__name__, __file__)
