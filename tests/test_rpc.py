"""Tests for memd.rpc and memd.errors: JSON-RPC 2.0 dispatch, framing, the socket lifecycle.

The server runs on its own event loop in a thread and the tests talk to it over the real
socket with plain blocking sockets, as memd's synchronous client does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from memd.errors import (
    DOMAIN_RANGE,
    ClientDisabled,
    DomainCode,
    InvalidParams,
    JsonRpcCode,
    MemdError,
    PayloadTooLarge,
    RpcError,
    UnknownClient,
    error_class,
    error_from_dict,
)
from memd.rpc.protocol import MAX_LINE, Dispatcher, Params, Registry
from memd.rpc.server import RpcServer
from memd.rpc.unix_socket import SocketInUse, SocketSetupError

# --- helpers ----------------------------------------------------------------------------


class ServerThread:
    """An RpcServer on its own event loop in a daemon thread."""

    def __init__(self, path: Path, registry: Registry, **kwargs: Any) -> None:
        self.path = path
        self.loop = asyncio.new_event_loop()
        self.server = RpcServer(path, registry, **kwargs)
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def run(self, coro: Any, timeout: float = 30) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def __enter__(self) -> ServerThread:
        self._thread.start()
        try:
            self.run(self.server.start())
        except BaseException:
            self._stop_loop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.run(self.server.close())
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


class Conn:
    """A blocking client connection: send lines, read response lines."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(30)
        self.sock.connect(str(path))
        self.file = self.sock.makefile("rb")

    def send(self, *messages: Any) -> None:
        """Send each message as one line; bytes go out as they are, anything else as JSON."""
        data = b"".join(_line(m) for m in messages)
        self.sock.sendall(data)

    def recv(self) -> Any:
        """The next response, or None at EOF (a reset after the server closed counts as EOF)."""
        try:
            line = self.file.readline()
        except ConnectionResetError:
            return None
        return json.loads(line) if line else None

    def read_all(self) -> list[Any]:
        """Every response until the server closes the connection."""
        out = []
        while (response := self.recv()) is not None:
            out.append(response)
        return out

    def finish(self) -> list[Any]:
        """Half-close, then every response until the server closes."""
        self.sock.shutdown(socket.SHUT_WR)
        out = self.read_all()
        self.close()
        return out

    def close(self) -> None:
        self.file.close()
        self.sock.close()


def _line(message: Any) -> bytes:
    if isinstance(message, bytes):
        return message if message.endswith(b"\n") else message + b"\n"
    return json.dumps(message).encode() + b"\n"


def exchange(path: Path, *messages: Any) -> list[Any]:
    """Send all messages on one connection, half-close, and return every response.

    Responses are read on a second thread while sending, so a long pipeline cannot deadlock
    on full socket buffers; a server that hangs up mid-send is not an error here.
    """
    conn = Conn(path)
    out: list[Any] = []
    reader = threading.Thread(target=lambda: out.extend(conn.read_all()))
    reader.start()
    try:
        conn.send(*messages)
        conn.sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    reader.join(60)
    conn.close()
    return out


def call(path: Path, method: str, params: Any = None, id: Any = 1) -> Any:
    request: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "id": id}
    if params is not None:
        request["params"] = params
    [response] = exchange(path, request)
    return response


def req(method: str, params: Any = None, id: Any = None) -> dict[str, Any]:
    request: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        request["params"] = params
    if id is not None:
        request["id"] = id
    return request


def error_code(response: dict[str, Any]) -> int:
    return response["error"]["code"]


class Spec:
    """The methods the JSON-RPC 2.0 spec's examples call, plus a few for testing failures."""

    def __init__(self) -> None:
        self.notified: list[tuple[str, Any]] = []
        self.gate: asyncio.Event | None = None
        self.started = threading.Event()
        self.cancelled = threading.Event()
        self.registry = Registry()
        for name in (
            "subtract",
            "update",
            "notify_hello",
            "get_data",
            "sum",
            "echo",
            "fail",
            "fail_domain",
            "not_json",
            "nan",
            "wait",
            "release",
            "checked",
        ):
            self.registry.add(name, getattr(self, "m_" + name))

    async def m_subtract(self, params: Any) -> Any:
        if isinstance(params, list):
            if len(params) != 2:
                raise InvalidParams("subtract takes two numbers")
            return params[0] - params[1]
        with Params(params) as p:
            return p.require("minuend", (int, float)) - p.require("subtrahend", (int, float))

    async def m_update(self, params: Any) -> None:
        self.notified.append(("update", params))

    async def m_notify_hello(self, params: Any) -> None:
        self.notified.append(("notify_hello", params))

    async def m_get_data(self, params: Any) -> Any:
        return ["hello", 5]

    async def m_sum(self, params: Any) -> Any:
        return sum(params)

    async def m_echo(self, params: Any) -> Any:
        return params

    async def m_fail(self, params: Any) -> Any:
        raise RuntimeError("boom")

    async def m_fail_domain(self, params: Any) -> Any:
        raise UnknownClient("no client named 'x'", data={"client_id": "x"})

    async def m_not_json(self, params: Any) -> Any:
        return {"obj": object()}

    async def m_nan(self, params: Any) -> Any:
        return float("nan")

    async def m_wait(self, params: Any) -> Any:
        """Blocks until `release` is called: lets tests hold a request in flight."""
        if self.gate is None:
            self.gate = asyncio.Event()
        self.started.set()
        try:
            await self.gate.wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return "waited"

    async def m_release(self, params: Any) -> Any:
        if self.gate is None:
            self.gate = asyncio.Event()
        self.gate.set()
        return "released"

    async def m_checked(self, params: Any) -> Any:
        p = Params(params)
        result = {
            "client_id": p.require("client_id", str),
            "top_k": p.optional("top_k", int, 5),
            "minutes": p.optional("minutes", float, 1.5),
        }
        p.done()
        return result


