"""OS effects of supervision: spawning children, signalling their groups, pidfiles, logs.

Everything here touches the operating system; `memd.supervision.supervisor` decides
*when*, this module does *what*. Tests of the state machine replace `PopenSpawner` with a fake.

How a child is spawned, and why
-------------------------------
`subprocess.Popen(start_new_session=True)` puts the child in its own session and process
group (pgid == pid), so a stop can signal the whole group and grandchildren go too, and a
Ctrl+C at memd's terminal does not reach the children behind memd's back.

The child does not exec the program directly but a tiny Python trampoline (`-I -S -c`,
~13 ms on a 2-core box) that then `execvp`s it. The trampoline:

- sets PR_SET_PDEATHSIG=SIGKILL (Linux, via ctypes prctl) so children die with memd, and
  exits if memd already died before that (getppid check);
- resets SIGINT, SIGTERM, SIGQUIT, SIGHUP, SIGPIPE and SIGXFSZ to SIG_DFL and clears the
  signal mask. Ignored signals and the mask survive exec: a memd started in the background
  (`memd run &` from a script) has SIGINT ignored, and `memsearch watch` stops cleanly only
  on KeyboardInterrupt (cli.py `watch` catches it and runs watcher.stop() and ms.close();
  SIGTERM kills it without that cleanup). Python leaves an inherited SIG_IGN alone at start.

A trampoline instead of `preexec_fn`: preexec_fn runs Python between fork and exec and can
deadlock when the parent has other threads (memd does: asyncio.to_thread, gRPC).

PR_SET_PDEATHSIG fires when the *thread* that forked exits, not the process. Spawn only
from a thread that lives as long as memd: the event loop thread (Supervisor.step is called
there). On macOS there is no PDEATHSIG; pidfiles and `reap_leftovers` cover that case.

Where a child starts, and what it imports: a child without a folder of its own starts in
`/` (`TRUSTED_CWD`), not in memd's working directory, and every child's environment has
PYTHONSAFEPATH=1 (`child_env`, Python's `-P`): `python -m X` would otherwise put its
working directory first on the import path, and memd may be started from a folder another
user can write (`cd /tmp && memd run`), where a planted `truststore.py` or `memd/` would
run as memd's uid. PYTHONSAFEPATH is inherited, so it covers grandchildren and the
zygote's forks too (they inherit its import path).

Logs (`memd.supervision.childlogs`): stdout and stderr of the child go straight to its log
file, rotated by size. Pidfiles are read back, and children an earlier memd left behind
reaped, by `memd.supervision.leftovers` (its names are re-exported here).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import psutil
import structlog

from memd import trust
from memd.supervision.childlogs import open_log, read_tail, rotate_log
from memd.supervision.leftovers import cmdline_matches as cmdline_matches
from memd.supervision.leftovers import process_title as process_title
from memd.supervision.leftovers import read_pidfile
from memd.supervision.leftovers import reap_leftovers as reap_leftovers
from memd.supervision.leftovers import title_matches as title_matches

if TYPE_CHECKING:
    from memd.supervision.child import ChildSpec

log = structlog.get_logger()

TRUSTED_CWD = "/"  # a child's working directory when its spec names none (see above)

_TRAMPOLINE = """\
import os, signal, sys
if sys.platform.startswith("linux"):
    import ctypes
    if ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0) != 0:
        sys.stderr.write("memd trampoline: prctl(PR_SET_PDEATHSIG) failed\\n")
if os.getppid() != int(sys.argv[1]):
    os._exit(70)
for name in ("SIGINT", "SIGTERM", "SIGQUIT", "SIGHUP", "SIGPIPE", "SIGXFSZ"):
    if hasattr(signal, name):
        signal.signal(getattr(signal, name), signal.SIG_DFL)
signal.pthread_sigmask(signal.SIG_SETMASK, ())
os.execvp(sys.argv[2], sys.argv[2:])
"""

# os.waitid (to look at an exit without reaping) is missing on macOS before Python 3.13;
# there, stragglers of a child that exits on its own are not cleaned up.
_HAS_WAITID = hasattr(os, "waitid") and hasattr(os, "WNOWAIT")


def child_env(env: Mapping[str, str] | None) -> dict[str, str]:
    """A child's environment (memd's when `env` is None), never with the working
    directory on a Python child's import path (see the module docstring), and with
    OpenBLAS on one thread, as in the zygote's forks (`memd.supervision.zygote.zygote_env`):
    a plainly spawned index server (zygote off or not up yet) otherwise started a BLAS
    thread per core, and on a busy 2-core box its dense search took ~16 ms, not ~2.5."""
    out = dict(os.environ if env is None else env)
    out["PYTHONSAFEPATH"] = "1"
    out["OPENBLAS_NUM_THREADS"] = "1"
    return out


def tree_pss(pid: int) -> tuple[int, int]:
    """(bytes, processes): the proportional set size of `pid` and all its descendants.

    PSS splits a page shared by N processes N ways, so the zygote's forks (which share
    its preloaded libraries) add up to what the tree really costs, unlike a sum of RSS.
    Processes that vanish or cannot be read are left out; RSS stands in where PSS is
    not available (no /proc/<pid>/smaps_rollup)."""
    try:
        root = psutil.Process(pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0, 0
    total = counted = 0
    for proc in tree:
        try:
            info = proc.memory_full_info()
            total += getattr(info, "pss", info.rss)
            counted += 1
        except (psutil.Error, OSError):
            continue
    return total, counted


def activity(pid: int) -> tuple[float, int, int] | None:
    """CPU seconds and bytes read and written by `pid` so far: it changes while the
    process works (a ChildSpec's `progress` probe); None when it cannot be read."""
    try:
        proc = psutil.Process(pid)
        cpu = proc.cpu_times()
        io = proc.io_counters()
    except (psutil.Error, AttributeError, OSError):
        return None
    return (cpu.user + cpu.system, getattr(io, "read_chars", 0), getattr(io, "write_chars", 0))


class PopenSpawner:
    """Starts children for real (see the module docstring for how and why)."""

    def spawn(self, spec: ChildSpec) -> PopenProc:
        env = child_env(spec.env)
        search_path = env.get("PATH", os.defpath)
        if os.sep not in spec.argv[0] and shutil.which(spec.argv[0], path=search_path) is None:
            raise FileNotFoundError(f"{spec.argv[0]!r} not found on PATH")
        out = open_log(spec)
        try:
            popen = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _TRAMPOLINE, str(os.getpid()), *spec.argv],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=spec.cwd if spec.cwd is not None else TRUSTED_CWD,
                env=env,
                start_new_session=True,
                close_fds=True,
            )
        finally:
            if out is not subprocess.DEVNULL:
                os.close(out)
        proc = PopenProc(popen, spec)
        if spec.pidfile is not None:
            proc.write_pidfile()
        return proc

    def log_tail(self, spec: ChildSpec) -> str:
        return read_tail(spec.log_path) if spec.log_path is not None else ""


