"""JSON-RPC error classes: each carries its code and `data.kind`; memd's codes sit in one table."""

from __future__ import annotations

from collections.abc import Mapping
from enum import IntEnum
from typing import Any, ClassVar


class JsonRpcCode(IntEnum):
    """The codes JSON-RPC 2.0 itself defines; the kind is the member name in lower case."""

    PARSE_ERROR = -32700
    INVALID_REQUEST = -32600
    METHOD_NOT_FOUND = -32601
    INVALID_PARAMS = -32602
    INTERNAL_ERROR = -32603


class DomainCode(IntEnum):
    """memd's own codes (-32000..-32099); the kind a client sees is the member name in lower case.

    To add an error: add a member here (next free code), then a two-line `MemdError`
    subclass below that points at it. A released code is never reused for something else.
    """

    MEMD_ERROR = -32000
    UNKNOWN_CLIENT = -32001
    MEMORY_DISABLED = -32002
    UNSUPPORTED_MODE = -32003
    INVALID_ID = -32004
    STORAGE_ERROR = -32005
    INDEX_UNAVAILABLE = -32006
    TIMEOUT = -32007
    PAYLOAD_TOO_LARGE = -32008
    NOT_FOUND = -32009
    COMPACTION_ERROR = -32010
    EXCHANGE_CONFLICT = -32011
    BUSY = -32012  # a bound is full, or a forget is rewriting the client's files: retry later


DOMAIN_RANGE = range(-32099, -31999)

_BY_CODE: dict[int, type[RpcError]] = {}


class RpcError(Exception):
    """An error that becomes a JSON-RPC error object; handlers raise these on purpose.

    `kind` is the stable, machine-readable name clients branch on (`data.kind`); the message
    is for people and may change. Extra `data` keys travel next to `kind`.
    """

    code: ClassVar[int] = JsonRpcCode.INTERNAL_ERROR
    default_kind: ClassVar[str] = "internal_error"
    default_message: ClassVar[str] = "Internal error"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Register each class that brings its own code, so codes stay unique and decodable."""
        super().__init_subclass__(**kwargs)
        code = cls.__dict__.get("code")
        if code is None:
            return
        if int(code) in _BY_CODE:
            raise TypeError(f"error code {int(code)} is taken by {_BY_CODE[int(code)].__name__}")
        if "default_kind" not in cls.__dict__:
            cls.default_kind = code.name.lower()
        _BY_CODE[int(code)] = cls

    def __init__(
        self,
        message: str | None = None,
        *,
        kind: str | None = None,
        data: Mapping[str, Any] | None = None,
    ) -> None:
        self.message = message or self.default_message
        self.kind = kind or self.default_kind
        self.data = dict(data) if data else {}
        super().__init__(self.message)

    def to_dict(self) -> dict[str, Any]:
        """The response's `error` member; `kind` wins over a `kind` key in data."""
        return {
            "code": int(self.code),
            "message": self.message,
            "data": {**self.data, "kind": self.kind},
        }


class ParseError(RpcError):
    code = JsonRpcCode.PARSE_ERROR
    default_message = "Parse error"


class InvalidRequest(RpcError):
    code = JsonRpcCode.INVALID_REQUEST
    default_message = "Invalid Request"


class MethodNotFound(RpcError):
    code = JsonRpcCode.METHOD_NOT_FOUND
    default_message = "Method not found"


class InvalidParams(RpcError):
    code = JsonRpcCode.INVALID_PARAMS
    default_message = "Invalid params"


class InternalError(RpcError):
    code = JsonRpcCode.INTERNAL_ERROR
    default_message = "Internal error"


class MemdError(RpcError):
    """memd's own errors. Raise a subclass; raise the base only with a kind of its own."""

    code = DomainCode.MEMD_ERROR
    default_message = "memd error"

    def __init__(
        self, message: str, kind: str | None = None, data: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__(message, kind=kind, data=data)


class UnknownClient(MemdError):
    code = DomainCode.UNKNOWN_CLIENT


class ClientDisabled(MemdError):
    code = DomainCode.MEMORY_DISABLED


class UnsupportedMode(MemdError):
    code = DomainCode.UNSUPPORTED_MODE


class InvalidId(MemdError):
    code = DomainCode.INVALID_ID


class StorageError(MemdError):
    code = DomainCode.STORAGE_ERROR


class IndexUnavailable(MemdError):
    code = DomainCode.INDEX_UNAVAILABLE


class Timeout(MemdError):
    code = DomainCode.TIMEOUT


class PayloadTooLarge(MemdError):
    code = DomainCode.PAYLOAD_TOO_LARGE


class NotFound(MemdError):
    code = DomainCode.NOT_FOUND


class CompactionError(MemdError):
    """A compaction request that cannot run (kind `compaction_disabled`: compaction is off)."""

    code = DomainCode.COMPACTION_ERROR


class ExchangeConflict(MemdError):
    code = DomainCode.EXCHANGE_CONFLICT


class Busy(MemdError):
    code = DomainCode.BUSY


def error_class(code: int) -> type[RpcError]:
    """The class for a code: unknown domain codes map to MemdError, anything else to RpcError."""
    cls = _BY_CODE.get(code)
    if cls is not None:
        return cls
    return MemdError if code in DOMAIN_RANGE else RpcError


def error_from_dict(error: Mapping[str, Any]) -> RpcError:
    """Rebuild the exception from a response's `error` member (for clients and tests).

    An unknown code is kept on the instance rather than masked by the class default.
    """
    code = error.get("code")
    raw = error.get("data")
    data = dict(raw) if isinstance(raw, Mapping) else ({"value": raw} if raw is not None else {})
    kind = data.pop("kind", None)
    message = str(error.get("message") or "")
    if not isinstance(code, int) or isinstance(code, bool):
        return RpcError(message, kind=kind, data=data)
    cls = error_class(code)
    exc = cls(message, kind=kind, data=data)
    if cls.code != code:
        exc.code = code  # type: ignore[misc]
    return exc
