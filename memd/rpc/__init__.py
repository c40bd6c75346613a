"""JSON-RPC 2.0 for memd: registry, param checks, framing, dispatch, the Unix-socket server."""

from __future__ import annotations

from typing import TYPE_CHECKING

from memd import public_face

if TYPE_CHECKING:
    from memd.rpc.protocol import JsonParams, Params, Registry
    from memd.rpc.server import RpcServer, SocketSetupError

__all__ = [
    "JsonParams",
    "Params",
    "Registry",
    "RpcServer",
    "SocketSetupError",
]

__getattr__ = public_face(
    __name__,
    {
        "protocol": (
            "JsonParams",
            "Params",
            "Registry",
        ),
        "server": (
            "RpcServer",
            "SocketSetupError",
        ),
    },
)
