"""A new user's first commands: init, config discovery that explains itself, the MCP
snippet, and the CLI's rough edges (broken pipes, unknown clients, --help).

All through the installed `memd` command, with a home folder of the test's own; no daemon
runs here (tests/test_cli_daemon_output.py covers what needs one).
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import pty
import re
import select
import stat
import struct
import subprocess
import sys
import termios
from dataclasses import fields
from pathlib import Path

import pytest

from memd.cli import mcp_config
from memd.cli.progress import Progress
from memd.config import Config, load_config
from tests.support.cli import MEMD, User

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def user(tmp_path: Path) -> User:
    return User(tmp_path, runtime_dir=tmp_path / "run")


# --- memd init ------------------------------------------------------------------------------


def test_init_writes_a_commented_config_with_one_client(user: User) -> None:
    done = user.memd("init", "--client", "desk", "--mode", "mcp_via_llm")
    assert done.code == 0, done.err
    path = user.default_config
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    config = load_config(path)
    assert dict(config.clients).keys() == {"desk"}
    assert config.clients["desk"].memory_on and config.clients["desk"].mode == "mcp_via_llm"
    # Everything else is commented out: the defaults, whatever they become.
    defaults = Config()
    for f in fields(Config):
        if f.name not in ("clients", "source", "memory_dir", "socket"):
            assert getattr(config, f.name) == getattr(defaults, f.name), f.name
    assert config.memory_dir == defaults.memory_dir  # ~ is this process's home here
    text = path.read_text()
    assert '# memory_dir = "~/.localrouter/memory"' in text and "# [compaction]" in text
    assert str(path) in done.out
    for step in ("run", "service install", "mcp --print-config --client desk", "status"):
        assert f"memd {step}" in done.out, step


def test_init_never_overwrites(user: User) -> None:
    path = user.default_config
    path.parent.mkdir(parents=True)
    path.write_text("# mine\n")
    done = user.memd("init", "--client", "desk")
    assert done.code == 2
    assert str(path) in done.err and "already exists" in done.err
    assert path.read_text() == "# mine\n"


def test_init_at_a_path_of_ones_own_says_to_pass_it(user: User, tmp_path: Path) -> None:
    path = tmp_path / "cfg" / "memd.toml"
    done = user.memd("init", "--config", str(path))
    assert done.code == 0, done.err
    assert load_config(path).clients["default"].memory_on
    assert f"run --config {path}" in done.out


def test_init_rejects_a_client_id_that_could_leave_its_folder(user: User) -> None:
    done = user.memd("init", "--client", "../etc")
    assert done.code == 2 and "client id" in done.err
    assert not user.default_config.exists()


# --- config discovery -----------------------------------------------------------------------


def test_a_config_named_explicitly_must_exist(user: User, tmp_path: Path) -> None:
    typo = tmp_path / "examples" / "dmeo.toml"
    for args in (["run"], ["status"], ["path"], ["recall", "demo", "x"], ["mcp", "--client", "d"]):
        done = user.memd(*args, "--config", str(typo))
        assert done.code == 2, (args, done)
        assert str(typo) in done.err and "--config" in done.err, args
    done = user.memd("run", MEMD_CONFIG=str(typo))
    assert done.code == 2 and str(typo) in done.err and "$MEMD_CONFIG" in done.err


def test_the_default_config_may_be_missing(user: User) -> None:
    done = user.memd("path")
    assert done.code == 0, done.err
    assert done.out.strip() == str(user.home / ".localrouter" / "memory")


def test_status_of_a_daemon_that_is_not_running_explains_the_socket(
    user: User, tmp_path: Path
) -> None:
    runtime = tmp_path / "run"
    expected = runtime / "memd" / "memd.sock"
    done = user.memd("status")
    assert done.code == 3
    assert f"tried:  {expected}" in done.err
    assert f"$XDG_RUNTIME_DIR is {runtime}" in done.err
    assert "--config" in done.err and "memd path --socket" in done.err
    assert user.memd("path", "--socket").out.strip() == str(expected)

    # Another shell, without XDG_RUNTIME_DIR: another socket, and it says so.
    del user.env["XDG_RUNTIME_DIR"]
    fallback = user.home / ".localrouter" / "memory" / "memd.sock"
    done = user.memd("status")
    assert done.code == 3 and f"tried:  {fallback}" in done.err
    assert "XDG_RUNTIME_DIR is unset" in done.err
    assert user.memd("path", "--socket").out.strip() == str(fallback)

    # The config names it.
    config = tmp_path / "c.toml"
    config.write_text(f'socket = "{tmp_path}/s/memd.sock"\n')
    done = user.memd("status", "--config", str(config))
    assert done.code == 3 and f"tried:  {tmp_path}/s/memd.sock" in done.err
    assert f"the `socket` key in {config}" in done.err
    done = user.memd("path", "--socket", "--config", str(config))
    assert done.out.strip() == f"{tmp_path}/s/memd.sock"


# --- memd path ------------------------------------------------------------------------------


def test_path_of_an_unknown_client_is_an_error_that_lists_the_known(user: User) -> None:
    assert user.memd("init", "--client", "desk").code == 0
    done = user.memd("path", "nosuch")
    assert done.code == 2 and done.out == ""
    assert "nosuch" in done.err and "desk" in done.err
    assert user.memd("path", "desk").out.strip() == str(
        user.home / ".localrouter" / "memory" / "desk"
    )


def test_path_of_a_removed_client_whose_memories_remain(user: User) -> None:
    assert user.memd("init", "--client", "desk").code == 0
    old = user.home / ".localrouter" / "memory" / "old"
    (old / "sessions").mkdir(parents=True)
    done = user.memd("path", "old")
    assert done.code == 0 and done.out.strip() == str(old)
    assert "not in the config" in done.err


def test_path_with_an_id_that_leaves_the_folder_is_a_usage_error(user: User) -> None:
    done = user.memd("path", "../etc")
    assert done.code == 2
    assert "not a valid client id" in done.err and "config error" not in done.err


# --- memd mcp -------------------------------------------------------------------------------


def test_print_config_names_this_memd_and_the_config_by_absolute_path(user: User) -> None:
    assert user.memd("init", "--client", "desk").code == 0
    done = user.memd("mcp", "--print-config")
    assert done.code == 0, done.err
    entry = json.loads(done.out)["mcpServers"]["_memory"]  # stdout is JSON only (jq)
    assert entry["command"] == str(MEMD)
    args = ["mcp", "--client", "desk", "--config", str(user.default_config), "--socket"]
    assert entry["args"][:-1] == args and Path(entry["args"][-1]).is_absolute()
    assert Path(entry["command"]).is_absolute() and os.access(entry["command"], os.X_OK)
    argv = f"{MEMD} mcp --client desk --config {user.default_config} --socket "
    assert f"claude mcp add _memory -- {argv}" in done.err  # the one-liners: stderr
    assert f"inspector -- {argv}" in done.err


def test_print_config_needs_a_client_when_several_have_memory(user: User, tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text(
        "[clients.a]\nmemory_enabled = true\n[clients.b]\nmemory_enabled = true\n"
        "[clients.off]\nmode = 'both'\n"
    )
    done = user.memd("mcp", "--print-config", "--config", str(config))
    assert done.code == 2 and "a, b" in done.err and "--client" in done.err
    done = user.memd("mcp", "--print-config", "--client", "b", "--config", str(config))
    assert done.code == 0 and '"b"' in done.out
    done = user.memd("mcp", "--print-config", "--client", "off", "--config", str(config))
    assert done.code == 2 and "memory is off" in done.err


def test_mcp_for_a_client_without_memory_fails_at_start(user: User, tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text(
        "[clients.on]\nmemory_enabled = true\n"
        "[clients.unset]\nmode = 'both'\n"
        "[clients.llm]\nmemory_enabled = true\nmode = 'llm_only'\n"
    )
    for client, words in (
        ("ghost", "is not in"),
        ("unset", "memory_enabled is unset"),
        ("llm", "llm_only"),
    ):
        # stdin stays open: a server that started would wait for MCP messages forever.
        done = user.memd("mcp", "--client", client, "--config", str(config), stdin="", timeout=30)
        assert done.code == 2, (client, done)
        assert client in done.err and words in done.err, (client, done.err)
        assert done.out == ""  # nothing on the MCP wire


def test_readme_mcp_snippet_is_what_print_config_prints() -> None:
    readme = (REPO / "README.md").read_text()
    match = re.search(r"<!-- mcp-print-config -->\n```json\n(.*?)```", readme, re.S)
    assert match, "README lost its generated `memd mcp --print-config` block"
    expected, _ = mcp_config.render(
        ("/home/you/memd/.venv/bin/memd",),
        Path("/home/you/.config/memd/config.toml"),
        "demo",
        Path("/run/user/1000/memd/memd.sock"),
    )
    assert match.group(1) == expected


# --- rough edges ----------------------------------------------------------------------------


def test_a_closed_pipe_is_not_a_traceback(user: User) -> None:
    read, write = os.pipe()
    os.close(read)  # `memd … | head` after head has exited
    try:
        done = subprocess.run(
            [str(MEMD), "--help"],
            stdout=write,
            stderr=subprocess.PIPE,
            env=user.env,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write)
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr
    assert done.returncode == 0


def test_help_shows_examples_exit_codes_and_logs(user: User) -> None:
    done = user.memd("--help")
    assert done.code == 0
    for words in (
        "examples:",
        "memd init",
        "exit codes:",
        "3 the daemon is not running",
        "logs:",
        "journalctl --user -u memd",
        ".memd/logs",
    ):
        assert words in done.out, words


# --- progress -------------------------------------------------------------------------------


def test_progress_is_plain_lines_when_not_on_a_terminal() -> None:
    out, err = io.StringIO(), io.StringIO()
    with Progress(2, "recompacting", out=out, bar_stream=err) as progress:
        progress.step("s1: recompacted")
        progress.step("s2: failed (boom)")
    assert out.getvalue() == "[1/2] s1: recompacted\n[2/2] s2: failed (boom)\n"
    assert err.getvalue() == ""


def test_progress_is_a_bar_on_a_terminal() -> None:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    out = io.StringIO()
    with os.fdopen(slave, "w") as terminal:
        with Progress(3, "recompacting", out=out, bar_stream=terminal) as progress:
            for n in range(3):
                progress.step(f"s{n}: recompacted")
        terminal.flush()
        shown = ""
        while select.select([master], [], [], 1.0)[0]:
            shown += os.read(master, 1 << 16).decode(errors="replace")
    os.close(master)
    assert "recompacting:" in shown and "/3 [" in shown and "%|" in shown
    assert out.getvalue() == "s0: recompacted\ns1: recompacted\ns2: recompacted\n"


def test_the_daemon_imports_no_progress_bar() -> None:
    """tqdm is imported where a bar is drawn, not by the CLI modules `memd run` imports
    (~3 MB of the daemon's ~50 MB, issue 29)."""
    probe = "import sys, memd.cli.main, memd.daemon.process; print('tqdm' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_the_daemon_imports_structlog_without_rich() -> None:
    """structlog imports rich (and pygments) where it is installed, only to colour
    tracebacks that memd formats itself: ~3 MB of memd and of the zygote (issue 29). memd
    hides it while structlog is imported; a later `import rich` still works."""
    pytest.importorskip("rich")  # the dev extras have it (import-linter's)
    probe = (
        "import sys, memd.cli.main, memd.daemon.process, structlog.dev\n"
        "print(sorted({'rich', 'pygments'} & set(sys.modules)), structlog.dev.rich)\n"
        "import rich.console\n"
        "print(rich.console.Console.__name__)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["[] None", "Console"]


def test_proxy_help_shows_the_key_action_as_optional(user: User) -> None:
    """`memd proxy` alone runs the proxy: its usage must not show an action as required."""
    done = user.memd("proxy", "--help")
    assert done.code == 0
    usage = done.out.split("\n\n", 1)[0]
    assert "[key CLIENT [--rotate]]" in usage
    assert "ACTION ..." not in usage
