"""A small synchronous client for memd's Unix socket (used by the CLI, MCP bridge, tests)."""

from __future__ import annotations

import itertools
import json
import socket
from pathlib import Path
from typing import Any


class ClientError(Exception):
    """The daemon could not be reached or answered something that is not JSON-RPC.

    `unreachable` is true when no connection was made at all (no socket, a stale one),
    so the CLI can explain which socket it tried and why.
    """

    def __init__(self, message: str, unreachable: bool = False) -> None:
        super().__init__(message)
        self.unreachable = unreachable


class RemoteError(Exception):
    """A JSON-RPC error answered by the daemon, with its code and `data.kind`."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

    @property
    def kind(self) -> str | None:
        return self.data.get("kind") if isinstance(self.data, dict) else None

    def __str__(self) -> str:
        kind = f" [{self.kind}]" if self.kind else ""
        return f"{self.message}{kind} (code {self.code})"


class MemdClient:
    """One connection to the daemon; requests are sent one at a time and answered in order."""

    def __init__(self, path: str | Path, timeout: float | None = 30.0) -> None:
        self.path = Path(path)
        self.timeout = timeout
        self._ids = itertools.count(1)
        self._sock: socket.socket | None = None
        self._buf = b""

    def __enter__(self) -> MemdClient:
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(str(self.path))
        except FileNotFoundError as exc:
            sock.close()
            raise ClientError(
                f"memd is not running (no socket at {self.path})", unreachable=True
            ) from exc
        except ConnectionRefusedError as exc:
            sock.close()
            raise ClientError(
                f"memd is not running (stale socket at {self.path})", unreachable=True
            ) from exc
        except OSError as exc:
            sock.close()
            raise ClientError(
                f"cannot connect to memd at {self.path}: {exc}", unreachable=True
            ) from exc
        self._sock = sock

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def call(self, method: str, params: dict[str, Any] | list[Any] | None = None) -> Any:
        """Send one request and return its result, raising RemoteError for an error reply."""
        request: dict[str, Any] = {"jsonrpc": "2.0", "id": next(self._ids), "method": method}
        if params is not None:
            request["params"] = params
        reply = self.roundtrip(request)
        if not isinstance(reply, dict):
            raise ClientError(f"unexpected reply from memd: {reply!r}")
        if "error" in reply:
            err = reply["error"]
            raise RemoteError(err.get("code", 0), err.get("message", ""), err.get("data"))
        return reply.get("result")

    def roundtrip(self, message: Any) -> Any:
        """Send any JSON value as one line and read one reply line (tests use this raw)."""
        self.send_line(json.dumps(message, ensure_ascii=False).encode("utf-8"))
        return json.loads(self.read_line())

    def send_line(self, line: bytes) -> None:
        if self._sock is None:
            self.connect()
        assert self._sock is not None
        try:
            self._sock.sendall(line + b"\n")
        except OSError as exc:
            raise ClientError(f"lost connection to memd: {exc}") from exc

    def read_line(self) -> bytes:
        assert self._sock is not None
        while b"\n" not in self._buf:
            try:
                chunk = self._sock.recv(1 << 16)
            except TimeoutError as exc:
                raise ClientError(f"memd did not answer within {self.timeout} s") from exc
            except OSError as exc:
                raise ClientError(f"lost connection to memd: {exc}") from exc
            if not chunk:
                raise ClientError("memd closed the connection")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line


def call(
    path: str | Path,
    method: str,
    params: dict[str, Any] | None = None,
    timeout: float | None = 30.0,
) -> Any:
    """One-shot request on a fresh connection."""
    with MemdClient(path, timeout=timeout) as client:
        return client.call(method, params)
