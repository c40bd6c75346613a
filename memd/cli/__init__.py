"""Front ends: the `memd` command, the socket client and the stdio MCP bridge."""

from __future__ import annotations

from typing import TYPE_CHECKING

from memd import public_face

if TYPE_CHECKING:
    from memd.cli.client import ClientError, MemdClient, RemoteError, call

__all__ = [
    "ClientError",
    "MemdClient",
    "RemoteError",
    "call",
]

__getattr__ = public_face(
    __name__,
    {
        "client": (
            "ClientError",
            "RemoteError",
            "MemdClient",
            "call",
        ),
    },
)