@pytest.fixture
def spec() -> Spec:
    return Spec()


@pytest.fixture
def sock_path(tmp_path: Path) -> Path:
    return tmp_path / "run" / "memd.sock"


@pytest.fixture
def server(sock_path: Path, spec: Spec) -> Iterator[ServerThread]:
    with ServerThread(sock_path, spec.registry) as srv:
        yield srv


# --- the JSON-RPC 2.0 specification's examples (section 7) ---------------------------

SPEC_EXAMPLES = [
    (
        "positional params 1",
        b'{"jsonrpc": "2.0", "method": "subtract", "params": [42, 23], "id": 1}',
        [{"jsonrpc": "2.0", "result": 19, "id": 1}],
    ),
    (
        "positional params 2",
        b'{"jsonrpc": "2.0", "method": "subtract", "params": [23, 42], "id": 2}',
        [{"jsonrpc": "2.0", "result": -19, "id": 2}],
    ),
    (
        "named params 1",
        b'{"jsonrpc": "2.0", "method": "subtract", "params": {"subtrahend": 23, "minuend": 42},'
        b' "id": 3}',
        [{"jsonrpc": "2.0", "result": 19, "id": 3}],
    ),
    (
        "named params 2",
        b'{"jsonrpc": "2.0", "method": "subtract", "params": {"minuend": 42, "subtrahend": 23},'
        b' "id": 4}',
        [{"jsonrpc": "2.0", "result": 19, "id": 4}],
    ),
    ("notification update", b'{"jsonrpc": "2.0", "method": "update", "params": [1,2,3,4,5]}', []),
    ("notification foobar", b'{"jsonrpc": "2.0", "method": "foobar"}', []),
    (
        "non-existent method",
        b'{"jsonrpc": "2.0", "method": "foobar", "id": "1"}',
        [{"jsonrpc": "2.0", "error": {"code": -32601, "message": "Method not found"}, "id": "1"}],
    ),
    (
        "invalid JSON",
        b'{"jsonrpc": "2.0", "method": "foobar, "params": "bar", "baz]',
        [{"jsonrpc": "2.0", "error": {"code": -32700, "message": "Parse error"}, "id": None}],
    ),
    (
        "invalid Request object",
        b'{"jsonrpc": "2.0", "method": 1, "params": "bar"}',
        [{"jsonrpc": "2.0", "error": {"code": -32600, "message": "Invalid Request"}, "id": None}],
    ),
    (
        "batch, invalid JSON",
        b'[{"jsonrpc": "2.0", "method": "sum", "params": [1,2,4], "id": "1"},'
        b'{"jsonrpc": "2.0", "method"]',
        [{"jsonrpc": "2.0", "error": {"code": -32700, "message": "Parse error"}, "id": None}],
    ),
    (
        "empty array",
        b"[]",
        [{"jsonrpc": "2.0", "error": {"code": -32600, "message": "Invalid Request"}, "id": None}],
    ),
    (
        "invalid batch, not empty",
        b"[1]",
        [[{"jsonrpc": "2.0", "error": {"code": -32600, "message": "Invalid Request"}, "id": None}]],
    ),
    (
        "invalid batch",
        b"[1,2,3]",
        [
            [
                {
                    "jsonrpc": "2.0",
                    "error": {"code": -32600, "message": "Invalid Request"},
                    "id": None,
                }
            ]
            * 3
        ],
    ),
    (
        "mixed batch",
        b'[{"jsonrpc": "2.0", "method": "sum", "params": [1,2,4], "id": "1"},'
        b'{"jsonrpc": "2.0", "method": "notify_hello", "params": [7]},'
        b'{"jsonrpc": "2.0", "method": "subtract", "params": [42,23], "id": "2"},'
        b'{"foo": "boo"},'
        b'{"jsonrpc": "2.0", "method": "foo.get", "params": {"name": "myself"}, "id": "5"},'
        b'{"jsonrpc": "2.0", "method": "get_data", "id": "9"}]',
        [
            [
                {"jsonrpc": "2.0", "result": 7, "id": "1"},
                {"jsonrpc": "2.0", "result": 19, "id": "2"},
                {
                    "jsonrpc": "2.0",
                    "error": {"code": -32600, "message": "Invalid Request"},
                    "id": None,
                },
                {
                    "jsonrpc": "2.0",
                    "error": {"code": -32601, "message": "Method not found"},
                    "id": "5",
                },
                {"jsonrpc": "2.0", "result": ["hello", 5], "id": "9"},
            ]
        ],
    ),
    (
        "all notifications batch",
        b'[{"jsonrpc": "2.0", "method": "notify_sum", "params": [1,2,4]},'
        b'{"jsonrpc": "2.0", "method": "notify_hello", "params": [7]}]',
        [],
    ),
]


