"""The method table: JSON-RPC methods onto services, through a runtime (never the daemon)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from memd import public_face

if TYPE_CHECKING:
    from memd.api.methods import build_registry

__all__ = [
    "build_registry",
]

__getattr__ = public_face(
    __name__,
    {
        "methods": ("build_registry",),
    },
)
