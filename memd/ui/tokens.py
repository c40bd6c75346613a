"""Single-use login tokens of the browser, passed from `memd ui` to the daemon as files.

Only memd's uid can make one: `memd ui` writes `<memory_dir>/.ui/login-<id>` (folder
0700, file 0600, never through a symlink) holding the whole token `<id>~<secret>`, and
prints a login link carrying it. The browser's login claims the file by unlinking it,
so a token works once (two logins racing with one token: one unlink wins), and only
while it is younger than `TOKEN_TTL`. A file not owned by memd's uid, or open to group
or others, proves nothing and is refused. `.ui` can never be a client id (ids start
with a letter or digit).
"""

from __future__ import annotations

import contextlib
import hmac
import os
import re
import secrets
import time
from pathlib import Path

from memd.trust import fsync_dir, private_file, private_folder

FOLDER = ".ui"
TOKEN_TTL = 600.0  # seconds a login link works
_TOKEN_RE = re.compile(r"^([0-9a-f]{16})~([A-Za-z0-9_-]{20,100})$")


class TokenError(Exception):
    """The token folder is unsafe, or a token file cannot be written."""


class LoginTokens:
    """The login tokens under one memory_dir."""

    def __init__(self, memory_dir: Path, ttl: float = TOKEN_TTL) -> None:
        self.folder = Path(memory_dir) / FOLDER
        self.ttl = ttl

    def issue(self) -> str:
        """A fresh token, on disk before it is returned; stale ones are swept first."""
        self._prepare_folder()
        self._sweep()
        ident = secrets.token_hex(8)
        token = f"{ident}~{secrets.token_urlsafe(32)}"
        path = self.folder / f"login-{ident}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(path, flags, 0o600)
        except OSError as exc:
            raise TokenError(f"cannot write {path}: {exc.strerror}") from exc
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(token + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        fsync_dir(self.folder)
        return token

    def claim(self, token: str) -> bool:
        """True once for a current token of memd's uid; the token is used up either way."""
        m = _TOKEN_RE.match(token)
        if m is None:
            return False
        path = self.folder / f"login-{m.group(1)}"
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return False
        with os.fdopen(fd, "r", encoding="utf-8", errors="replace") as fh:
            st = os.fstat(fh.fileno())
            stored = fh.read(200).strip()
        if not private_file(st):
            return False
        if not hmac.compare_digest(stored.encode(), token.encode()):
            return False
        try:
            os.unlink(path)  # the claim: of two logins with one token, one unlink wins
        except FileNotFoundError:
            return False
        return time.time() - st.st_mtime <= self.ttl

    def _sweep(self) -> None:
        now = time.time()
        for path in self.folder.glob("login-*"):
            with contextlib.suppress(OSError):
                if now - path.lstat().st_mtime > self.ttl:
                    path.unlink()

    def _prepare_folder(self) -> None:
        private_folder(self.folder, TokenError)
