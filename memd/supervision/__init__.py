"""Generic supervised child processes: states, backoff, spawning, signalling, bounded stop."""

from __future__ import annotations

from typing import TYPE_CHECKING

from memd import public_face

if TYPE_CHECKING:
    from memd.supervision.child import ChildSpec
    from memd.supervision.procs import reap_leftovers
    from memd.supervision.supervisor import Supervisor

__all__ = [
    "ChildSpec",
    "Supervisor",
    "reap_leftovers",
]

__getattr__ = public_face(
    __name__,
    {
        "child": ("ChildSpec",),
        "procs": ("reap_leftovers",),
        "supervisor": ("Supervisor",),
    },
)
