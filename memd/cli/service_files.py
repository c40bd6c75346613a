"""The per-user service files memd installs: a sandboxed systemd user unit or a LaunchAgent.

`memd service install` writes them with the absolute path of the `memd` that runs the
command (venv, pipx and `uv tool` installs alike) and the config path in use, so the
service runs the same memd with the same config the user just tried by hand. The files
are rendered here, from one `ServicePlan`; `memd.cli.service` installs them.

The unit's sandbox is the strictest that still lets memd and its children work, measured
with `systemd-analyze security` (exposure 1.7 "OK" for the unit below, was 9.6 "UNSAFE")
and by running the real daemon, its `memsearch watch` and index server under a real
`systemd --user` with every setting on (tests/test_service_install.py):

- the file system is read-only (`ProtectSystem=strict`, `ProtectHome=read-only`) except the
  memory folder, the socket's folder and memd's runtime dir;
- `MemoryDenyWriteExecute` holds: no child maps writable+executable memory (numpy,
  Milvus Lite and onnxruntime, which runs the default MiniLM model, are ahead-of-time
  compiled);
- sockets are Unix, IPv4 and IPv6 only: remote LLM, embedding and Milvus endpoints are
  still reachable, so the network itself is not cut;
- `PrivateTmp` is left out when a path the service needs lives in /tmp or /var/tmp,
  where a private /tmp would hide it.
"""

from __future__ import annotations

import os
import plistlib
import sys
from dataclasses import dataclass
from pathlib import Path

UNIT_NAME = "memd.service"
LAUNCHD_LABEL = "dev.memd"
TMP_DIRS = (Path("/tmp"), Path("/var/tmp"))

# Settings that fit a per-user daemon; the order is the order in the file.
SANDBOX = (
    ("NoNewPrivileges", "yes"),
    ("ProtectSystem", "strict"),
    ("ProtectHome", "read-only"),
    # Before systemd 253 a user manager applies the file-system settings only inside a
    # user namespace; asking for it explicitly makes them work on older systemd too.
    ("PrivateUsers", "yes"),
    ("PrivateDevices", "yes"),
    ("DevicePolicy", "closed"),
    ("ProtectKernelTunables", "yes"),
    ("ProtectKernelModules", "yes"),
    ("ProtectKernelLogs", "yes"),
    ("ProtectControlGroups", "yes"),
    ("ProtectClock", "yes"),
    ("ProtectHostname", "yes"),
    ("ProtectProc", "invisible"),
    ("RestrictAddressFamilies", "AF_UNIX AF_INET AF_INET6"),
    ("RestrictNamespaces", "yes"),
    ("RestrictRealtime", "yes"),
    ("RestrictSUIDSGID", "yes"),
    ("LockPersonality", "yes"),
    ("MemoryDenyWriteExecute", "yes"),
    ("SystemCallArchitectures", "native"),
    ("SystemCallFilter", "@system-service"),
    ("SystemCallFilter", "~@privileged @resources"),
    ("SystemCallErrorNumber", "EPERM"),
    ("CapabilityBoundingSet", ""),
    ("AmbientCapabilities", ""),
    ("KeyringMode", "private"),
    ("RemoveIPC", "yes"),
)


@dataclass(frozen=True)
class ServicePlan:
    """What a service file needs: which memd to run, with which config, writing where."""

    command: tuple[str, ...]  # the memd executable (or python -m memd.cli), absolute
    config_path: Path
    memory_dir: Path
    socket_dir: Path | None  # None: the socket is in $XDG_RUNTIME_DIR/memd (RuntimeDirectory)

    @property
    def writable(self) -> list[Path]:
        return [self.memory_dir, *([self.socket_dir] if self.socket_dir else [])]

    @property
    def private_tmp(self) -> bool:
        """A private /tmp would hide any of the service's own paths that live in it."""
        paths = [Path(self.command[0]), self.config_path, *self.writable]
        return not any(_under(p, tmp) for p in paths for tmp in TMP_DIRS)


def memd_command() -> tuple[str, ...]:
    """The absolute command of the `memd` running now, as a service should run it.

    `sys.argv[0]` is the console script the user typed (`.venv/bin/memd`,
    `~/.local/bin/memd` from pipx or `uv tool`); it is kept unresolved, because pipx and
    uv keep that link stable across upgrades while the target moves. Run as
    `python -m memd.cli`, the interpreter (unresolved too: a venv's python is a link) runs
    the module.
    """
    script = Path(sys.argv[0])
    if script.name == "memd" and script.exists():
        return (os.path.abspath(script),)
    return (os.path.abspath(sys.executable), "-m", "memd.cli")