def _comparable(response: Any) -> Any:
    """A response reduced to what the spec fixes: our messages add detail after the spec's
    wording and `data` carries a kind, so compare the code, the message's start and the id."""
    if isinstance(response, list):
        return sorted((_comparable(r) for r in response), key=repr)
    if "error" in response:
        err = response["error"]
        return ("error", err["code"], response["id"])
    return ("result", json.dumps(response["result"]), response["id"])


@pytest.mark.parametrize(
    ("line", "expected"), [e[1:] for e in SPEC_EXAMPLES], ids=[e[0] for e in SPEC_EXAMPLES]
)
def test_spec_example(server: ServerThread, line: bytes, expected: list[Any]) -> None:
    responses = exchange(server.path, line)
    assert [_comparable(r) for r in responses] == [_comparable(e) for e in expected]
    for got, want in zip(_flatten(responses), _flatten(expected), strict=False):
        assert got["jsonrpc"] == "2.0"
        if "error" in want:
            assert got["error"]["message"].startswith(want["error"]["message"])
            assert got["error"]["data"]["kind"]


def _flatten(responses: list[Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for r in responses:
        out.extend(sorted(r, key=lambda x: repr(x["id"])) if isinstance(r, list) else [r])
    return out


def test_notifications_run_but_are_not_answered(server: ServerThread, spec: Spec) -> None:
    responses = exchange(
        server.path,
        req("update", [1, 2, 3, 4, 5]),
        req("notify_hello", [7]),
        req("fail"),
        req("echo", [1], id=1),
    )
    assert responses == [{"jsonrpc": "2.0", "result": [1], "id": 1}]
    assert sorted(spec.notified, key=repr) == [("notify_hello", [7]), ("update", [1, 2, 3, 4, 5])]


def test_batch_notifications_run(server: ServerThread, spec: Spec) -> None:
    assert exchange(server.path, [req("notify_hello", [7]), req("update", {"a": 1})]) == []
    assert sorted(spec.notified, key=repr) == [("notify_hello", [7]), ("update", {"a": 1})]


def test_batch_elements_run_concurrently(server: ServerThread) -> None:
    """`wait` only returns once `release` ran: a batch processed one by one would hang."""
    [responses] = exchange(server.path, [req("wait", id=1), req("release", id=2)])
    assert sorted((r["id"], r["result"]) for r in responses) == [(1, "waited"), (2, "released")]


# --- request validation ----------------------------------------------------------------


@pytest.mark.parametrize("request_id", ["abc", "", 7, 0, -3, 1.5, 10**30, None])
def test_id_types_are_echoed(server: ServerThread, request_id: Any) -> None:
    response = call(server.path, "echo", [1], id=request_id)
    assert response == {"jsonrpc": "2.0", "result": [1], "id": request_id}


@pytest.mark.parametrize(
    ("message", "answer_id"),
    [
        ({"jsonrpc": "2.0", "method": "echo", "id": True}, None),
        ({"jsonrpc": "2.0", "method": "echo", "id": {"a": 1}}, None),
        ({"jsonrpc": "2.0", "method": "echo", "id": [1]}, None),
        ({"jsonrpc": "1.0", "method": "echo", "id": 7}, 7),
        ({"method": "echo", "id": 7}, 7),
        ({"jsonrpc": 2.0, "method": "echo", "id": 7}, 7),
        ({"jsonrpc": "2.0", "id": 7}, 7),
        ({"jsonrpc": "2.0", "method": None, "id": 7}, 7),
        ({"jsonrpc": "2.0", "method": "echo", "params": "bar", "id": 7}, 7),
        ({"jsonrpc": "2.0", "method": "echo", "params": 3, "id": 7}, 7),
        ({"jsonrpc": "2.0", "method": "echo", "params": None, "id": 7}, 7),
        ({"jsonrpc": "2.0", "method": "echo", "param": {"a": 1}, "id": 7}, 7),
        ({"jsonrpc": "2.0", "method": "echo", "params": "bar"}, None),
        ("just a string", None),
        (42, None),
        (None, None),
        ([[req("echo", [1], id=1)]], None),
    ],
)
def test_invalid_requests(server: ServerThread, message: Any, answer_id: Any) -> None:
    [response] = exchange(server.path, message)
    if isinstance(message, list):
        [response] = response
    assert error_code(response) == -32600
    assert response["error"]["data"]["kind"] == "invalid_request"
    assert response["id"] == answer_id
    assert "result" not in response


def test_reserved_and_unknown_methods(server: ServerThread) -> None:
    for method in ("rpc.discover", "nope", ""):
        response = call(server.path, method)
        assert error_code(response) == -32601
        assert response["error"]["data"] == {"kind": "method_not_found", "method": method}


def test_empty_params_forms(server: ServerThread) -> None:
    assert call(server.path, "echo", [])["result"] == []
    assert call(server.path, "echo", {})["result"] == {}
    assert call(server.path, "echo")["result"] is None


def test_batch_limit(sock_path: Path, spec: Spec) -> None:
    with ServerThread(sock_path, spec.registry, max_batch=3) as srv:
        conn = Conn(srv.path)
        conn.send([req("echo", [i], id=i) for i in range(4)])
        too_big = conn.recv()
        assert error_code(too_big) == DomainCode.PAYLOAD_TOO_LARGE
        assert too_big["error"]["data"] == {"kind": "payload_too_large", "limit": 3}
        conn.send([req("echo", [i], id=i) for i in range(3)])
        assert sorted(r["id"] for r in conn.recv()) == [0, 1, 2]
        conn.close()


# --- handler errors ------------------------------------------------------------------


def test_unexpected_exception_is_internal_error_and_logged(server: ServerThread) -> None:
    with capture_logs() as logs:
        response = call(server.path, "fail", id=5)
    assert response["id"] == 5
    assert response["error"]["code"] == -32603
    assert response["error"]["data"] == {
        "kind": "internal_error",
        "method": "fail",
        "exception": "RuntimeError",
    }
    [entry] = [e for e in logs if e["event"] == "rpc.handler_failed"]
    assert entry["method"] == "fail" and entry["log_level"] == "error" and entry["exc_info"]
    assert call(server.path, "echo", [1])["result"] == [1]


def test_domain_error_carries_code_kind_and_data(server: ServerThread) -> None:
    response = call(server.path, "fail_domain", id="a")
    assert response == {
        "jsonrpc": "2.0",
        "id": "a",
        "error": {
            "code": -32001,
            "message": "no client named 'x'",
            "data": {"client_id": "x", "kind": "unknown_client"},
        },
    }
    exc = error_from_dict(response["error"])
    assert isinstance(exc, UnknownClient) and exc.data == {"client_id": "x"}


@pytest.mark.parametrize("method", ["not_json", "nan"])
def test_result_that_is_not_json(server: ServerThread, method: str) -> None:
    response = call(server.path, method, id=9)
    assert response["id"] == 9 and error_code(response) == -32603
    [batch] = exchange(server.path, [req(method, id=1), req("echo", [2], id=2)])
    by_id = {r["id"]: r for r in batch}
    assert error_code(by_id[1]) == -32603 and by_id[2]["result"] == [2]


def test_params_errors_over_the_socket(server: ServerThread) -> None:
    ok = call(server.path, "checked", {"client_id": "c", "minutes": 2})
    assert ok["result"] == {"client_id": "c", "top_k": 5, "minutes": 2.0}
    cases = [
        ({}, "missing param 'client_id'", "client_id"),
        ({"client_id": 3}, "param 'client_id' must be a string, got an integer", "client_id"),
        (
            {"client_id": "c", "top_k": True},
            "param 'top_k' must be an integer, got a boolean",
            "top_k",
        ),
        (
            {"client_id": "c", "top_k": 1.5},
            "param 'top_k' must be an integer, got a number",
            "top_k",
        ),
        ({"client_id": "c", "topk": 1}, "unknown param 'topk'", "topk"),
        ([1, 2], "params must be an object (named params)", None),
    ]
    for params, message, param in cases:
        error = call(server.path, "checked", params)["error"]
        assert (error["code"], error["message"]) == (-32602, message)
        assert error["data"].get("param") == param
        assert error["data"]["kind"] == "invalid_params"


# --- framing -----------------------------------------------------------------------------


def test_blank_lines_are_ignored_and_crlf_accepted(server: ServerThread) -> None:
    responses = exchange(
        server.path,
        b"\n",
        b"   \n",
        b"\t\r\n",
        json.dumps(req("echo", [1], id=1)).encode() + b"\r\n",
    )
    assert responses == [{"jsonrpc": "2.0", "result": [1], "id": 1}]


def test_invalid_utf8_is_a_parse_error_and_the_connection_lives(server: ServerThread) -> None:
    conn = Conn(server.path)
    conn.send(b'{"jsonrpc": "2.0", "method": "echo", "params": ["\xff\xfe"], "id": 1}')
    bad = conn.recv()
    assert (error_code(bad), bad["id"]) == (-32700, None)
    conn.send(req("echo", ["ok"], id=2))
    assert conn.recv()["result"] == ["ok"]
    conn.close()


@pytest.mark.parametrize(
    "line",
    [
        b"[" * 100_000,
        b'{"jsonrpc": "2.0", "method": "echo", "params": [NaN], "id": 1}',
        b'{"jsonrpc": "2.0", "method": "echo", "params": [Infinity], "id": 1}',
        b'{"jsonrpc": "2.0", "method": "echo", "params": [' + b"9" * 5000 + b'], "id": 1}',
        b"\xef\xbb\xbf" + json.dumps(req("echo", [1], id=1)).encode(),
        '{"jsonrpc": "2.0", "method": "echo", "id": 1}'.encode("utf-16"),
        b'{"jsonrpc": "2.0", "method": "echo", "id": 1} {"second": 1}',
    ],
    ids=["deep nesting", "NaN", "Infinity", "5000-digit int", "UTF-8 BOM", "UTF-16", "two values"],
)
def test_not_strict_json_is_a_parse_error(server: ServerThread, line: bytes) -> None:
    responses = exchange(server.path, line, req("echo", ["after"], id="after"))
    by_id = {r["id"]: r for r in responses}
    assert error_code(by_id[None]) == -32700
    assert by_id["after"]["result"] == ["after"]


def test_unicode_round_trips(server: ServerThread) -> None:
    params = ["héllo wörld ✓ 日本語 🦀", "\ud800 lone surrogate", "nul\x00byte", "# heading\n"]
    conn = Conn(server.path)
    conn.send(req("echo", params, id=1))
    raw = conn.file.readline()
    assert raw.isascii()
    assert json.loads(raw)["result"] == params
    conn.close()


def test_unfinished_last_line_is_dropped_unanswered(server: ServerThread) -> None:
    """A line is a message only once its newline came (issue 24: copying and decoding
    unfinished lines at end of stream kept hundreds of MB); the ones before it count."""
    conn = Conn(server.path)
    conn.sock.sendall(_line(req("echo", [0], id=0)) + json.dumps(req("echo", [1], id=1)).encode())
    assert conn.finish() == [{"jsonrpc": "2.0", "result": [0], "id": 0}]


def _padded(length: int, id: int = 1) -> bytes:
    """A valid echo request of exactly `length` bytes (trailing spaces are JSON whitespace)."""
    line = json.dumps(req("echo", ["x"], id=id)).encode()
    assert len(line) <= length
    return line + b" " * (length - len(line))


def test_line_limit(sock_path: Path, spec: Spec) -> None:
    with ServerThread(sock_path, spec.registry, max_line=1024) as srv:
        bystander = Conn(srv.path)
        assert exchange(srv.path, _padded(1024))[0]["result"] == ["x"]

        conn = Conn(srv.path)
        conn.sock.sendall(_padded(1025) + b"\n" + _line(req("echo", [2], id=2)))
        refused = conn.recv()
        assert refused == {
            "jsonrpc": "2.0",
            "id": None,
            "error": {
                "code": -32008,
                "message": refused["error"]["message"],
                "data": {"kind": "payload_too_large", "limit": 1024},
            },
        }
        assert conn.recv() is None  # closed: the request after the long line is not served
        conn.close()

        bystander.send(req("echo", ["still here"], id=3))
        assert bystander.recv()["result"] == ["still here"]
        bystander.close()
        assert call(srv.path, "echo", [4])["result"] == [4]


def test_line_limit_without_newline(sock_path: Path, spec: Spec) -> None:
    with ServerThread(sock_path, spec.registry, max_line=1024) as srv:
        conn = Conn(srv.path)
        conn.sock.sendall(b"x" * 5000)  # never terminated: the limit still applies
        assert conn.recv()["error"]["data"]["kind"] == "payload_too_large"
        assert conn.recv() is None
        conn.close()


def test_default_line_limit_is_8_mib(server: ServerThread) -> None:
    assert server.server.max_line == MAX_LINE == 8 * 1024 * 1024
    pad = MAX_LINE - len(json.dumps(req("echo", [""], id=1)))
    ok = exchange(server.path, json.dumps(req("echo", ["y" * pad], id=1)).encode())
    assert len(ok[0]["result"][0]) == pad
    [refused] = exchange(server.path, json.dumps(req("echo", ["y" * (pad + 1)], id=2)).encode())
    assert refused["error"]["data"]["kind"] == "payload_too_large"


# --- concurrency -------------------------------------------------------------------------


def test_pipelining_many_requests_on_one_connection(server: ServerThread) -> None:
    n = 2000  # far beyond the per-connection in-flight bound
    responses = exchange(server.path, *(req("sum", [i, 1], id=i) for i in range(n)))
    assert len(responses) == n
    assert {r["id"]: r["result"] for r in responses} == {i: i + 1 for i in range(n)}


def test_responses_come_in_completion_order(server: ServerThread, spec: Spec) -> None:
    conn = Conn(server.path)
    conn.send(req("wait", id=1), req("echo", ["fast"], id=2))
    assert conn.recv()["id"] == 2  # the slow call does not hold up the fast one
    conn.send(req("release", id=3))
    assert sorted(conn.recv()["id"] for _ in range(2)) == [1, 3]
    conn.close()


def test_slow_handler_does_not_block_other_connections(server: ServerThread, spec: Spec) -> None:
    slow = Conn(server.path)
    slow.send(req("wait", id=1))
    assert spec.started.wait(10)
    assert call(server.path, "echo", ["other"])["result"] == ["other"]
    assert call(server.path, "release")["result"] == "released"
    assert slow.recv() == {"jsonrpc": "2.0", "result": "waited", "id": 1}
    slow.close()


def test_client_gone_before_its_answer(server: ServerThread, spec: Spec) -> None:
    """The handler still completes (a record must not be cut short); the answer is dropped."""
    gone = Conn(server.path)
    gone.send(req("wait", id=1))
    assert spec.started.wait(10)
    gone.close()
    assert call(server.path, "release")["result"] == "released"
    assert call(server.path, "echo", ["next"])["result"] == ["next"]
    assert not spec.cancelled.is_set()


def test_hundred_concurrent_clients(server: ServerThread) -> None:
    clients, per_client = 100, 5
    barrier = threading.Barrier(clients)
    failures: list[str] = []

    def client(k: int) -> None:
        try:
            conn = Conn(server.path)
            barrier.wait(30)  # all connected at once before anyone sends
            conn.send(*(req("sum", [k, j], id=f"{k}-{j}") for j in range(per_client)))
            got = {}
            for _ in range(per_client):
                response = conn.recv()
                got[response["id"]] = response["result"]
            conn.close()
            if got != {f"{k}-{j}": k + j for j in range(per_client)}:
                failures.append(f"client {k}: {got}")
        except Exception as exc:
            failures.append(f"client {k}: {exc!r}")

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert failures == []


# --- peer credentials ----------------------------------------------------------------------


def test_peer_with_another_uid_is_refused(sock_path: Path, spec: Spec) -> None:
    with (
        capture_logs() as logs,
        ServerThread(sock_path, spec.registry, allowed_uid=os.getuid() + 1) as srv,
    ):
        conn = Conn(srv.path)
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            conn.send(req("echo", [1], id=1))
        assert conn.recv() is None
        conn.close()
    [entry] = [e for e in logs if e["event"] == "rpc.peer_refused"]
    assert entry["peer_uid"] == os.getuid() and entry["peer_pid"] == os.getpid()


def test_own_uid_is_served(sock_path: Path, spec: Spec) -> None:
    with ServerThread(sock_path, spec.registry, allowed_uid=os.getuid()) as srv:
        assert call(srv.path, "echo", [1])["result"] == [1]


# --- socket lifecycle ------------------------------------------------------------------


def test_socket_modes_and_cleanup(tmp_path: Path, spec: Spec) -> None:
    path = tmp_path / "a" / "b" / "memd.sock"
    with ServerThread(path, spec.registry) as srv:
        assert stat.S_IMODE(os.stat(tmp_path / "a").st_mode) == 0o700
        assert stat.S_IMODE(os.stat(tmp_path / "a" / "b").st_mode) == 0o700
        st = os.stat(path)
        assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
        assert call(srv.path, "echo", [1])["result"] == [1]
    assert not path.exists()
    assert (tmp_path / "a" / "b" / "memd.sock.lock").exists()  # kept on purpose (see RpcServer)
    with ServerThread(path, spec.registry) as srv:  # a restart on the same path works
        assert call(srv.path, "echo", [2])["result"] == [2]


def test_existing_private_dir_is_left_alone(tmp_path: Path, spec: Spec) -> None:
    run = tmp_path / "run"
    run.mkdir()
    os.chmod(run, 0o755)
    with ServerThread(run / "memd.sock", spec.registry):
        assert stat.S_IMODE(os.stat(run).st_mode) == 0o755
        assert stat.S_IMODE(os.stat(run / "memd.sock").st_mode) == 0o600


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o1777])
def test_dir_writable_by_others_is_refused(tmp_path: Path, spec: Spec, mode: int) -> None:
    run = tmp_path / "run"
    run.mkdir()
    os.chmod(run, mode)
    with pytest.raises(SocketSetupError, match="writable by group or others"):
        asyncio.run(RpcServer(run / "memd.sock", spec.registry).start())
    assert not (run / "memd.sock").exists()
    assert stat.S_IMODE(os.stat(run).st_mode) == mode


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown a directory to someone else")
def test_dir_owned_by_someone_else_is_refused(tmp_path: Path, spec: Spec) -> None:
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    os.chown(run, 12345, 12345)
    with pytest.raises(SocketSetupError, match="belongs to uid 12345"):
        asyncio.run(RpcServer(run / "memd.sock", spec.registry).start())


