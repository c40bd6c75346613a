"""JSON-RPC 2.0 for memd: registry, param checks, framing, dispatch (`protocol`), the server
(`server`), one connection (`connection`) and the socket's safe set-up (`unix_socket`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from memd import public_face

if TYPE_CHECKING:
    from memd.rpc.protocol import JsonParams, Params, Registry
    from memd.rpc.server import RpcServer
    from memd.rpc.unix_socket import SocketSetupError

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
        "server": ("RpcServer",),
        "unix_socket": ("SocketSetupError",),
    },
)