def unit_dir() -> Path:
    """Where systemd looks for the user's own units ($XDG_CONFIG_HOME/systemd/user)."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "systemd" / "user"


def plist_path() -> Path:
    return Path.home() / "Library" / "LaunchAgents" / f"{LAUNCHD_LABEL}.plist"


def launchd_log(home: Path | None = None) -> Path:
    return (home or Path.home()) / "Library" / "Logs" / "memd" / "memd.log"


def render_unit(plan: ServicePlan) -> str:
    """The systemd user unit for `plan`, every path quoted as systemd reads it."""
    exec_start = " ".join(
        _systemd_word(w) for w in (*plan.command, "run", "--config", str(plan.config_path))
    )
    lines = [
        "# memd as a systemd user service. `memd service install` writes it with the paths",
        "# of the memd and config in use; `memd service uninstall` removes it.",
        "# Logs: journalctl --user -u memd",
        "[Unit]",
        "Description=memd: persistent conversation memory for LLM clients",
        "",
        "[Service]",
        "Type=notify",
        "NotifyAccess=main",
        f"ExecStart={exec_start}",
        "# memd stops its memsearch watchers and index servers itself on SIGTERM; KillMode=mixed",
        "# sends SIGTERM to memd only and SIGKILLs whatever is left after TimeoutStopSec.",
        "KillMode=mixed",
        "TimeoutStopSec=30",
        "Restart=on-failure",
        "RestartSec=2",
        "WatchdogSec=120",
        "UMask=0077",
        "",
        "# Sandbox: read-only everywhere but memd's own folders (see memd/cli/service_files.py).",
        "RuntimeDirectory=memd",
        "RuntimeDirectoryMode=0700",
        *(f"ReadWritePaths={_systemd_word(str(p), exec_line=False)}" for p in plan.writable),
        *(
            ["PrivateTmp=yes"]
            if plan.private_tmp
            else ["# PrivateTmp is off: a path memd needs is in /tmp or /var/tmp."]
        ),
        *(f"{key}={value}" for key, value in SANDBOX),
        "",
        "[Install]",
        "WantedBy=default.target",
    ]
    return "\n".join(lines) + "\n"


def render_plist(plan: ServicePlan, home: Path | None = None) -> bytes:
    """The LaunchAgent for `plan` (launchd has no sandbox settings of this kind)."""
    log = str(launchd_log(home))
    agent = {
        "Label": LAUNCHD_LABEL,
        "ProgramArguments": [*plan.command, "run", "--config", str(plan.config_path)],
        "RunAtLoad": True,
        "KeepAlive": {"SuccessfulExit": False},
        "ThrottleInterval": 5,
        "ExitTimeOut": 30,
        "ProcessType": "Background",
        "Umask": 0o077,
        "StandardOutPath": log,
        "StandardErrorPath": log,
    }
    return plistlib.dumps(agent, sort_keys=False)


def _systemd_word(word: str, exec_line: bool = True) -> str:
    """Quote one word as systemd reads it: % specifiers everywhere, $ variables in Exec*."""
    escaped = word.replace("%", "%%")
    if exec_line:
        escaped = escaped.replace("$", "$$")
    if any(c in escaped for c in " \t\"'\\;"):
        escaped = '"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return escaped


def _under(path: Path, parent: Path) -> bool:
    try:
        return Path(os.path.abspath(path)).is_relative_to(parent)
    except ValueError:
        return False


# The copies shipped in systemd/ and launchd/: what install writes for a pipx install
# with the default config, with the home folder left to the service manager (%h) or to
# the reader (__HOME__, launchd expands nothing). tests/test_service_install.py keeps
# them equal to the renderers' output.
_SHIPPED_HOME = Path("/__HOME__")


def _shipped_plan() -> ServicePlan:
    return ServicePlan(
        command=(str(_SHIPPED_HOME / ".local" / "bin" / "memd"),),
        config_path=_SHIPPED_HOME / ".config" / "memd" / "config.toml",
        memory_dir=_SHIPPED_HOME / ".localrouter" / "memory",
        socket_dir=None,
    )


def shipped_unit() -> str:
    return render_unit(_shipped_plan()).replace(str(_SHIPPED_HOME), "%h")


def shipped_plist() -> bytes:
    plist = render_plist(_shipped_plan(), home=_SHIPPED_HOME)
    return plist.replace(str(_SHIPPED_HOME).encode(), b"__HOME__")