def test_stale_socket_is_replaced(sock_path: Path, spec: Spec) -> None:
    sock_path.parent.mkdir(mode=0o700)
    crashed = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    crashed.bind(str(sock_path))  # what a kill -9 leaves: the file, and nobody listening
    crashed.close()
    assert stat.S_ISSOCK(os.stat(sock_path).st_mode)
    with capture_logs() as logs, ServerThread(sock_path, spec.registry) as srv:
        assert call(srv.path, "echo", [1])["result"] == [1]
    assert any(e["event"] == "rpc.stale_socket_removed" for e in logs)


def test_live_socket_is_never_stolen(sock_path: Path, spec: Spec) -> None:
    sock_path.parent.mkdir(mode=0o700)
    other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # not a memd: no lock file
    other.bind(str(sock_path))
    other.listen()
    try:
        with pytest.raises(SocketInUse, match=f"already listening on {sock_path}"):
            asyncio.run(RpcServer(sock_path, spec.registry).start())
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.connect(str(sock_path))  # still the other listener's socket
        probe.close()
    finally:
        other.close()


def test_second_server_on_the_same_path_is_refused(server: ServerThread, spec: Spec) -> None:
    with pytest.raises(SocketInUse, match="already listening"):
        asyncio.run(RpcServer(server.path, spec.registry).start())
    assert call(server.path, "echo", [1])["result"] == [1]  # the first one is untouched


