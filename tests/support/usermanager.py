"""A real `systemd --user` of the test's own, in throwaway mount and cgroup namespaces.

CI machines and containers rarely have a user manager to install a service into, and a
test must not install into the developer's. So this starts one: as root, in a private
mount namespace (its own /run/systemd, so it believes systemd booted) and a cgroup
namespace rooted at a fresh cgroup, so it sees and manages only its own processes. The
user's home and runtime dir are plain folders of the host under /var/lib: mounts made
only in the test's namespace are not seen by the services' own sandboxes (measured:
a tmpfs /run/user there left the notify socket out of the service's view).
Commands run inside with `nsenter`, as a user's shell would: `systemctl --user`,
`memd service install`, `memd status`. `stop()` removes the folders and the cgroup.

`available()` says why it cannot run here (not root, no systemd, ...); tests skip then.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

SYSTEMD = next(
    (p for p in ("/lib/systemd/systemd", "/usr/lib/systemd/systemd") if os.access(p, os.X_OK)), None
)
CGROUP_V1 = Path("/sys/fs/cgroup/systemd")  # the named hierarchy of a hybrid layout
CGROUP_V2 = Path("/sys/fs/cgroup")
BASE = Path("/var/lib")  # not /tmp: the unit's PrivateTmp would hide the test's folders


def available() -> str | None:
    """None when a private user manager can run here, else why not."""
    if os.geteuid() != 0:
        return "needs root for private mount and cgroup namespaces"
    if SYSTEMD is None or not Path("/run/systemd").is_dir():
        return "no systemd binary"
    for tool in ("unshare", "nsenter", "systemctl", "systemd-run"):
        if shutil.which(tool) is None:
            return f"no {tool}"
    if not ((CGROUP_V1 / "cgroup.procs").exists() or (CGROUP_V2 / "cgroup.controllers").exists()):
        return "no cgroup hierarchy systemd can use"
    return None


class UserManager:
    """`start()`, then `run(...)` commands inside; `stop()` always cleans up."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self.base = BASE / f"memd-test-{uuid.uuid4().hex[:8]}"
        self.home = self.base / "home"
        self.runtime_dir = self.base / "run"
        v1 = (CGROUP_V1 / "cgroup.procs").exists()
        self.cgroup_root = CGROUP_V1 if v1 else CGROUP_V2
        self.cgroup = self.cgroup_root / f"memd-test-{uuid.uuid4().hex[:8]}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.env = {
            "HOME": str(self.home),
            "XDG_RUNTIME_DIR": str(self.runtime_dir),
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LANG": "C.UTF-8",
        }

    def start(self, timeout: float = 30.0) -> UserManager:
        remount = (
            f"umount {CGROUP_V1} && mount -t cgroup -o none,name=systemd cgroup {CGROUP_V1}"
            if self.cgroup_root == CGROUP_V1
            else f"umount {CGROUP_V2} && mount -t cgroup2 cgroup2 {CGROUP_V2}"
        )
        script = "\n".join(
            [
                "set -e",
                "mount -t tmpfs -o mode=755 tmpfs /run/systemd && mkdir /run/systemd/system",
                remount,
                f"exec {SYSTEMD} --user --log-target=console",
            ]
        )
        for folder in (self.base, self.home, self.runtime_dir):
            folder.mkdir(mode=0o700)
        self.cgroup.mkdir()
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it
        procs = self.cgroup / "cgroup.procs"
        self.proc = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "--cgroup", "sh", "-c", script],
            env=self.env,
            stdout=log,
            stderr=log,
            preexec_fn=lambda: procs.write_text(str(os.getpid())),
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"systemd --user exited:\n{self.log()}")
            state = self.run("systemctl", "--user", "is-system-running").stdout.strip()
            if state in ("running", "degraded"):
                return self
            time.sleep(0.2)
        raise TimeoutError(f"systemd --user did not come up:\n{self.log()}")

    def run(
        self, *cmd: str, timeout: float = 120.0, **env: str
    ) -> subprocess.CompletedProcess[str]:
        """Run `cmd` inside the namespaces, in the test user's environment."""
        assert self.proc is not None
        words = [f"{k}={v}" for k, v in {**self.env, **env}.items()]
        return subprocess.run(
            ["nsenter", "-t", str(self.proc.pid), "-m", "-C", "--", "env", "-i", *words, *cmd],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            cwd="/",
        )

    def unsupported(self, settings: list[tuple[str, str]]) -> list[str]:
        """Sandbox settings this machine cannot apply even alone (e.g. a VM's odd /proc)."""
        bad = []
        for key, value in settings:
            done = self.run("systemd-run", "--user", "--wait", "-q", "-p", f"{key}={value}", "true")
            if done.returncode != 0:
                bad.append(key)
        return bad

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-8000:]
        except FileNotFoundError:
            return ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._remove_cgroup()
        shutil.rmtree(self.base, ignore_errors=True)

    def _remove_cgroup(self) -> None:
        """Kill what is left in our cgroup (only ours: the namespace saw nothing else)."""
        if not self.cgroup.exists():
            return
        for _ in range(50):
            pids = [
                int(p) for f in self.cgroup.rglob("cgroup.procs") for p in f.read_text().split()
            ]
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)
        for folder in sorted(
            (p for p in self.cgroup.rglob("*") if p.is_dir()),
            key=lambda p: len(p.parts),
            reverse=True,
        ):
            folder.rmdir()
        self.cgroup.rmdir()
