"""Fuzz tests for memd.rpc: garbage, truncated and oversized lines never take the server down.

After every example a well-formed request still gets its correct answer on a fresh
connection, and, where the garbage ended in a complete line short enough to be read, on the
same connection too. One server serves the whole module, so damage would accumulate.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memd.rpc.protocol import Registry
from memd.rpc.server import RpcServer

MAX_LINE = 2048  # small, so that examples cross the line limit often
FUZZ = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _registry() -> Registry:
    registry = Registry()

    async def echo(params: Any) -> Any:
        return params

    registry.add("echo", echo)
    return registry


@pytest.fixture(scope="module")
def sock_path(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One server for the module, on its own event loop in a thread."""
    path = tmp_path_factory.mktemp("fuzz") / "memd.sock"
    loop = asyncio.new_event_loop()
    server = RpcServer(path, _registry(), max_line=MAX_LINE)
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(server.start(), loop).result(30)
    yield path
    try:
        for _ in range(1000):  # every client has hung up: no connection may linger
            if server.connection_count == 0:
                break
            threading.Event().wait(0.01)
        assert server.connection_count == 0
        asyncio.run_coroutine_threadsafe(server.close(), loop).result(30)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def send_and_collect(path: Path, data: bytes, half_close: bool = True) -> list[Any]:
    """Send raw bytes, half-close, return every response line (parsed) until the server
    closes. Reading runs on a second thread so big inputs cannot deadlock."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(30)
    sock.connect(str(path))
    reader = sock.makefile("rb")
    lines: list[bytes] = []

    def read() -> None:
        # A reset means the server hung up on unread input (line limit): same as EOF here.
        with contextlib.suppress(ConnectionResetError):
            lines.extend(iter(reader.readline, b""))

    thread = threading.Thread(target=read)
    thread.start()
    try:
        sock.sendall(data)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass  # the server may close first (line limit); what it sent is still readable
    thread.join(60)
    reader.close()
    sock.close()
    assert not thread.is_alive(), "server neither answered nor closed the connection"
    responses = [json.loads(line) for line in lines]
    for response in responses:
        _assert_well_formed(response)
    return responses


def _assert_well_formed(response: Any) -> None:
    for r in response if isinstance(response, list) else [response]:
        assert r["jsonrpc"] == "2.0"
        assert ("result" in r) != ("error" in r)
        assert "id" in r
        if "error" in r:
            assert isinstance(r["error"]["code"], int) and r["error"]["data"]["kind"]


def sentinel() -> tuple[bytes, str]:
    request_id = f"sentinel-{uuid.uuid4()}"
    request = {"jsonrpc": "2.0", "method": "echo", "params": [request_id], "id": request_id}
    return json.dumps(request).encode() + b"\n", request_id


def answered(responses: list[Any], request_id: str) -> bool:
    hits = [r for r in responses if isinstance(r, dict) and r.get("id") == request_id]
    assert hits in ([], [{"jsonrpc": "2.0", "result": [request_id], "id": request_id}])
    return bool(hits)


def assert_alive(path: Path) -> None:
    line, request_id = sentinel()
    assert answered(send_and_collect(path, line), request_id)


def too_long(data: bytes) -> bool:
    """Whether the server meets a line over the limit (the last, unterminated piece counts)."""
    return any(len(line) > MAX_LINE for line in data.split(b"\n"))


# --- arbitrary bytes -----------------------------------------------------------------

garbage = st.one_of(
    st.binary(max_size=6000),
    st.lists(
        st.one_of(
            st.binary(max_size=300),
            st.text(max_size=300).map(str.encode),
            st.sampled_from(
                [
                    b"",
                    b" ",
                    b"\r",
                    b"[]",
                    b"{}",
                    b"[1]",
                    b"null",
                    b"\xff",
                    b"\xc3",
                    b'{"jsonrpc":"2.0"',
                ]
            ),
        ),
        max_size=40,
    ).map(b"\n".join),
)


@FUZZ
@given(data=garbage)
def test_arbitrary_bytes(sock_path: Path, data: bytes) -> None:
    line, request_id = sentinel()
    # Same connection: terminate the garbage so the sentinel starts a line of its own.
    stream = data + b"\n" + line
    responses = send_and_collect(sock_path, stream)
    assert answered(responses, request_id) is not too_long(stream)
    # Garbage with its last line cut off, then the client goes away.
    send_and_collect(sock_path, data)
    assert_alive(sock_path)


# --- truncated requests --------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.text()
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


@FUZZ
@given(
    params=json_values,
    cut=st.floats(min_value=0, max_value=1, exclude_max=True),
    with_newline=st.booleans(),
)
def test_truncated_request(sock_path: Path, params: Any, cut: float, with_newline: bool) -> None:
    full = json.dumps({"jsonrpc": "2.0", "method": "echo", "params": [params], "id": 1}).encode()
    part = full[: int(len(full) * cut)]
    if with_newline:
        line, request_id = sentinel()
        responses = send_and_collect(sock_path, part + b"\n" + line)
        others = [r for r in responses if not (isinstance(r, dict) and r["id"] == request_id)]
        if too_long(part):
            assert others[0]["error"]["data"]["kind"] == "payload_too_large"
        else:
            assert answered(responses, request_id)
            if part.strip():
                assert [r["error"]["code"] for r in others] == [-32700]
    else:
        send_and_collect(sock_path, part)  # the client dies mid-line
    assert_alive(sock_path)


# --- huge lines ----------------------------------------------------------------------


@FUZZ
@given(
    length=st.one_of(st.integers(MAX_LINE - 3, MAX_LINE + 3), st.integers(0, 6 * MAX_LINE)),
    terminated=st.booleans(),
)
def test_line_length(sock_path: Path, length: int, terminated: bool) -> None:
    request = json.dumps({"jsonrpc": "2.0", "method": "echo", "params": ["x"], "id": 7}).encode()
    line = (request + b" " * (length - len(request))) if length >= len(request) else b" " * length
    responses = send_and_collect(sock_path, line + (b"\n" if terminated else b""))
    if length > MAX_LINE:
        assert [r["error"]["data"]["kind"] for r in responses] == ["payload_too_large"]
        assert responses[0]["id"] is None
    elif length >= len(request) and terminated:
        assert responses == [{"jsonrpc": "2.0", "result": ["x"], "id": 7}]
    elif length >= len(request):
        assert responses == []  # unfinished at end of stream: not a message
    else:
        assert responses == []  # blank line
    assert_alive(sock_path)


# --- random JSON values and request-shaped objects ----------------------------------

valid_ids = st.one_of(
    st.none(), st.integers(), st.text(max_size=10), st.floats(allow_nan=False, allow_infinity=False)
)
structured = st.one_of(
    st.lists(json_values, max_size=3), st.dictionaries(st.text(max_size=5), json_values, max_size=3)
)
well_formed = st.fixed_dictionaries(
    {"jsonrpc": st.just("2.0"), "method": st.sampled_from(["echo", "echo", "nope", "rpc.x"])},
    optional={"params": structured, "id": valid_ids},
)
anything_goes = st.fixed_dictionaries(
    {},
    optional={
        "jsonrpc": st.one_of(st.just("2.0"), json_values),
        "method": st.one_of(st.just("echo"), json_values),
        "params": st.one_of(structured, json_values),
        "id": st.one_of(valid_ids, st.booleans(), st.lists(st.integers(), max_size=2)),
        "extra": json_values,
    },
)
requests = st.one_of(well_formed, anything_goes)
messages = st.one_of(json_values, requests, st.lists(st.one_of(requests, json_values), max_size=6))


def expected(message: Any) -> Any:
    """What the JSON-RPC 2.0 spec (plus memd's id echo for invalid requests) prescribes:
    a (code-or-result, id) pair, None for no response, or a list of pairs for a batch."""
    if isinstance(message, list):
        if not message:
            return ("error", -32600, None)
        items = [expected_one(m) for m in message]
        return sorted((i for i in items if i is not None), key=repr) or None
    return expected_one(message)


def expected_one(message: Any) -> Any:
    valid_id = isinstance(message, dict) and _valid_id(message.get("id"))
    answer_id = message.get("id") if valid_id else None
    if not (
        isinstance(message, dict)
        and message.get("jsonrpc") == "2.0"
        and isinstance(message.get("method"), str)
        and ("params" not in message or isinstance(message["params"], dict | list))
        and ("id" not in message or valid_id)
        and set(message) <= {"jsonrpc", "method", "params", "id"}
    ):
        return ("error", -32600, answer_id)
    if "id" not in message:
        return None
    if message["method"] != "echo":
        return ("error", -32601, answer_id)
    return ("result", json.dumps(message.get("params")), answer_id)


def _valid_id(value: Any) -> bool:
    return value is None or (isinstance(value, str | int | float) and not isinstance(value, bool))


def observed(response: Any) -> Any:
    if isinstance(response, list):
        return sorted((observed(r) for r in response), key=repr)
    if "error" in response:
        return ("error", response["error"]["code"], response["id"])
    return ("result", json.dumps(response["result"]), response["id"])


@FUZZ
@given(message=messages)
def test_random_messages(sock_path: Path, message: Any) -> None:
    line, request_id = sentinel()
    encoded = json.dumps(message).encode()
    responses = send_and_collect(sock_path, encoded + b"\n" + line)
    if too_long(encoded):
        assert [r["error"]["data"]["kind"] for r in responses] == ["payload_too_large"]
        return
    assert answered(responses, request_id)
    others = [
        observed(r) for r in responses if not (isinstance(r, dict) and r.get("id") == request_id)
    ]
    want = expected(message)
    assert others == ([] if want is None else [want])