def test_non_socket_at_the_path_is_not_replaced(sock_path: Path, spec: Spec) -> None:
    sock_path.parent.mkdir(mode=0o700)
    sock_path.write_text("precious")
    with pytest.raises(SocketSetupError, match="not a socket"):
        asyncio.run(RpcServer(sock_path, spec.registry).start())
    assert sock_path.read_text() == "precious"


def test_socket_path_too_long(tmp_path: Path, spec: Spec) -> None:
    path = tmp_path / ("d" * 60) / ("s" * 60 + ".sock")
    with pytest.raises(SocketSetupError, match="too long"):
        asyncio.run(RpcServer(path, spec.registry).start())


def test_async_context_manager(sock_path: Path, spec: Spec) -> None:
    async def main() -> list[bytes]:
        async with RpcServer(sock_path, spec.registry) as srv:
            reader, writer = await asyncio.open_unix_connection(srv.path)
            writer.write(_line(req("echo", [1], id=1)))
            line = await reader.readline()
            writer.close()
            await writer.wait_closed()
        return [line, b"exists" if sock_path.exists() else b"gone"]

    line, state = asyncio.run(main())
    assert json.loads(line)["result"] == [1] and state == b"gone"


def test_close_disconnects_idle_clients(sock_path: Path, spec: Spec) -> None:
    srv = ServerThread(sock_path, spec.registry).__enter__()
    idle = Conn(sock_path)
    assert call(sock_path, "echo", [1])["result"] == [1]
    srv.__exit__(None, None, None)
    assert idle.recv() is None
    idle.close()


