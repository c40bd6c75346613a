"""`memd service install | uninstall | status`: the user service, written, enabled, undone.

Install writes the file rendered by `memd.cli.service_files`, then asks the user's service
manager to load, enable and (re)start it; when that fails, the file is removed again, so
a failed install leaves nothing behind. `--print` only writes the file to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from memd.cli.common import EXIT_ERROR, EXIT_OK, EXIT_UNAVAILABLE, UsageError, config_arg
from memd.cli.service_files import (
    LAUNCHD_LABEL,
    UNIT_NAME,
    ServicePlan,
    launchd_log,
    memd_command,
    plist_path,
    render_plist,
    render_unit,
    unit_dir,
)
from memd.config import load_config
from memd.markdown import fsync_dir

MANAGER_TIMEOUT = 120.0  # longer than systemd's start timeout (90 s by default)


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add `service` and its actions to the `memd` subcommands."""
    service = sub.add_parser(
        "service",
        parents=[common],
        help="install memd as a user service (systemd/launchd)",
        description="Install, remove or inspect memd as a per-user service: a sandboxed "
        "systemd user unit on Linux, a LaunchAgent on macOS. The service runs "
        "this memd with this config (see --config).",
    )
    actions = service.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, func, text in (
        ("install", cmd_install, "write the service, enable and start it"),
        ("uninstall", cmd_uninstall, "stop, disable and remove the service"),
        ("status", cmd_status, "is it installed, enabled, running, and which memd"),
    ):
        action = actions.add_parser(name, parents=[common], help=text, description=text)
        action.add_argument(
            "--manager",
            choices=["systemd", "launchd"],
            default="launchd" if sys.platform == "darwin" else "systemd",
            help="which service manager (default: this system's)",
        )
        if name == "install":
            action.add_argument(
                "--print",
                action="store_true",
                dest="print_only",
                help="write the unit or plist to stdout; install nothing",
            )
        action.set_defaults(func=func)


def plan_for(args: argparse.Namespace) -> ServicePlan:
    """The service for this memd and this config; refuses a config that does not exist."""
    path = Path(os.path.abspath(config_arg(args)))
    if not path.is_file():
        raise UsageError(
            f"no config at {path}: run `memd init` first (a service without "
            "clients would record nothing)"
        )
    config = load_config(path)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    in_runtime = (
        args.manager == "systemd"
        and runtime is not None
        and config.socket.parent == Path(runtime) / "memd"
    )
    socket_dir = (
        None if in_runtime or config.socket.parent == config.memory_dir else config.socket.parent
    )
    return ServicePlan(
        command=memd_command(),
        config_path=path,
        memory_dir=config.memory_dir,
        socket_dir=socket_dir,
    )


def service_file(manager: str) -> Path:
    return unit_dir() / UNIT_NAME if manager == "systemd" else plist_path()


def _warn_about(manager: str, config_path: Path) -> None:
    """What in the config would make the installed service surprise its user."""
    config = load_config(config_path)
    if (
        manager == "systemd"
        and not os.environ.get("XDG_RUNTIME_DIR")
        and config.socket == config.memory_dir / "memd.sock"
    ):
        print(
            "memd: warning: XDG_RUNTIME_DIR is unset in this shell, so the CLI looks for "
            f"the socket at {config.socket}, while the service listens in the user "
            "manager's $XDG_RUNTIME_DIR/memd/; set `socket` in the config to use one path",
            file=sys.stderr,
        )
    if not config.enabled_clients():
        print(f"memd: warning: no client in {config_path} has memory on", file=sys.stderr)


def cmd_install(args: argparse.Namespace) -> int:
    plan = plan_for(args)
    content = render_unit(plan).encode() if args.manager == "systemd" else render_plist(plan)
    if args.print_only:
        sys.stdout.buffer.write(content)
        sys.stdout.flush()
        return EXIT_OK
    _warn_about(args.manager, plan.config_path)
    if args.manager == "systemd" and (missing := _no_user_manager()):
        print(missing, file=sys.stderr)
        return EXIT_ERROR
    target = service_file(args.manager)
    made = [d for folder in (*plan.writable, target.parent) for d in _missing_dirs(folder)]
    for folder in plan.writable:  # the sandbox can only grant folders that exist
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    previous = target.read_bytes() if target.exists() else None
    existed = previous is not None
    _write(target, content)
    steps = _systemd_install() if args.manager == "systemd" else _launchd_install(target)
    failure = _run_all(steps)
    if failure:
        _roll_back(args.manager, target, previous)
        for folder in sorted(set(made), key=lambda d: len(d.parts), reverse=True):
            with contextlib.suppress(OSError):  # only if still empty: never what is in it
                folder.rmdir()
        left = "the service was left as it was" if existed else "nothing was installed"
        print(
            f"memd: {failure}\nmemd: {left}; logs: {_logs_hint(args.manager)}; "
            "`memd service install --print` shows the file to install by hand",
            file=sys.stderr,
        )
        return EXIT_ERROR
    print(f"{'updated' if existed else 'installed'} {target}")
    print(f"runs     {' '.join(plan.command)} run --config {plan.config_path}")
    print("enabled and started; it starts again at every login")
    print(f"logs     {_logs_hint(args.manager)}")
    print("check    memd status   (or: memd service status)")
    return EXIT_OK


