"""A tiny program for zygote tests: `python -m tests.support.zygote_target OUT [MODE]`.

Writes what it sees (pid, ppid, pgid, sid, argv, cwd, an env var, SIGINT handler) to OUT
as JSON, then runs until SIGINT (cleaning up: writes OUT.clean) or exits as MODE says.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path


def main() -> int:
    out = Path(sys.argv[1])
    mode = sys.argv[2] if len(sys.argv) > 2 else "run"
    print(f"zygote_target up pid={os.getpid()}", flush=True)
    seen = {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "pgid": os.getpgid(0),
        "sid": os.getsid(0),
        "argv": sys.argv,
        "cwd": os.getcwd(),
        "env": os.environ.get("ZYGOTE_TARGET"),
        "home": os.environ.get("HOME"),
        "sigint": str(signal.getsignal(signal.SIGINT)),
        "fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd")),
    }
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(seen))
    os.replace(tmp, out)
    if mode.startswith("exit"):
        return int(mode[4:] or 0)
    try:
        while True:
            time.sleep(0.05)
    except KeyboardInterrupt:
        out.with_suffix(".clean").write_text("cleaned up")
    return 0


if __name__ == "__main__":
    sys.exit(main())
