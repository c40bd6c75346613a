"""Front ends: the `memd` command, the socket client and the stdio MCP bridge."""

from __future__ import annotations

from typing import TYPE_CHECKING

from memd import lazy_face

if TYPE_CHECKING:
    from memd.cli.client import ClientError, MemdClient, RemoteError, call
else:
    __getattr__ = lazy_face(__name__, __file__)
