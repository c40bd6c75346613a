"""Generic supervised child processes: states, backoff, spawning, signalling, bounded stop."""

from __future__ import annotations

from typing import TYPE_CHECKING

from memd import public_face

if TYPE_CHECKING:
    from memd.supervision.child import Child, ChildSpec, S, StateError
    from memd.supervision.procs import (
        PopenSpawner,
        cmdline_matches,
        reap_leftovers,
        redact_argv,
        rotate_log,
    )
    from memd.supervision.states import (
        ALL_STATES,
        IDLE_STATES,
        RUNNING_STATES,
        SIGNALLABLE_STATES,
        STOPPED_STATES,
        ProcessStates,
    )
    from memd.supervision.supervisor import Supervisor

__all__ = [
    "ALL_STATES",
    "IDLE_STATES",
    "RUNNING_STATES",
    "SIGNALLABLE_STATES",
    "STOPPED_STATES",
    "Child",
    "ChildSpec",
    "PopenSpawner",
    "ProcessStates",
    "S",
    "StateError",
    "Supervisor",
    "cmdline_matches",
    "reap_leftovers",
    "redact_argv",
    "rotate_log",
]

__getattr__ = public_face(
    __name__,
    {
        "child": (
            "S",
            "StateError",
            "ChildSpec",
            "Child",
        ),
        "procs": (
            "redact_argv",
            "PopenSpawner",
            "rotate_log",
            "cmdline_matches",
            "reap_leftovers",
        ),
        "states": (
            "ProcessStates",
            "ALL_STATES",
            "RUNNING_STATES",
            "STOPPED_STATES",
            "SIGNALLABLE_STATES",
            "IDLE_STATES",
        ),
        "supervisor": ("Supervisor",),
    },
)
