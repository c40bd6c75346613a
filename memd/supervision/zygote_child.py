"""Inside a child forked by the zygote: become the program a plain spawn would have exec'd.

A plain spawn gets a fresh interpreter from exec; a fork inherits the zygote's. `become`
puts back what exec would have given, then runs the module as `__main__`:

- its own session and process group (memd signals the group);
- memd as parent and PR_SET_PDEATHSIG=SIGKILL towards it, set only after the re-parenting
  (the intermediate's exit) so it refers to memd, and an exit if memd is already gone;
- the zygote's go: its pipe closing without a byte means memd never took this pid on;
- stdin on /dev/null, stdout and stderr on the log fd memd opened, every other fd closed;
- the command's environment, working directory, sys.argv and process title (so `ps`,
  pidfile checks and the tests see the command line a plain spawn shows);
- signal dispositions and mask as a fresh Python has them (SIGINT raises
  KeyboardInterrupt: `memsearch watch` cleans up only then).

Module state computed from the environment at import time stays the zygote's: the
program must recompute what it needs (memd's watch wrapper does, for memsearch's HOME).

It never returns: the module's exit status is the process's, after the interpreter's usual
shutdown (non-daemon threads joined, atexit handlers run, stdio flushed).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import io
import os
import runpy
import select
import signal
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

PR_SET_PDEATHSIG = 1
EXIT_PARENT_GONE = 70  # as the plain spawn's trampoline
EXIT_NOT_TOLD = 71
REPARENT_WAIT = 5.0
_RESET_SIGNALS = ("SIGTERM", "SIGQUIT", "SIGHUP", "SIGCHLD", "SIGUSR1", "SIGUSR2")


@dataclass(frozen=True)
class Job:
    """What to become: `python -m module args...` with this environment and folder."""

    argv: tuple[str, ...]
    module: str
    env: Mapping[str, str]
    cwd: str | None
    parent: int

    @classmethod
    def from_request(cls, request: dict[str, Any]) -> Job:
        argv = tuple(str(a) for a in request["argv"])
        if len(argv) < 3 or argv[1] != "-m":
            raise ValueError("argv must be python -m MODULE ...")
        env = request["env"]
        if not isinstance(env, dict):
            raise TypeError("env must be an object")
        cwd = request.get("cwd")
        return cls(
            argv,
            argv[2],
            {str(k): str(v) for k, v in env.items()},
            str(cwd) if cwd is not None else None,
            int(request["parent"]),
        )


def become(job: Job, log_fd: int | None, go_fd: int, middle_pid: int) -> NoReturn:
    """Run in the forked child; exits the process with the module's status."""
    try:
        os.setsid()
        _adopt(job.parent, middle_pid)
        _title(job)
        if not _told(go_fd):
            os._exit(EXIT_NOT_TOLD)
        _stdio(log_fd)
        _environment(job)
        _signals()
    except BaseException:  # before the module runs: report to the log and give up
        with contextlib.suppress(Exception):
            traceback.print_exc()
            sys.stderr.flush()
        os._exit(EXIT_PARENT_GONE)
    _run(job)


def _adopt(parent: int, middle_pid: int) -> None:
    """Wait to be re-parented away from the intermediate, then die with memd."""
    deadline = time.monotonic() + REPARENT_WAIT
    while os.getppid() == middle_pid and time.monotonic() < deadline:
        time.sleep(0.001)
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:  # memd died, or is not our subreaper
        os._exit(EXIT_PARENT_GONE)


def _told(go_fd: int, timeout: float = 30.0) -> bool:
    try:
        ready, _, _ = select.select([go_fd], [], [], timeout)
        return bool(ready) and os.read(go_fd, 1) == b"g"
    except OSError:
        return False
    finally:
        with contextlib.suppress(OSError):
            os.close(go_fd)


def _stdio(log_fd: int | None) -> None:
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    out = log_fd if log_fd is not None else devnull
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.closerange(3, _max_fd())  # the zygote's socket, memd's copy of the log fd, ...
    # PYTHONUNBUFFERED, as the plain spawn's environment asks: unbuffered binary layer.
    # (sys.__stdout__ and friends keep the zygote's objects, on the same fds now.)
    sys.stdout = io.TextIOWrapper(
        io.FileIO(1, "w", closefd=False), write_through=True, errors="backslashreplace"
    )
    sys.stderr = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False), write_through=True, errors="backslashreplace"
    )
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))


def _max_fd() -> int:
    try:
        return max(int(fd) for fd in os.listdir("/proc/self/fd")) + 1
    except (OSError, ValueError):
        return os.sysconf("SC_OPEN_MAX")


def _environment(job: Job) -> None:
    os.environ.clear()
    os.environ.update(job.env)
    os.chdir(job.cwd if job.cwd is not None else "/")  # never the zygote's start folder
    spec = __import__("importlib.util").util.find_spec(job.module)
    origin = spec.origin if spec is not None and spec.origin else job.module
    sys.argv = [origin, *job.argv[3:]]


def _title(job: Job) -> None:
    """The command line `ps` and /proc show: the one a plain spawn would have."""
    with contextlib.suppress(ImportError):
        import setproctitle

        from memd.supervision.procs import process_title

        setproctitle.setproctitle(process_title(job.argv))


def _signals() -> None:
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for name in _RESET_SIGNALS:
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    # A fresh Python ignores SIGPIPE and SIGXFSZ itself; the zygote is one, keep them.
    signal.pthread_sigmask(signal.SIG_SETMASK, ())
    with contextlib.suppress(ValueError):
        signal.set_wakeup_fd(-1)


def _run(job: Job) -> NoReturn:
    code = 0
    # The module was preloaded, so runpy warns that it runs a second copy as __main__:
    # that is what `python -m` of a fresh interpreter does too, minus the import.
    warnings.filterwarnings(
        "ignore", message=".*found in sys.modules after import", category=RuntimeWarning
    )
    try:
        runpy.run_module(job.module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except KeyboardInterrupt:
        _finish()
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # as Python does: die of SIGINT
        os.kill(os.getpid(), signal.SIGINT)
        code = 130
    except BaseException:
        traceback.print_exc()
        code = 1
    _finish()
    os._exit(code)


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    with contextlib.suppress(Exception):
        print(code, file=sys.stderr)
    return 1


def _finish() -> None:
    """What the interpreter does at exit: join non-daemon threads, atexit, flush."""
    with contextlib.suppress(BaseException):
        threading._shutdown()  # type: ignore[attr-defined]
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
