"""Generic supervised child processes: states, backoff, spawning, signalling, bounded stop."""

from __future__ import annotations

from typing import TYPE_CHECKING

from memd import lazy_face

if TYPE_CHECKING:
    from memd.supervision.child import ChildSpec
    from memd.supervision.procs import reap_leftovers
    from memd.supervision.supervisor import Supervisor
else:
    __getattr__ = lazy_face(__name__, __file__)