class PopenProc:
    """One spawned child: poll, signal its group, measure it, clean up after it."""

    def __init__(self, popen: subprocess.Popen[bytes], spec: ChildSpec) -> None:
        self._popen = popen
        self._spec = spec
        self.pid = popen.pid
        try:
            self.create_time: float | None = psutil.Process(self.pid).create_time()
        except psutil.Error:
            self.create_time = None

    def poll(self) -> int | None:
        """Popen-style returncode once the child has exited (reaping it), else None.

        Before reaping, the remaining members of its process group are SIGKILLed: while
        the leader is a zombie its pid cannot be reused, so the group id is still ours.
        Children of memd must not daemonize; stragglers would hold Milvus Lite's lock.
        """
        if self._popen.returncode is None and _HAS_WAITID:
            try:
                info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return self._popen.poll()
            if info is None:
                return None  # alive: one syscall per tick, not two (memd polls 4x/s)
            self.signal(signal.SIGKILL)
        return self._popen.poll()

    def signal(self, sig: int) -> None:
        """Signal the whole process group; a group that is already gone is not an error."""
        if self._popen.returncode is not None:
            return  # reaped: the group id may belong to someone else by now
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, sig)

    def rss(self) -> int | None:
        """Resident memory of the child and its descendants, in bytes."""
        try:
            procs = [psutil.Process(pid) for pid in descendants(self.pid)]
        except psutil.Error:
            return None
        total = 0
        for p in procs:
            try:
                total += p.memory_info().rss
            except psutil.Error:
                continue
        return total

    def housekeep(self) -> None:
        """Periodic upkeep while the child lives: keep its log within bounds."""
        spec = self._spec
        if spec.log_path is not None:
            rotate_log(spec.log_path, spec.log_max_bytes, spec.log_backups, live=True)

    def release(self) -> None:
        """The child has been reaped: forget its pidfile (only if it still names us)."""
        if self._spec.pidfile is None:
            return
        record = read_pidfile(self._spec.pidfile)
        if record is not None and record.get("pid") == self.pid:
            try:
                self._spec.pidfile.unlink(missing_ok=True)
            except OSError as exc:  # read-only or broken disk: the reap must still happen
                log.warning(
                    "child.pidfile_not_removed", name=self._spec.name, pid=self.pid, error=str(exc)
                )

    def write_pidfile(self) -> None:
        assert self._spec.pidfile is not None
        record = {
            "pid": self.pid,
            "create_time": self.create_time,
            "argv": list(self._spec.argv),
            "name": self._spec.name,
            "stop_signal": int(self._spec.stop_signal),
            "memd_pid": os.getpid(),
        }
        try:
            _write_atomic(self._spec.pidfile, json.dumps(record))
        except OSError as exc:
            log.warning("child.pidfile_failed", name=self._spec.name, pid=self.pid, error=str(exc))


def descendants(pid: int) -> list[int]:
    """pid and its descendants, from /proc/<pid>/task/*/children (psutil's children()
    reads every process's stat instead: ~40 ms with a few hundred processes, per child
    per daemon.status). Falls back to psutil where that file does not exist."""
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        try:
            tasks = os.listdir(f"/proc/{current}/task")
        except FileNotFoundError:
            continue  # gone
        except OSError:
            return [pid, *(p.pid for p in psutil.Process(pid).children(recursive=True))]
        for task in tasks:
            try:
                with open(f"/proc/{current}/task/{task}/children", encoding="ascii") as f:
                    todo.extend(int(c) for c in f.read().split())
            except FileNotFoundError:
                continue
            except OSError:
                return [pid, *(p.pid for p in psutil.Process(pid).children(recursive=True))]
    return out


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    trust.fsync_dir(path.parent)  # reaping after a crash needs the pidfile to be there
