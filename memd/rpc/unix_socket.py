"""Setting up memd's Unix socket safely: the folder, the lock, a stale socket, bind, peer uid.

The socket is created 0600 in a folder of memd's own that no one else can write to (nor
any folder on the way from `/`), owned by one server at a time through `<socket>.lock`.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import socket
import stat
import struct
from pathlib import Path
from typing import Any

import structlog

from memd import trust

log = structlog.get_logger()


class SocketSetupError(Exception):
    """The socket cannot be set up safely, so memd must not start serving."""


class SocketInUse(SocketSetupError):
    """Another process (a live memd, or anything answering) already listens on the path."""


def prepare_dir(directory: Path) -> None:
    """Create missing directories 0700; refuse an existing one that others could write to,
    and any folder on the way from `/` that others could use to swap it (trust.check_chain:
    OpenSSH's StrictModes rule)."""
    missing = []
    current = directory
    while not current.exists():
        missing.append(current)
        current = current.parent
    _check_chain(current if missing else directory.parent)  # the folder itself: below
    for path in reversed(missing):
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:
            continue
        os.chmod(path, 0o700)  # mkdir's mode is filtered by the umask
    st = os.stat(directory)
    if not stat.S_ISDIR(st.st_mode):
        raise SocketSetupError(f"{directory} is not a directory")
    if st.st_uid != os.geteuid():
        raise SocketSetupError(
            f"{directory} belongs to uid {st.st_uid}, not to us; "
            "put the socket in a directory of your own"
        )
    if st.st_mode & 0o022:
        raise SocketSetupError(
            f"{directory} is writable by group or others, so the socket "
            f"could be replaced; run `chmod go-w {directory}` or choose "
            "another socket path"
        )
    _check_chain(directory)


def _check_chain(directory: Path) -> None:
    try:
        trust.check_chain(directory)
    except trust.UntrustedPath as exc:
        raise SocketSetupError(f"refusing socket {directory}: {exc}") from None


def lock(path: Path) -> int:
    lock_path = path.with_name(path.name + ".lock")
    try:
        fd = trust.open_nofollow(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    except trust.UntrustedPath as exc:
        raise SocketSetupError(f"cannot lock the socket: {exc}") from None
    except OSError as exc:
        raise SocketSetupError(
            f"cannot open the socket's lock file {lock_path}: {exc.strerror}"
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise SocketInUse(f"another memd is already listening on {path}") from None
    return fd


async def clear_stale(path: Path) -> None:
    """Remove a socket file that nobody answers on; never touch a live one or a non-socket."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise SocketSetupError(f"{path} exists and is not a socket; refusing to replace it")
    try:
        _reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(path), 2.0)
    except ConnectionRefusedError:
        os.unlink(path)
        log.info("rpc.stale_socket_removed", path=str(path))
        return
    except (TimeoutError, BlockingIOError):
        pass  # a listener with a full backlog is still a listener
    except OSError as exc:
        raise SocketSetupError(f"cannot probe existing socket {path}: {exc}") from exc
    else:
        writer.close()
    raise SocketInUse(f"another memd is already listening on {path}")


def bind(path: Path) -> socket.socket:
    """A bound, 0600, not-yet-listening socket: connect() fails until listen()."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
    except BaseException:
        sock.close()
        raise
    try:
        os.chmod(path, 0o600)
    except BaseException:
        sock.close()
        os.unlink(path)  # ours: we hold the lock and nothing was listening here
        raise
    return sock


def peer_cred(sock: Any) -> tuple[int | None, int | None]:
    """(pid, uid) of the peer; (None, None) where the platform cannot tell."""
    if hasattr(socket, "SO_PEERCRED"):  # Linux: struct ucred {pid_t; uid_t; gid_t}
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("iII"))
        pid, uid, _gid = struct.unpack("iII", raw)
        return pid, uid
    if hasattr(socket, "LOCAL_PEERCRED"):  # macOS/BSD: struct xucred {u_int version; uid_t; ...}
        raw = sock.getsockopt(0, socket.LOCAL_PEERCRED, struct.calcsize("IIh16I"))
        return None, struct.unpack_from("II", raw)[1]
    return None, None
