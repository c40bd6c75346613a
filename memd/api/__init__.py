"""The method table: JSON-RPC methods onto services, through a runtime (never the daemon)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from memd import lazy_face

if TYPE_CHECKING:
    from memd.api.methods import build_registry
else:
    __getattr__ = lazy_face(__name__, __file__)
