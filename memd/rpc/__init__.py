"""JSON-RPC 2.0 for memd: registry, param checks, framing, dispatch, the Unix-socket server."""

from __future__ import annotations

from typing import TYPE_CHECKING

from memd import public_face

if TYPE_CHECKING:
    from memd.rpc.protocol import MAX_LINE, Dispatcher, JsonParams, Params, Registry, encode
    from memd.rpc.server import RpcServer, SocketInUse, SocketSetupError

__all__ = [
    "MAX_LINE",
    "Dispatcher",
    "JsonParams",
    "Params",
    "Registry",
    "RpcServer",
    "SocketInUse",
    "SocketSetupError",
    "encode",
]

__getattr__ = public_face(
    __name__,
    {
        "protocol": (
            "MAX_LINE",
            "JsonParams",
            "Registry",
            "Params",
            "encode",
            "Dispatcher",
        ),
        "server": (
            "SocketSetupError",
            "SocketInUse",
            "RpcServer",
        ),
    },
)
