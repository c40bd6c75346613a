"""The trust rule: memd uses only what its own uid owns and nobody else can write.

Threat model (docs/security.md): other local users. Not root, and not the user's own
processes, which can read and write everything memd can anyway.

- `memory_dir`, each client folder and every folder memd opens below it must be a real
  folder (not a symlink) owned by memd's uid and not writable by group or others; else
  the client is refused (`memory_dir` itself: the daemon) with an `UntrustedPath` that
  names the path and the command that fixes it.
- A folder that passes can only be changed by memd's uid or root, so after the check a
  file in it can only be a symlink if the user put it there. memd still opens the last
  component with `O_NOFOLLOW` everywhere it writes or serves, so a link planted before
  the check (or by a careless tool) is refused rather than followed out of memory_dir.
- Recall serves only regular files of memd's uid, opened that way (`open_served`).
- The socket's parent chain, and memory_dir's, are checked as OpenSSH's StrictModes
  checks `authorized_keys` (`check_chain`): every folder from `/` down must belong to root
  or memd's uid and not be writable by group or others, except a sticky-bit folder (like
  /tmp), where nobody may rename or remove another user's entries.
- `PRIVATE_UMASK` is set at start so every file memd and its children create is 0600 and
  every folder 0700 (sqlite's WAL and SHM, Milvus Lite's files, logs, specs).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable
from pathlib import Path

PRIVATE_UMASK = 0o077
_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH


class UntrustedPath(Exception):
    """A path memd must not use; the message names it, what is wrong, and the fix."""

    def __init__(self, path: Path | str, problem: str, fix: str) -> None:
        self.path = str(path)
        self.problem = problem
        self.fix = fix
        super().__init__(f"{path} {problem}; {fix}")


def _owner_fix(path: Path | str, uid: int) -> str:
    return (
        f"another user may have put it there: remove it, or if it is yours, run "
        f"`chown -R {os.geteuid()} {path}` (it belongs to uid {uid})"
    )


def _require_owner(path: Path | str, st: os.stat_result) -> None:
    """Refuse `path` unless memd's uid owns it (folders and files alike)."""
    if st.st_uid != os.geteuid():
        raise UntrustedPath(
            path,
            f"is owned by uid {st.st_uid}, not by memd's uid {os.geteuid()}",
            _owner_fix(path, st.st_uid),
        )


def check_dir(path: Path | str, *, follow: bool = False) -> os.stat_result:
    """A folder memd may use: real (no symlink, unless `follow`), ours, not writable by others.

    Raises FileNotFoundError when it is missing, UntrustedPath when it must not be used.
    """
    st = os.stat(path) if follow else os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise UntrustedPath(
            path,
            "is a symlink, and memd follows none under memory_dir",
            f"replace it with a real folder (`rm {path}` and let memd "
            "create it) or point memd's memory_dir at the target",
        )
    if not stat.S_ISDIR(st.st_mode):
        raise UntrustedPath(path, "is not a folder", f"move it away: `mv {path} {path}.old`")
    _require_owner(path, st)
    if st.st_mode & _OTHERS_WRITE:
        raise UntrustedPath(
            path,
            "is writable by group or others, so another user could replace what memd keeps there",
            f"run `chmod 700 {path}`",
        )
    return st


def ensure_dir(path: Path | str, *, follow: bool = False) -> None:
    """Create a missing folder 0700 (one level), then hold it to `check_dir`."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    check_dir(path, follow=follow)


def ensure_tree(root: Path, *parts: str) -> Path:
    """`root/parts...`, each level created 0700 if missing and checked."""
    current = root
    for part in parts:
        current = current / part
        ensure_dir(current)
    return current


def check_file(path: Path | str, *, tighten: bool = True) -> bool:
    """A file memd reopens (state database, WAL, spec, pidfile): regular and ours.

    Returns False when it is missing. A file of ours that others may read is made 0600
    (an older memd created some files 0644); a symlink, another type, another owner, or
    one others can write raise UntrustedPath.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(st.st_mode):
        raise UntrustedPath(path, "is a symlink", f"remove it: `rm {path}`")
    if not stat.S_ISREG(st.st_mode):
        raise UntrustedPath(path, "is not a regular file", f"move it away: `mv {path} {path}.old`")
    _require_owner(path, st)
    if st.st_mode & _OTHERS_WRITE:
        raise UntrustedPath(path, "is writable by group or others", f"run `chmod 600 {path}`")
    if tighten and st.st_mode & 0o077:
        os.chmod(path, 0o600, follow_symlinks=False)
    return True


