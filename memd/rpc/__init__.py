"""JSON-RPC 2.0 for memd: registry, param checks, framing, dispatch (`protocol`), the server
(`server`), one connection (`connection`) and the socket's safe set-up (`unix_socket`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from memd import lazy_face

if TYPE_CHECKING:
    from memd.rpc.protocol import JsonParams, Params, Registry
    from memd.rpc.server import RpcServer
    from memd.rpc.unix_socket import SocketSetupError
else:
    __getattr__ = lazy_face(__name__, __file__)
