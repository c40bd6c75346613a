"""A child whose start takes longer than its ready_timeout, under the real supervisor
(issue 24, item 9: a watcher indexing a 35 MB session missed readiness three times and
went FATAL for good).

The same real child (it works, with CPU and writes, for `--work` seconds before it is
ready, as `memsearch watch` does during its initial scan) is supervised twice with
ready_timeout `--timeout`: without a progress probe (memd before) and with
`procs.activity` (memd now). Prints what became of it and when.

    .venv/bin/python bench/slow_start.py [--work 12] [--timeout 3]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from memd.supervision.child import ChildSpec
from memd.supervision.procs import activity
from memd.supervision.states import ProcessStates as S
from memd.supervision.supervisor import Supervisor

CHILD = """
import pathlib, sys, time
out, seconds = pathlib.Path(sys.argv[1]), float(sys.argv[2])
end = time.monotonic() + seconds
with open(str(out) + ".work", "wb") as f:
    while time.monotonic() < end:
        f.write(b"x" * 4096)
        sum(range(20000))
out.write_text("ready")
time.sleep(300)
"""


def run(work: float, timeout: float, probe: bool) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        ready = Path(tmp) / "ready"
        sup = Supervisor(tick=0.05, poll=0.05)
        sup.add(
            ChildSpec(
                name="scan",
                argv=(sys.executable, "-c", CHILD, str(ready), str(work)),
                startsecs=0.0,
                ready=ready.exists,
                ready_timeout=timeout,
                startretries=2,
                backoff_start=0.5,
                progress=activity if probe else None,
            )
        )
        start = time.monotonic()
        try:
            while time.monotonic() - start < work * 4 + 30:
                sup.step()
                status = sup.status()["scan"]
                if status.state in (S.RUNNING, S.FATAL):
                    break
                time.sleep(0.05)
            took = time.monotonic() - start
            return (
                f"{status.state} after {took:.1f} s, {status.restarts} restart(s), "
                f"last error: {status.last_error}"
            )
        finally:
            asyncio.run(sup.shutdown(timeout=5.0))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", type=float, default=12.0)
    parser.add_argument("--timeout", type=float, default=3.0)
    args = parser.parse_args()
    print(f"child works {args.work:g} s before it is ready; ready_timeout {args.timeout:g} s")
    print(f"without a progress probe (before): {run(args.work, args.timeout, False)}")
    print(f"with procs.activity (now):         {run(args.work, args.timeout, True)}")


if __name__ == "__main__":
    main()