def cmd_uninstall(args: argparse.Namespace) -> int:
    target = service_file(args.manager)
    if not target.exists():
        print(f"not installed (no {target})")
        return EXIT_OK
    if args.manager == "systemd":
        _run(["systemctl", "--user", "disable", "--now", UNIT_NAME])
        target.unlink()
        _run(["systemctl", "--user", "daemon-reload"])
        _run(["systemctl", "--user", "reset-failed", UNIT_NAME])
    else:
        _run(["launchctl", "bootout", f"gui/{os.getuid()}/{LAUNCHD_LABEL}"])
        target.unlink()
    print(f"stopped, disabled and removed {target}")
    print("your config and memory folder are untouched")
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    target = service_file(args.manager)
    if not target.exists():
        print(f"not installed (no {target}); `memd service install` installs it")
        return EXIT_UNAVAILABLE
    print(f"file     {target}")
    if args.manager == "systemd":
        enabled = _run(["systemctl", "--user", "is-enabled", UNIT_NAME])
        active = _run(["systemctl", "--user", "is-active", UNIT_NAME])
        print(f"enabled  {_word(enabled)}")
        print(f"active   {_word(active)}")
        running = active.returncode == 0
    else:
        printed = _run(["launchctl", "print", f"gui/{os.getuid()}/{LAUNCHD_LABEL}"])
        running = printed.returncode == 0 and "state = running" in printed.stdout
        print(f"loaded   {'yes' if printed.returncode == 0 else 'no'}")
        print(f"running  {'yes' if running else 'no'}")
    command = " ".join(memd_command())
    if command not in target.read_text(encoding="utf-8", errors="replace"):
        print(
            f"note     the service runs another memd than this one ({command}); "
            "`memd service install` updates it"
        )
    print(f"logs     {_logs_hint(args.manager)}")
    return EXIT_OK if running else EXIT_UNAVAILABLE


def _no_user_manager() -> str | None:
    """Why there is no `systemd --user` to install into (with what to do), or None."""
    done = _run(["systemctl", "--user", "show-environment"])
    if done.returncode == 0:
        return None
    detail = (done.stderr or done.stdout).strip().splitlines()
    return (
        f"memd: no systemd user manager to install into (`systemctl --user`: "
        f"{detail[0] if detail else f'exit {done.returncode}'}); nothing was written.\n"
        "memd: either run memd in the foreground with `memd run` (in tmux, or from your "
        "own init), or give your user a manager that runs without a login session, "
        "`loginctl enable-linger $USER`, log in again and rerun `memd service install`"
    )


def _missing_dirs(folder: Path) -> list[Path]:
    """`folder` and those of its parents that do not exist yet (an install that fails
    removes the ones it made, if they are still empty)."""
    out = []
    while not folder.exists() and folder != folder.parent:
        out.append(folder)
        folder = folder.parent
    return out


def _roll_back(manager: str, target: Path, previous: bytes | None) -> None:
    """Put back what was there before a failed install (nothing, or the old file)."""
    if manager == "systemd":
        if previous is None:
            _run(["systemctl", "--user", "disable", "--now", UNIT_NAME])
            target.unlink(missing_ok=True)
        else:
            _write(target, previous)
        _run(["systemctl", "--user", "daemon-reload"])
        _run(["systemctl", "--user", "reset-failed", UNIT_NAME])
        if previous is not None:
            _run(["systemctl", "--user", "restart", UNIT_NAME])
    elif previous is None:
        _run(["launchctl", "bootout", f"gui/{os.getuid()}/{LAUNCHD_LABEL}"])
        target.unlink(missing_ok=True)
    else:
        _write(target, previous)
        _run(["launchctl", "bootstrap", f"gui/{os.getuid()}", str(target)])


def _systemd_install() -> list[list[str]]:
    return [
        ["systemctl", "--user", "daemon-reload"],
        ["systemctl", "--user", "enable", UNIT_NAME],
        ["systemctl", "--user", "restart", UNIT_NAME],
    ]


def _launchd_install(target: Path) -> list[list[str]]:
    launchd_log().parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    domain = f"gui/{os.getuid()}"
    _run(["launchctl", "bootout", f"{domain}/{LAUNCHD_LABEL}"])  # a loaded old one
    return [
        ["launchctl", "enable", f"{domain}/{LAUNCHD_LABEL}"],
        ["launchctl", "bootstrap", domain, str(target)],
    ]


def _run_all(steps: list[list[str]]) -> str | None:
    """Run each step; the first failure, described, or None."""
    for step in steps:
        done = _run(step)
        if done.returncode != 0:
            detail = (done.stderr or done.stdout).strip() or f"exit {done.returncode}"
            return f"`{' '.join(step)}` failed: {detail}"
    return None


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            cmd, capture_output=True, text=True, timeout=MANAGER_TIMEOUT, check=False
        )
    except FileNotFoundError:
        return subprocess.CompletedProcess(cmd, 127, "", f"{cmd[0]} not found on this system")
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(cmd, 124, "", f"no answer in {MANAGER_TIMEOUT:.0f} s")


def _word(done: subprocess.CompletedProcess[str]) -> str:
    return (done.stdout.strip() or done.stderr.strip() or "unknown").splitlines()[0]


def _write(target: Path, content: bytes) -> None:
    """Replace `target` whole: the unit the service manager reads is the old or the new."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    with tmp.open("wb") as fh:
        fh.write(content)
        fh.flush()
        os.fsync(fh.fileno())
    os.chmod(tmp, 0o644)
    os.replace(tmp, target)
    fsync_dir(target.parent)


def _logs_hint(manager: str) -> str:
    return "journalctl --user -u memd -f" if manager == "systemd" else f"tail -f {launchd_log()}"
