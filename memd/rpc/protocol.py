"""JSON-RPC 2.0 layers above the socket: method registry, param checks, framing, dispatch.

Layers, bottom up: `decode`/`encode` turn one line into one JSON value and back;
`Dispatcher` answers a decoded message exactly as the JSON-RPC 2.0 spec says;
`memd.rpc.server.RpcServer` owns the socket file and its connections.

Framing: one message (request, notification or batch) per line, UTF-8, `\\n`-terminated;
blank lines are ignored. Responses are ASCII JSON (non-ASCII escaped), one per line.

Ordering: each request runs as its own task, so responses on one connection are written in
**completion order**, not request order; clients match them by `id`. A slow call never holds
up a fast one, on the same connection or another. Pipelining is bounded: past
`max_inflight` unanswered requests a connection stops being read until one completes.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import math
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, TypeVar, overload

import structlog

from memd.errors import (
    InternalError,
    InvalidParams,
    InvalidRequest,
    MethodNotFound,
    ParseError,
    PayloadTooLarge,
    RpcError,
)

log = structlog.get_logger()

MAX_LINE = 8 * 1024 * 1024
MAX_BATCH = 1000

JsonParams = dict[str, Any] | list[Any] | None
Handler = Callable[[JsonParams], Awaitable[Any]]
H = TypeVar("H", bound=Handler)
T = TypeVar("T")


# --- method registry and param checks -------------------------------------------------


class Registry:
    """Method name -> async handler. Handlers raise `memd.errors` classes for known failures."""

    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}

    def add(self, name: str, handler: Handler) -> None:
        """Register `handler` for `name`; registering a name twice is a bug, not an update."""
        if not name or name.startswith("rpc."):
            raise ValueError(f"invalid method name {name!r} (names starting 'rpc.' are reserved)")
        if name in self._handlers:
            raise ValueError(f"method {name!r} is already registered")
        call = getattr(handler, "__call__", None)  # noqa: B004 - async callables count too
        if not (inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call)):
            raise TypeError(f"handler for {name!r} must be an async function")
        self._handlers[name] = handler

    def method(self, name: str) -> Callable[[H], H]:
        """Decorator form of `add`."""

        def register(handler: H) -> H:
            self.add(name, handler)
            return handler

        return register

    def get(self, name: str) -> Handler | None:
        return self._handlers.get(name)

    def names(self) -> list[str]:
        return sorted(self._handlers)

    def __contains__(self, name: object) -> bool:
        return name in self._handlers


_JSON_NAMES: dict[type, str] = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "a boolean",
    dict: "an object",
    list: "an array",
    type(None): "null",
}


class Params:
    """Named params of one call, taken one at a time so every error names the param at fault.

        p = Params(params)
        client_id = p.require("client_id", str)
        top_k = p.optional("top_k", int, 5)
        p.done()                      # or use `with Params(params) as p:`

    `done()` rejects params nobody asked for: a typo must not be silently ignored. `int`
    never accepts a boolean; `float` also accepts an integer (returned as float). An optional
    param given as null counts as absent.
    """

    __slots__ = ("_given", "_taken")

    def __init__(self, params: JsonParams) -> None:
        if params is None:
            params = {}
        if not isinstance(params, dict):
            raise InvalidParams("params must be an object (named params)")
        self._given: dict[str, Any] = params
        self._taken: set[str] = set()

    @overload
    def require(self, name: str, typ: type[T]) -> T: ...
    @overload
    def require(self, name: str, typ: tuple[type, ...]) -> Any: ...
    def require(self, name: str, typ: type | tuple[type, ...]) -> Any:
        self._taken.add(name)
        if name not in self._given:
            raise InvalidParams(f"missing param {name!r}", data={"param": name})
        return _check(name, self._given[name], typ)

    @overload
    def optional(self, name: str, typ: type[T], default: T) -> T: ...
    @overload
    def optional(self, name: str, typ: type[T], default: None = None) -> T | None: ...
    @overload
    def optional(self, name: str, typ: tuple[type, ...], default: Any = None) -> Any: ...
    def optional(self, name: str, typ: type | tuple[type, ...], default: Any = None) -> Any:
        self._taken.add(name)
        value = self._given.get(name)
        return default if value is None else _check(name, value, typ)

    def done(self) -> None:
        unknown = sorted(self._given.keys() - self._taken)
        if unknown:
            names = ", ".join(repr(n) for n in unknown)
            raise InvalidParams(f"unknown param {names}", data={"param": unknown[0]})

    def __enter__(self) -> Params:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        if et is None:
            self.done()


def _check(name: str, value: Any, typ: type | tuple[type, ...]) -> Any:
    types = typ if isinstance(typ, tuple) else (typ,)
    if object in types:
        return value
    if isinstance(value, bool):
        ok = bool in types
    elif type(value) is int and float in types and int not in types:
        with contextlib.suppress(OverflowError):
            return float(value)
        ok = False
    else:
        ok = isinstance(value, types)
    if not ok:
        want = " or ".join(_JSON_NAMES.get(t, t.__name__) for t in types)
        got = _JSON_NAMES.get(type(value), type(value).__name__)
        raise InvalidParams(f"param {name!r} must be {want}, got {got}", data={"param": name})
    return value


# --- framing --------------------------------------------------------------------------


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON")


_loads = json.JSONDecoder(parse_constant=_reject_constant).decode
_dumps = json.JSONEncoder(allow_nan=False, separators=(",", ":")).encode


def decode(line: bytes) -> Any:
    """One line -> one JSON value; anything that is not strict UTF-8 JSON is a ParseError."""
    try:
        return _loads(line.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ParseError(f"Parse error: invalid UTF-8 at byte {exc.start}") from None
    except RecursionError:
        raise ParseError("Parse error: JSON nested too deeply") from None
    except ValueError as exc:
        raise ParseError(f"Parse error: {exc}") from None


def encode(response: dict[str, Any] | list[dict[str, Any]]) -> bytes:
    """A response (or batch of them) -> one newline-terminated line.

    Each response is encoded alone, so one result that is not JSON (an object, NaN) turns
    into a -32603 for its own id instead of breaking the whole batch.
    """
    if isinstance(response, list):
        return ("[" + ",".join(map(_encode_one, response)) + "]\n").encode()
    return (_encode_one(response) + "\n").encode()


def _encode_one(response: dict[str, Any]) -> str:
    try:
        return _dumps(response)
    except (TypeError, ValueError, RecursionError) as exc:
        log.error("rpc.result_not_json", id=response.get("id"), error=repr(exc)[:200])
        request_id = response.get("id")
        try:
            _dumps(request_id)
        except (TypeError, ValueError, RecursionError):
            request_id = None  # every request gets a reply, even one whose id cannot be echoed
        return _dumps(error_response(InternalError("result is not JSON-serializable"), request_id))


def error_response(exc: RpcError, request_id: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "error": exc.to_dict(), "id": request_id}


# --- dispatch -------------------------------------------------------------------------

_REQUEST_KEYS = frozenset(("jsonrpc", "method", "params", "id"))


def _valid_id(value: Any) -> bool:
    """A string, a number that can be echoed (1e999 parses as infinity: it cannot) or null."""
    if isinstance(value, float):
        return math.isfinite(value)
    return value is None or (isinstance(value, str | int) and not isinstance(value, bool))


def _request_id(message: Any) -> Any:
    """The id to answer an invalid request with: its own if usable, else null."""
    if isinstance(message, dict):
        value = message.get("id")
        if _valid_id(value):
            return value
    return None


def _parse_request(message: Any) -> tuple[str, JsonParams, Any, bool]:
    """(method, params, id, is_notification), or InvalidRequest naming what is wrong."""
    if not isinstance(message, dict):
        raise InvalidRequest("Invalid Request: expected a request object")
    if message.get("jsonrpc") != "2.0":
        raise InvalidRequest('Invalid Request: "jsonrpc" must be "2.0"')
    method = message.get("method")
    if not isinstance(method, str):
        raise InvalidRequest('Invalid Request: "method" must be a string')
    params = message.get("params")
    if "params" in message and not isinstance(params, dict | list):
        raise InvalidRequest('Invalid Request: "params" must be an object or an array')
    notify = "id" not in message
    if not notify and not _valid_id(message["id"]):
        raise InvalidRequest('Invalid Request: "id" must be a string, a number or null')
    if not message.keys() <= _REQUEST_KEYS:
        extra = ", ".join(sorted(repr(k) for k in message.keys() - _REQUEST_KEYS))
        raise InvalidRequest(f"Invalid Request: unknown member {extra}")
    return method, params, message.get("id"), notify


class Dispatcher:
    """Decoded messages -> responses, per JSON-RPC 2.0: no response for notifications, even
    failed ones; batches answered as one array without the notifications' entries."""

    def __init__(self, registry: Registry, max_batch: int = MAX_BATCH) -> None:
        self.registry = registry
        self.max_batch = max_batch

    async def handle_line(self, line: bytes) -> bytes | None:
        """The whole pipeline for one line, for callers that are not a socket."""
        try:
            message = decode(line)
        except ParseError as exc:
            return encode(error_response(exc, None))
        response = await self.dispatch(message)
        return None if response is None else encode(response)

    async def dispatch(self, message: Any) -> dict[str, Any] | list[dict[str, Any]] | None:
        if not isinstance(message, list):
            return await self.call(message)
        if not message:
            return error_response(InvalidRequest("Invalid Request: empty batch"), None)
        if len(message) > self.max_batch:
            exc = PayloadTooLarge(
                f"batch of {len(message)} exceeds the limit of {self.max_batch}",
                data={"limit": self.max_batch},
            )
            return error_response(exc, None)
        responses = await asyncio.gather(*map(self.call, message))
        return [r for r in responses if r is not None] or None

    async def call(self, message: Any) -> dict[str, Any] | None:
        """One request object -> its response, or None for a notification."""
        try:
            method, params, request_id, notify = _parse_request(message)
        except InvalidRequest as exc:
            return error_response(exc, _request_id(message))
        try:
            handler = self.registry.get(method)
            if handler is None:
                raise MethodNotFound(f"Method not found: {method!r}", data={"method": method})
            result = await handler(params)
        except RpcError as exc:
            return None if notify else error_response(exc, request_id)
        except Exception as exc:
            log.exception("rpc.handler_failed", method=method)
            error = InternalError(data={"method": method, "exception": type(exc).__name__})
            return None if notify else error_response(error, request_id)
        return None if notify else {"jsonrpc": "2.0", "result": result, "id": request_id}