def test_close_lets_in_flight_requests_answer(sock_path: Path, spec: Spec) -> None:
    srv = ServerThread(sock_path, spec.registry).__enter__()
    try:
        conn = Conn(sock_path)
        conn.send(req("wait", id=1))
        assert spec.started.wait(10)
        closing = asyncio.run_coroutine_threadsafe(srv.server.close(), srv.loop)
        while sock_path.exists():  # close() has begun: it stops connections right after
            threading.Event().wait(0.01)
        assert not closing.done()
        srv.run(spec.m_release(None))
        closing.result(30)
        assert conn.recv() == {"jsonrpc": "2.0", "result": "waited", "id": 1}
        assert conn.recv() is None
        conn.close()
    finally:
        srv._stop_loop()


def test_close_cancels_what_outlives_the_timeout(sock_path: Path, spec: Spec) -> None:
    srv = ServerThread(sock_path, spec.registry).__enter__()
    try:
        conn = Conn(sock_path)
        conn.send(req("wait", id=1))
        assert spec.started.wait(10)
        srv.run(srv.server.close(timeout=0.1))
        assert spec.cancelled.is_set()
        assert conn.recv() is None
        assert srv.server.connection_count == 0
        conn.close()
    finally:
        srv._stop_loop()


# --- Registry, Params, Dispatcher, errors as units ---------------------------------------


