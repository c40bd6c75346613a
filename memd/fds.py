"""File descriptors: memd's open-file limit, and how many connections a listener may hold.

Every connection to one of memd's listeners (the socket, the proxy, the embedding
endpoint) is a descriptor, and so is every file, pipe and /proc read supervision needs.
Most shells start a process with a soft limit of 1,024 while the hard limit allows far
more; 1,100 idle connections from another user to the proxy's port once used them all,
and memd could neither answer its socket nor read /proc. So memd raises its soft limit
to the hard one at start (`raise_open_files`), and each HTTP listener caps its
connections (`listener_cap`) so that `RESERVE` descriptors always stay free for the
socket and supervision, whatever the limit turned out to be.
"""

from __future__ import annotations

import resource

RESERVE = 512  # descriptors no listener may take: the socket's clients, children, files
MIN_CAP = 16  # a listener serves at least this many connections, even on a tiny limit


def open_files_limit() -> int:
    """The soft limit in force (a large number for "unlimited")."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return 1 << 20 if soft == resource.RLIM_INFINITY else int(soft)


def raise_open_files() -> tuple[int, int]:
    """Raise the soft open-file limit to the hard one; (before, after). Children inherit it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):  # e.g. macOS refuses RLIM_INFINITY for files
            return int(soft), int(soft)
    return int(soft), int(hard)


def listener_cap(wanted: int, per_connection: int = 1, listeners: int = 2) -> int:
    """How many connections one listener may hold: `wanted`, lowered so that `listeners`
    such listeners, each connection costing `per_connection` descriptors, leave
    `RESERVE` free under the current soft limit."""
    room = max(0, open_files_limit() - RESERVE) // max(1, per_connection * listeners)
    return max(MIN_CAP, min(wanted, room))