def private_folder(folder: Path, error: Callable[[str], Exception]) -> None:
    """Make `folder` 0700 (its parents too), or check the one there: a real folder of
    memd's uid that group and others cannot open; else `error(message)` is raised.

    For folders of secrets (the proxy's keys, the browser's login tokens): a file in one
    proves something only while nobody else could have put it there or read it.
    """
    folder.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        folder.mkdir(mode=0o700)
        os.chmod(folder, 0o700)
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode):
        raise error(f"{folder} is not a directory")
    if st.st_uid != os.geteuid():
        raise error(f"{folder} belongs to uid {st.st_uid}, not to us")
    if st.st_mode & 0o077:
        raise error(f"{folder} is open to group or others; run `chmod 700 {folder}`")


def private_file(st: os.stat_result) -> bool:
    """Whether a stat is of a regular file of memd's uid that group and others cannot
    open: a secret read from anything else proves nothing."""
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o077


def fsync_dir(path: Path | str) -> None:
    """Make a created, removed or renamed entry in folder `path` durable.

    A file replaced with `os.replace` is durable only once its folder is synced too: the
    rename lives in the folder. Every module that replaces files calls this, from the
    base layer, so the ones that may not import memd.markdown need no copy of it.
    """
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def open_nofollow(path: Path | str, flags: int, mode: int = 0o600) -> int:
    """`os.open` that never follows a symlink in the last component (ELOOP -> UntrustedPath)."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UntrustedPath(
                path,
                "is a symlink, and memd writes through none",
                f"remove it (`rm {path}`); memd creates the file again",
            ) from None
        raise


def open_served(path: Path | str) -> int | None:
    """A file recall may read: opened without following a symlink, regular, ours, and not
    writable by others. None (closed) for anything else, including a missing file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & _OTHERS_WRITE:
        os.close(fd)
        return None
    return fd


def inside(path: Path, root: Path) -> bool:
    """`path` lies below `root` lexically (after `..` and `.` are folded), no resolving."""
    folded = Path(os.path.normpath(path))
    return folded != root and folded.is_relative_to(root)


def trusted_below(path: Path, root: Path) -> bool:
    """Every folder between `root` (exclusive) and `path`'s parent passes `check_dir`."""
    folded = Path(os.path.normpath(path))
    if not inside(folded, root):
        return False
    current = root
    for part in folded.parent.relative_to(root).parts:
        current = current / part
        try:
            check_dir(current)
        except (OSError, UntrustedPath):
            return False
    return True


def check_chain(folder: Path, what: str = "memd's socket", thing: str = "socket") -> None:
    """OpenSSH StrictModes for the folder holding `what`: see the module docstring.

    Both the folders as written and the ones they resolve to are checked, so a symlink
    on the way cannot lead through a folder others can write. `thing` names what another
    user could put in its place, for the message.
    """
    seen: set[Path] = set()
    for base in (Path(os.path.abspath(folder)), Path(folder).resolve()):
        for current in (base, *base.parents):
            if current in seen:
                continue
            seen.add(current)
            _check_ancestor(current, what, thing)


def _check_ancestor(path: Path, what: str, thing: str) -> None:
    st = os.stat(path)
    uid = os.geteuid()
    if st.st_uid not in (0, uid):
        raise UntrustedPath(
            path,
            f"(on the way to {what}) is owned by uid {st.st_uid}, who could replace the {thing}",
            f"choose a {thing} path whose folders belong to you or root",
        )
    if st.st_mode & _OTHERS_WRITE and not st.st_mode & stat.S_ISVTX:
        raise UntrustedPath(
            path,
            f"(on the way to {what}) is writable by group or others, who could rename "
            f"what is below it and put their own {thing} in its place",
            f"run `chmod go-w {path}` or choose another {thing} path",
        )


def check_memory_dir(path: Path) -> None:
    """memory_dir must pass `check_dir` (a symlink to a folder of ours is fine here: the
    user may keep memory elsewhere), and so must the folders above it by the socket's
    rule (`check_chain`): whoever can write one of them can rename memory_dir away and
    put their own folder in its place, where memd would write acknowledged transcripts.
    Checked at start and whenever a client folder is opened."""
    try:
        check_dir(path, follow=True)
        check_chain(path.parent, "memory_dir", "folder")
    except UntrustedPath as exc:
        raise UntrustedPath(exc.path, f"(memory_dir {path}) {exc.problem}", exc.fix) from None


def ensure_memory_dir(path: Path) -> None:
    """memory_dir, created 0700 if missing, must pass `check_memory_dir`; else memd does
    not start."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    check_memory_dir(path)