def test_registry_rules() -> None:
    reg = Registry()

    @reg.method("a.b")
    async def handler(params: Any) -> Any:
        return params

    assert "a.b" in reg and reg.get("a.b") is handler and reg.names() == ["a.b"]
    with pytest.raises(ValueError, match="already registered"):
        reg.add("a.b", handler)
    with pytest.raises(ValueError, match="reserved"):
        reg.add("rpc.x", handler)

    def sync(params: Any) -> Any:
        return params

    with pytest.raises(TypeError, match="async"):
        reg.add("sync", sync)  # type: ignore[arg-type]

    class AsyncCallable:
        async def __call__(self, params: Any) -> Any:
            return params

    reg.add("obj", AsyncCallable())
    assert reg.names() == ["a.b", "obj"]


def test_params_helper() -> None:
    with Params({"s": "x", "i": 3, "f": 2, "l": [1], "o": {"k": 1}, "n": None}) as p:
        assert p.require("s", str) == "x"
        assert p.require("i", int) == 3
        f = p.require("f", float)
        assert f == 2.0 and isinstance(f, float)
        assert p.require("l", list) == [1]
        assert p.require("o", dict) == {"k": 1}
        assert p.optional("n", int, 7) == 7
        assert p.optional("absent", str) is None
    assert Params(None).optional("x", int, 1) == 1
    assert Params({"any": True}).require("any", object) is True  # `object`: any JSON value
    assert Params({"v": None}).require("v", (str, type(None))) is None
    with pytest.raises(InvalidParams, match="must be a string or null, got an integer"):
        Params({"v": 1}).require("v", (str, type(None)))
    with pytest.raises(InvalidParams, match="got a boolean"):
        Params({"f": False}).require("f", float)
    with pytest.raises(InvalidParams, match="must be a number"):
        Params({"f": 10**400}).require("f", float)
    with pytest.raises(InvalidParams, match="unknown param 'a', 'b'"), Params({"a": 1, "b": 2}):
        pass
    with pytest.raises(InvalidParams, match="named params"):
        Params([1])
    with pytest.raises(KeyError), Params({"x": 1}):
        raise KeyError("a handler's own error is not masked by the unknown-param check")


