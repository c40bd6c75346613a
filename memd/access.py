"""Which clients may use memory: the opt-in gate every per-client request passes."""

from __future__ import annotations

from typing import Any

from memd.config import CLIENT_ID_RE, MEMORY_MODES, ClientConfig, Config
from memd.errors import ClientDisabled, InvalidId, UnknownClient, UnsupportedMode


def check_client_id(client_id: str) -> str:
    """Refuse ids that could never be configured (and so never reach a path)."""
    if not CLIENT_ID_RE.match(client_id) or client_id in (".", ".."):
        shown = client_id if len(client_id) <= 80 else client_id[:77] + "..."
        raise InvalidId(
            f"invalid client_id {shown!r}: use 1-64 of A-Z a-z 0-9 _ . - "
            "starting with a letter or digit",
            data={"param": "client_id"},
        )
    return client_id


def memory_client(config: Config, client_id: str) -> ClientConfig:
    """The client's config if memory runs for it; otherwise the error that says why not."""
    check_client_id(client_id)
    client = config.clients.get(client_id)
    if client is None:
        raise UnknownClient(
            f"unknown client {client_id!r}: add [clients.{client_id}] to the config",
            data={"client_id": client_id},
        )
    if client.mode not in MEMORY_MODES:
        raise UnsupportedMode(
            f"client {client_id!r} is in mode {client.mode}; memory needs mcp_via_llm or both",
            data={"client_id": client_id, "mode": client.mode},
        )
    if client.memory_enabled is not True:
        state = "unset" if client.memory_enabled is None else "false"
        raise ClientDisabled(
            f"memory is not enabled for client {client_id!r} (memory_enabled is {state})",
            data={"client_id": client_id},
        )
    return client


def client_rows(config: Config) -> list[dict[str, Any]]:
    """Every configured client with its mode and whether memory is on, for `clients.list`."""
    return [
        {
            "client_id": cid,
            "mode": c.mode,
            "memory_enabled": c.memory_enabled,
            "memory_on": c.memory_on,
            "supported_mode": c.mode in MEMORY_MODES,
        }
        for cid, c in sorted(config.clients.items())
    ]
