"""sd_notify for `Type=notify` units: READY, STATUS, WATCHDOG, STOPPING.

The protocol is one datagram to $NOTIFY_SOCKET; outside systemd every call is a no-op.
"""

from __future__ import annotations

import os
import socket


class SystemdNotifier:
    """Sends state lines to systemd when memd runs under it."""

    def __init__(self, environ: dict[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self.address = env.get("NOTIFY_SOCKET", "")
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        wanted = usec.isdigit() and (not pid or pid == str(os.getpid()))
        self.watchdog_interval = int(usec) / 2_000_000 if wanted else None

    @property
    def enabled(self) -> bool:
        return bool(self.address)

    def send(self, *lines: str) -> bool:
        if not self.address:
            return False
        addr = self.address
        if addr.startswith("@"):  # abstract namespace socket
            addr = "\0" + addr[1:]
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            try:
                sock.sendto("\n".join(lines).encode("utf-8"), addr)
            except OSError:
                return False
        return True

    def ready(self, status: str = "") -> bool:
        return self.send("READY=1", *([f"STATUS={status}"] if status else []))

    def status(self, status: str) -> bool:
        return self.send(f"STATUS={status}")

    def watchdog(self) -> bool:
        return self.send("WATCHDOG=1")

    def stopping(self) -> bool:
        return self.send("STOPPING=1")