def test_dispatcher_without_a_socket(spec: Spec) -> None:
    dispatcher = Dispatcher(spec.registry)

    async def main() -> list[Any]:
        return [
            await dispatcher.handle_line(b'{"jsonrpc":"2.0","method":"sum","params":[1,2],"id":1}'),
            await dispatcher.handle_line(b'{"jsonrpc":"2.0","method":"update","params":[1]}'),
            await dispatcher.handle_line(b"not json"),
            await dispatcher.dispatch([req("update", [2])]),
        ]

    answered, notification, parse_error, notifications = asyncio.run(main())
    assert answered == b'{"jsonrpc":"2.0","result":3,"id":1}\n'
    assert notification is None and notifications is None
    assert json.loads(parse_error)["error"]["code"] == -32700
    assert spec.notified == [("update", [1]), ("update", [2])]


def test_error_table() -> None:
    assert [int(c) for c in DomainCode] == list(range(-32000, -32000 - len(DomainCode), -1))
    for code in DomainCode:
        cls = error_class(code)
        assert issubclass(cls, MemdError) and cls.code == code and code in DOMAIN_RANGE
        exc = cls("msg")
        assert exc.kind == code.name.lower() and exc.to_dict()["data"] == {"kind": exc.kind}
        assert type(error_from_dict(exc.to_dict())) is cls
    assert ClientDisabled("off").kind == "memory_disabled"
    assert PayloadTooLarge("big").to_dict()["code"] == -32008
    for code in JsonRpcCode:
        exc = error_class(code)()
        assert exc.to_dict()["data"]["kind"] == code.name.lower()
    with pytest.raises(TypeError, match="taken by UnknownClient"):
        type("Clash", (MemdError,), {"code": DomainCode.UNKNOWN_CLIENT})


def test_memd_error_base_and_unknown_codes() -> None:
    exc = MemdError("something new", kind="brand_new", data={"x": 1, "kind": "ignored"})
    assert exc.to_dict() == {
        "code": -32000,
        "message": "something new",
        "data": {"x": 1, "kind": "brand_new"},
    }
    unknown = error_from_dict({"code": -32077, "message": "later", "data": {"kind": "later"}})
    assert isinstance(unknown, MemdError) and unknown.code == -32077 and unknown.kind == "later"
    foreign = error_from_dict({"code": 12, "message": "odd", "data": "text"})
    assert type(foreign) is RpcError and foreign.code == 12 and foreign.data == {"value": "text"}
