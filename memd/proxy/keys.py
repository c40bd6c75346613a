"""Per-client bearer keys of the proxy: created, shown and rotated by `memd proxy key`.

The proxy's port is reachable by every local user, unlike memd's socket, so each request
must carry a key that memd issued to one client. The key names its client
(`sk-memd~<client_id>~<secret>`; `~` occurs in neither part), so checking one is a file
read of that client's key and a constant-time compare, with no table of all keys.

Keys live in `<memory_dir>/.proxy/<client_id>.key`: the folder is 0700, each file 0600,
written atomically and never through a symlink. `.proxy` can never be a client id (ids
start with a letter or digit). The proxy re-reads a key file when its inode or mtime
changes, so a rotation takes effect on the next request without a restart.
"""

from __future__ import annotations

import contextlib
import hmac
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from memd.config import CLIENT_ID_RE
from memd.trust import fsync_dir, private_file, private_folder

PREFIX = "sk-memd~"
FOLDER = ".proxy"


class KeyStoreError(Exception):
    """The key folder or a key file is unsafe or unreadable."""


@dataclass(frozen=True)
class _Cached:
    signature: tuple[int, int, int]
    key: str


def parse_key(token: str) -> str | None:
    """The client id a well-formed key names, or None for anything else.

    memd's keys are ASCII; a header with other characters (aiohttp hands them over as
    surrogate escapes, which `str.encode` refuses) is malformed, a 401 like any other."""
    if not token.isascii() or not token.startswith(PREFIX):
        return None
    client_id, sep, secret = token[len(PREFIX) :].partition("~")
    if not sep or not secret or "~" in secret or not CLIENT_ID_RE.match(client_id):
        return None
    return client_id


class KeyStore:
    """The proxy keys under one memory_dir."""

    def __init__(self, memory_dir: Path) -> None:
        self.folder = Path(memory_dir) / FOLDER
        self._cache: dict[str, _Cached] = {}

    def path(self, client_id: str) -> Path:
        if not CLIENT_ID_RE.match(client_id) or client_id in (".", ".."):
            raise KeyStoreError(f"invalid client id {client_id!r}")
        return self.folder / f"{client_id}.key"

    # --- for `memd proxy key` ---------------------------------------------------------

    def get(self, client_id: str) -> str | None:
        """The client's current key, or None when it has none yet."""
        path = self.path(client_id)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise KeyStoreError(f"cannot read {path}: {exc.strerror}") from exc
        with os.fdopen(fd, "r", encoding="utf-8") as fh:
            return fh.read().strip() or None

    def ensure(self, client_id: str) -> tuple[str, bool]:
        """The client's key, created if it has none; the flag says whether it is new."""
        current = self.get(client_id)
        if current is not None:
            return current, False
        return self.rotate(client_id), True

    def rotate(self, client_id: str) -> str:
        """A fresh key for the client; the old one stops working at once."""
        key = f"{PREFIX}{client_id}~{secrets.token_urlsafe(32)}"
        self._write(self.path(client_id), key)
        return key

    # --- for the proxy ----------------------------------------------------------------

    def client_for(self, token: str) -> str | None:
        """The client a bearer token belongs to, or None (malformed, unknown or stale)."""
        client_id = parse_key(token)
        if client_id is None:
            return None
        try:
            current = self._current(client_id)
        except KeyStoreError:
            return None
        if current is None or not hmac.compare_digest(current.encode(), token.encode()):
            return None
        return client_id

    def _current(self, client_id: str) -> str | None:
        path = self.path(client_id)
        try:
            st = os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            self._cache.pop(client_id, None)
            return None
        except OSError as exc:
            raise KeyStoreError(str(exc)) from exc
        signature = (st.st_ino, st.st_mtime_ns, st.st_size)
        cached = self._cache.get(client_id)
        if cached is not None and cached.signature == signature:
            return cached.key
        if not private_file(st):
            return None  # not ours, or readable by others: such a key proves nothing
        key = self.get(client_id)
        if key is None:
            return None
        self._cache[client_id] = _Cached(signature, key)
        return key

    def _write(self, path: Path, key: str) -> None:
        self._prepare_folder()
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        fd = os.open(
            tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(key + "\n")
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
            fsync_dir(path.parent)  # the new name survives a crash too
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def _prepare_folder(self) -> None:
        private_folder(self.folder, KeyStoreError)
