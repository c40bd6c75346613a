"""Fault injection against the real daemon: kill -9, SIGSTOP, full and read-only disks,
broken config edits, and clock jumps under the session monitor.

Run alone with `pytest -m faults`. Filesystem faults are real kernel conditions (a small
tmpfs filled to ENOSPC, a loop-mounted ext4 that turns read-only on an error; see
tests/support/faults.py); they need root and skip with the reason otherwise.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from memd.cli.client import MemdClient, RemoteError
from memd.layout import ClientLayout
from memd.markdown import transcript
from memd.sessions.tracker import ClientSessions
from tests.support.daemon import DaemonProcess, base_config, write_config
from tests.support.faults import (
    Chat,
    Tally,
    alive,
    call,
    chat_flood,
    child_status,
    children_by_client,
    cmdline,
    dump,
    exchange_flood,
    exchange_numbers,
    ext4_image,
    loop_ext4_unavailable,
    mount_unavailable,
    part_texts,
    pipeline_running,
    processes_mentioning,
    read_only_tmpfs,
    recall_finds,
    session_paths,
    tmpfs,
    user_texts,
    wait_for,
)
from tests.support.sessions import T0, Clock

pytestmark = pytest.mark.faults


def _start(tmp: Path, clients: dict[str, Any], **extra: Any) -> DaemonProcess:
    path = write_config(tmp / "config.toml", base_config(tmp, clients=clients, **extra))
    return DaemonProcess(path).start()


def _all_running(sock: Path, clients: list[str]) -> bool:
    return all(pipeline_running(sock, c) for c in clients)


def _assert_each_once(found: list[str], wanted: list[str], what: str) -> None:
    counts: dict[str, int] = {}
    for text in found:
        counts[text] = counts.get(text, 0) + 1
    wrong = {t: counts.get(t, 0) for t in wanted if counts.get(t, 0) != 1}
    assert not wrong, f"{what}: expected once each, got {dump(wrong)}"


def _assert_consecutive(path: Path) -> None:
    """Exchange numbers of every conversation are 1..n: nothing lost, nothing twice."""
    for number, exchanges in exchange_numbers(path).items():
        assert exchanges == list(range(1, len(exchanges) + 1)), (number, exchanges)


# --- kill -9 of memd under load ---------------------------------------------------------------

LOAD_CLIENTS = {
    "ann": {"memory_enabled": True, "mode": "mcp_via_llm"},
    "bea": {"memory_enabled": True, "mode": "mcp_via_llm"},
    "cal": {"memory_enabled": True, "mode": "both"},
    "dan": {"memory_enabled": True, "mode": "both"},
}
EXCHANGE_CLIENTS = ["ann", "bea"]
CHAT_CLIENTS = ["cal", "dan"]


def test_sigkill_under_mixed_load_keeps_every_ack_once_and_leaves_no_orphans(
    config_file, daemon_factory, tmp_path
) -> None:
    """Several clients record (exchanges and chat continuations) when memd is kill -9ed:
    its index servers and watchers die with it, every acknowledged exchange is on disk
    exactly once, a gateway's retry of its unanswered call is recognised, and after the
    restart each client has exactly one index server and one watcher (a server per client
    here; the shared one dying with memd: test_shared_index_daemon.py)."""
    path = config_file(clients=LOAD_CLIENTS, supervision={"shared_index_server": False})
    memd = daemon_factory(path)
    sock = memd.socket
    clients = sorted(LOAD_CLIENTS)
    wait_for(lambda: _all_running(sock, clients), 180, 0.3, "pipelines RUNNING")
    children = processes_mentioning(tmp_path / "memory", exclude=(memd.proc.pid,))
    counts = children_by_client(children, tmp_path / "memory", clients)
    assert all(c == {"watcher": 1, "index_server": 1} for c in counts.values()), counts

    tally, stop = Tally(), threading.Event()
    chats = [Chat(c, f"chat{k}") for c in CHAT_CLIENTS for k in range(2)]
    threads = [
        threading.Thread(target=exchange_flood, args=(sock, c, f"conv{k}", tally, stop))
        for c in EXCHANGE_CLIENTS
        for k in range(2)
    ]
    threads += [
        threading.Thread(target=chat_flood, args=(sock, chat, tally, stop)) for chat in chats
    ]
    for t in threads:
        t.start()
    wait_for(lambda: tally.count() >= 300, 120, 0.005, "300 acknowledged records")
    memd.kill(signal.SIGKILL)
    for t in threads:
        t.join(60)
    memd.proc.wait(10)
    assert not tally.refused, tally.refused

    # PR_SET_PDEATHSIG: nothing memd started survives it for more than a moment.
    # (A dying process loses its command line before it is gone: check the pids too.)
    pids = [p.pid for p in children]
    wait_for(
        lambda: not processes_mentioning(tmp_path) and not any(map(alive, pids)),
        10,
        0.1,
        "memd's children dying with it",
    )

    again = daemon_factory(path)
    sock = again.socket
    for client in EXCHANGE_CLIENTS:
        found = user_texts(session_paths(sock, client))
        acked = [t for t in tally.acked if t.startswith(f"{client}/")]
        _assert_each_once(found, acked, f"acknowledged exchanges of {client}")
        assert len(found) == len(set(found)), "an exchange was written twice"
        for p in session_paths(sock, client):
            _assert_consecutive(p)
    with MemdClient(sock, timeout=30) as conn:
        for chat in chats:
            if chat.pending is not None:  # the call memd never answered: a gateway retries
                result = chat.send(conn, *chat.pending)
                allowed = {"duplicate", "continuation"} if chat.turns else {"duplicate", "new"}
                assert result["match"] in allowed, (chat.name, result)
            result = chat.send(conn, *chat.next_call())
            assert (result["match"], result["appended"]) == ("continuation", 2), result
    for client in CHAT_CLIENTS:
        paths = session_paths(sock, client)
        mine = [c for c in chats if c.client == client]
        questions = [f"{client}/{c.name}/q{i}" for c in mine for i in range(c.turns)]
        answers = [f"{client}/{c.name}/a{i}" for c in mine for i in range(c.turns)]
        _assert_each_once(user_texts(paths), questions, f"chat questions of {client}")
        _assert_each_once(part_texts(paths, "Assistant"), answers, f"chat answers of {client}")

    wait_for(lambda: _all_running(sock, clients), 180, 0.3, "pipelines RUNNING after restart")
    time.sleep(2)  # a straggler from the killed run would show itself now
    procs = processes_mentioning(tmp_path / "memory", exclude=(again.proc.pid,))
    counts = children_by_client(procs, tmp_path / "memory", clients)
    assert all(c == {"watcher": 1, "index_server": 1} for c in counts.values()), (
        counts,
        [cmdline(p) for p in procs],
    )
    status = call(sock, "daemon.status")["clients"]
    live = {p.pid for p in procs}
    for client in clients:
        assert {status[client]["watcher"]["pid"], status[client]["index_server"]["pid"]} <= live


# --- SIGKILL and SIGSTOP of index servers and watchers ---------------------------------------

PROC_CLIENTS = {
    "vic": {"memory_enabled": True, "mode": "mcp_via_llm"},
    "oth": {"memory_enabled": True, "mode": "both"},
}
BASELINE = {
    "vic": ("Where did I park the camper van?", "The camper van is at Lot Quokka-7."),
    "oth": ("Which bakery sells rye?", "The Brotzeit bakery sells rye on Fridays."),
}


@pytest.fixture(scope="module")
def piped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    """One daemon with two clients whose pipelines run and whose baseline is searchable.

    Tests that stop or kill a child put it back (SIGCONT, or wait for the restart). An index
    server per client: stopping vic's must leave oth's serving (a stopped shared server
    stalls every client: test_recall_daemon.py)."""
    tmp = tmp_path_factory.mktemp("faults-procs")
    memd = _start(tmp, PROC_CLIENTS, supervision={"shared_index_server": False})
    try:
        sock = memd.socket
        wait_for(lambda: _all_running(sock, list(PROC_CLIENTS)), 180, 0.3, "pipelines RUNNING")
        call(
            sock,
            "memory.record_exchange",
            {
                "client_id": "vic",
                "conversation_id": "base",
                "user": BASELINE["vic"][0],
                "assistant": BASELINE["vic"][1],
            },
        )
        call(
            sock,
            "memory.record_chat",
            {
                "client_id": "oth",
                "messages": [{"role": "user", "content": BASELINE["oth"][0]}],
                "response": {"role": "assistant", "content": BASELINE["oth"][1]},
            },
        )
        wait_for(
            lambda: recall_finds(sock, "vic", "camper van parked", "Quokka-7"),
            90,
            0.3,
            "vic's baseline searchable",
        )
        wait_for(
            lambda: recall_finds(sock, "oth", "bakery rye", "Brotzeit"),
            90,
            0.3,
            "oth's baseline searchable",
        )
        yield memd
    finally:
        memd.stop()


def _record(sock: Path, client: str, user: str, assistant: str) -> dict[str, Any]:
    return call(
        sock,
        "memory.record_exchange",
        {"client_id": client, "conversation_id": "faults", "user": user, "assistant": assistant},
    )


def _restarted(sock: Path, client: str, name: str, old_pid: int) -> bool:
    child = child_status(sock, client, name)
    return child.get("state") == "RUNNING" and child.get("pid") not in (None, old_pid)


@pytest.mark.slow
def test_sigkilled_index_server_is_restarted_and_catches_up(piped: DaemonProcess) -> None:
    sock = piped.socket
    old = child_status(sock, "vic", "index_server")
    os.kill(old["pid"], signal.SIGKILL)
    _record(
        sock,
        "vic",
        "What is the gate code of the allotment?",
        "The allotment gate code is 5150-heron.",
    )
    wait_for(
        lambda: _restarted(sock, "vic", "index_server", old["pid"]),
        90,
        0.2,
        "index server restarted",
    )
    assert child_status(sock, "vic", "index_server")["restarts"] >= old["restarts"] + 1
    wait_for(
        lambda: recall_finds(sock, "vic", "allotment gate code", "5150-heron"),
        60,
        0.3,
        "exchange recorded while the index server was down becomes searchable",
    )
    assert recall_finds(sock, "vic", "camper van parked", "Quokka-7")


@pytest.mark.slow
def test_index_server_and_watcher_killed_together_both_come_back(piped: DaemonProcess) -> None:
    sock = piped.socket
    server = child_status(sock, "vic", "index_server")
    watcher = child_status(sock, "vic", "watcher")
    os.kill(watcher["pid"], signal.SIGKILL)
    os.kill(server["pid"], signal.SIGKILL)
    _record(
        sock,
        "vic",
        "Which ferry goes to the island?",
        "The 07:40 ferry Marguerite goes to the island.",
    )
    wait_for(
        lambda: (
            _restarted(sock, "vic", "index_server", server["pid"])
            and _restarted(sock, "vic", "watcher", watcher["pid"])
        ),
        120,
        0.2,
        "index server and watcher restarted",
    )
    wait_for(
        lambda: recall_finds(sock, "vic", "ferry to the island", "Marguerite"),
        90,
        0.3,
        "exchange recorded while both were down becomes searchable",
    )


def _long_chat(n: int, tag: str) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": f"long chat {tag}"}]
    for i in range(n // 2):
        messages += [
            {"role": "user", "content": f"{tag} question {i}"},
            {"role": "assistant", "content": f"{tag} answer {i}"},
        ]
    return [*messages, {"role": "user", "content": f"{tag} last question"}]


class _Order:
    """Completion order of concurrent calls: ordering, not timing, is asserted."""

    def __init__(self) -> None:
        self.done: list[str] = []
        self._lock = threading.Lock()

    def run(self, name: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        finally:
            with self._lock:
                self.done.append(name)

    def first(self, name: str) -> int:
        return self.done.index(name)

    def last(self, name: str) -> int:
        return len(self.done) - 1 - self.done[::-1].index(name)


def _recall_or_error(sock: Path, client: str, query: str) -> RemoteError | dict[str, Any]:
    try:
        return call(sock, "memory.recall", {"client_id": client, "query": query}, timeout=60)
    except RemoteError as exc:
        return exc


def _unavailable(answer: Any) -> bool:
    return isinstance(answer, RemoteError) and (answer.code, answer.kind) == (
        -32006,
        "index_unavailable",
    )


@pytest.mark.slow
def test_stopped_index_server_fails_recall_fast_and_recording_goes_on(piped: DaemonProcess) -> None:
    """SIGSTOP vic's index server (its socket accepts, nothing answers): recall and the tool
    answer "unavailable" instead of hanging, recording goes on, and after SIGCONT what was
    recorded meanwhile becomes searchable."""
    sock = piped.socket
    pid = child_status(sock, "vic", "index_server")["pid"]
    order = _Order()
    os.kill(pid, signal.SIGSTOP)
    try:
        with ThreadPoolExecutor(8) as pool:
            recalls = [
                pool.submit(order.run, "vic-recall", _recall_or_error, sock, "vic", "camper van")
                for _ in range(2)
            ]
            tool = pool.submit(
                call,
                sock,
                "memory.call_tool",
                {"client_id": "vic", "name": "MemoryRecall", "arguments": {"query": "camper van"}},
                60,
            )
            time.sleep(0.5)  # the searches are stuck on the stopped server
            record = pool.submit(
                order.run,
                "record",
                _record,
                sock,
                "vic",
                "What is the name of the neighbour's cat?",
                "The neighbour's cat is called Biscotti-Moon.",
            )
            assert record.result(60)["conversation"] >= 1
            answers = [r.result(60) for r in recalls]
            tool_result = tool.result(60)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert all(_unavailable(a) for a in answers), answers
    assert tool_result["isError"] is True
    assert "not available right now" in tool_result["content"][0]["text"]
    assert order.first("record") < order.first("vic-recall"), order.done
    wait_for(
        lambda: recall_finds(sock, "vic", "neighbour's cat name", "Biscotti-Moon"),
        90,
        0.3,
        "exchange recorded while the index server was stopped becomes searchable",
    )


@pytest.mark.slow
def test_stopped_index_server_does_not_starve_other_clients(piped: DaemonProcess) -> None:
    """vic's gateway keeps asking while vic's index server is stopped: those searches must
    not take the worker threads that another client's recall, or hashing a long chat
    (> 256 messages, done in a thread), needs."""
    sock = piped.socket
    pid = child_status(sock, "vic", "index_server")["pid"]
    order = _Order()
    os.kill(pid, signal.SIGSTOP)
    try:
        with ThreadPoolExecutor(16) as pool:
            recalls = [
                pool.submit(order.run, "vic-recall", _recall_or_error, sock, "vic", "camper van")
                for _ in range(12)
            ]
            time.sleep(0.5)  # vic's searches are stuck on the stopped server
            long_chat = _long_chat(300, "starve")
            chat = pool.submit(
                order.run,
                "long-chat",
                call,
                sock,
                "memory.record_chat",
                {
                    "client_id": "oth",
                    "messages": long_chat,
                    "response": {"role": "assistant", "content": "starve last answer"},
                },
                60,
            )
            other = pool.submit(
                order.run, "other-recall", _recall_or_error, sock, "oth", "bakery rye"
            )
            assert chat.result(60)["appended"] == len(long_chat) + 1
            other_answer = other.result(60)
            answers = [r.result(60) for r in recalls]
    finally:
        os.kill(pid, signal.SIGCONT)
    problems = []
    if not all(_unavailable(a) for a in answers):
        problems.append(f"vic's recalls: {answers}")
    if not (
        isinstance(other_answer, dict)
        and any("Brotzeit" in r["content"] for r in other_answer["results"])
    ):
        problems.append(f"oth's recall failed: {other_answer!r}")
    # vic's stuck searches end last (after their ~10 s timeout); calls that needed no
    # index of vic's must not wait for them. (Recalls refused at once may end earlier.)
    if order.first("long-chat") > order.last("vic-recall"):
        problems.append(f"the long chat waited for vic's searches: {order.done}")
    if order.first("other-recall") > order.last("vic-recall"):
        problems.append(f"oth's recall waited for vic's searches: {order.done}")
    assert not problems, "\n".join(problems)


@pytest.mark.slow
def test_stopped_watcher_catches_up_after_sigcont(piped: DaemonProcess) -> None:
    sock = piped.socket
    wait_for(
        lambda: recall_finds(sock, "vic", "camper van parked", "Quokka-7"),
        60,
        0.3,
        "vic's index answers",
    )  # an earlier test may have left it reconnecting
    pid = child_status(sock, "vic", "watcher")["pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        _record(
            sock,
            "vic",
            "Where is the spare bike pump?",
            "The spare bike pump hangs behind the shed door, left of the rake.",
        )
        # The index itself is fine: recall answers (without the new exchange yet).
        assert recall_finds(sock, "vic", "camper van parked", "Quokka-7")
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_for(
        lambda: recall_finds(sock, "vic", "spare bike pump", "behind the shed door"),
        90,
        0.3,
        "exchange recorded while the watcher was stopped becomes searchable",
    )
    assert child_status(sock, "vic", "watcher")["pid"] == pid


# --- full and read-only filesystems ----------------------------------------------------------

DISK_CLIENTS = {
    "disk": {"memory_enabled": True, "mode": "both"},  # its folder is the faulty filesystem
    "fine": {"memory_enabled": True, "mode": "mcp_via_llm"},
}


def _needs_mount() -> None:
    reason = mount_unavailable()
    if reason:
        pytest.skip(reason)


def _flood_disk(
    sock: Path, tally: Tally, stop: threading.Event, chat: Chat
) -> list[threading.Thread]:
    """Two exchange floods and one chat on the faulty client; a call unanswered for 20 s
    counts as hung (in_flight)."""
    threads = [
        threading.Thread(
            target=exchange_flood, args=(sock, "disk", f"conv{k}", tally, stop, 100_000, 0.002, 20)
        )
        for k in range(2)
    ]
    threads.append(threading.Thread(target=chat_flood, args=(sock, chat, tally, stop, 100_000, 20)))
    for t in threads:
        t.start()
    return threads


def _check_disk_transcripts(sock: Path, acked: list[str], refused: list[str]) -> None:
    """Every `acked` record once, none of `refused`, nothing twice, numbering without gaps."""
    paths = session_paths(sock, "disk")
    users = user_texts(paths)
    _assert_each_once(users, acked, "acknowledged records")
    assert not [t for t in refused if t in users], "a refused record reached the transcript"
    assert len(users) == len(set(users)), "something was written twice"
    for path in paths:
        _assert_consecutive(path)


def _refused(tally: Tally) -> list[str]:
    return [t for texts in tally.refused.values() for t in texts]


def test_full_disk_refuses_records_and_recovers_when_space_returns(tmp_path: Path) -> None:
    """ENOSPC on the client's folder: record calls fail with storage_error (no hang, no
    internal error), the daemon keeps serving, nothing acknowledged is lost, and once
    space is back recording goes on in the same, consistent transcript."""
    _needs_mount()
    with tmpfs(tmp_path / "memory" / "disk", size="64m") as disk:
        memd = _start(tmp_path, DISK_CLIENTS)
        try:
            sock = memd.socket
            wait_for(lambda: _all_running(sock, list(DISK_CLIENTS)), 180, 0.3, "pipelines RUNNING")
            tally, stop, chat = Tally(), threading.Event(), Chat("disk", "chat")
            threads = _flood_disk(sock, tally, stop, chat)
            wait_for(lambda: tally.count() >= 60, 60, 0.01, "records before the disk fills")
            disk.fill()
            wait_for(
                lambda: len(tally.refused.get("storage_error", [])) >= 10,
                60,
                0.05,
                "records refused with storage_error",
            )
            # Full disk: the daemon keeps serving, and other clients keep recording.
            assert call(sock, "daemon.status")["state"] == "running"
            assert _record(sock, "fine", "still recording?", "yes")["conversation"] >= 1
            acked_while_full = tally.count()
            disk.free()
            wait_for(
                lambda: tally.count() >= acked_while_full + 60,
                60,
                0.01,
                "records after space returned",
            )
            stop.set()
            for t in threads:
                t.join(60)
            assert not tally.in_flight, f"calls never answered: {tally.in_flight}"
            assert set(tally.refused) == {"storage_error"}, tally.refused.keys()
            # A refused chat turn is sent again: only refused exchanges must be absent.
            refused = [t for t in _refused(tally) if "/conv" in t]
            _check_disk_transcripts(sock, tally.acked, refused)
            _record(
                sock,
                "disk",
                "Where do the spare fuses live?",
                "The spare fuses live in the biscuit tin marked Oolong.",
            )
            wait_for(
                lambda: recall_finds(sock, "disk", "spare fuses", "biscuit tin"),
                90,
                0.3,
                "the index works again once space is back",
            )
            # A restart finds the same transcripts: recovery cuts nothing acknowledged.
            memd.stop()
            memd = DaemonProcess(memd.config_path).start()
            _check_disk_transcripts(memd.socket, tally.acked, refused)
            result = call(
                memd.socket,
                "memory.record_chat",
                {
                    "client_id": "disk",
                    "messages": chat.next_call()[0],
                    "response": chat.next_call()[1],
                },
            )
            assert result["match"] == "continuation"
        finally:
            memd.stop()


def test_read_only_filesystem_refuses_records_and_loses_nothing(tmp_path: Path) -> None:
    """The client's filesystem turns read-only under memd (an ext4 error with
    errors=remount-ro, as a failing disk does): records fail with storage_error without
    hanging, the daemon keeps serving, memd still stops within its bound, and after fsck
    and a restart every record acknowledged before the error is there once, the
    transcript is consistent, and recording goes on.

    (A record in flight at the instant of the error has no defined fate: its fsync may
    fail after its bytes reached the disk. Only what was acknowledged before is checked.)
    Every step is checked even when an earlier one went wrong; the failure lists them all.
    """
    reason = loop_ext4_unavailable()
    if reason:
        pytest.skip(reason)
    problems: list[str] = []
    with ext4_image(tmp_path / "memory" / "disk", size_mb=96) as disk:
        memd = _start(tmp_path, DISK_CLIENTS)
        try:
            sock = memd.socket
            wait_for(lambda: _all_running(sock, list(DISK_CLIENTS)), 180, 0.3, "pipelines RUNNING")
            tally, stop, chat = Tally(), threading.Event(), Chat("disk", "chat")
            threads = _flood_disk(sock, tally, stop, chat)
            wait_for(lambda: tally.count() >= 60, 60, 0.01, "records before the error")
            with tally.lock:
                acked_before = list(tally.acked)
            disk.trigger_error()
            assert disk.read_only()
            wait_for(
                lambda: len(tally.refused.get("storage_error", [])) >= 10 or tally.in_flight,
                60,
                0.05,
                "records refused with storage_error",
            )
            assert call(sock, "daemon.status")["state"] == "running"
            assert _record(sock, "fine", "still recording?", "yes")["conversation"] >= 1
            stop.set()
            for t in threads:
                t.join(60)
            if tally.in_flight:
                problems.append(f"record calls hung (no answer in 20 s): {tally.in_flight}")
            if set(tally.refused) - {"storage_error"}:
                problems.append(f"refused with other kinds: {sorted(tally.refused)}")
            try:
                code = memd.stop(signal.SIGTERM, timeout=30)
                if code != 0:
                    problems.append(f"memd exited with {code} on SIGTERM")
            except subprocess.TimeoutExpired:
                problems.append("memd did not stop within 30 s of SIGTERM (it was SIGKILLed)")
            wait_for(
                lambda: not processes_mentioning(tmp_path / "memory"),
                10,
                0.1,
                "no process holds the broken filesystem",
            )
            crashes = memd.log().count('"child.supervise_failed"')
            if crashes:
                problems.append(f"the supervisor's tick raised {crashes} times (see memd.log)")
            disk.repair()
            memd = DaemonProcess(memd.config_path).start()
            _check_disk_transcripts(memd.socket, acked_before, [])
            assert _record(memd.socket, "disk", "after repair?", "works")["conversation"] >= 1
        finally:
            memd.stop()
    assert not problems, "\n".join(problems)


def test_enabling_a_client_whose_folder_is_read_only_keeps_reload_working(tmp_path: Path) -> None:
    """A config edit enables a client whose folder cannot be written: the daemon says so,
    keeps serving the others, and later config edits still apply."""
    _needs_mount()
    good = {"gw": {"memory_enabled": True, "mode": "mcp_via_llm"}}
    with read_only_tmpfs(tmp_path / "memory" / "stuck"):
        memd = _start(tmp_path, good)
        try:
            sock = memd.socket
            path = memd.config_path
            write_config(
                path,
                base_config(
                    tmp_path, clients={**good, "stuck": {"memory_enabled": True, "mode": "both"}}
                ),
            )

            def stuck_refused() -> RemoteError | None:
                try:
                    _record(sock, "stuck", "u", "a")
                except RemoteError as exc:
                    return exc if exc.kind != "unknown_client" else None
                return None

            error = wait_for(stuck_refused, 30, 0.2, "the edit reached the daemon")
            assert error.kind in ("storage_error", "not_started"), error
            assert _record(sock, "gw", "still here?", "yes")["conversation"] == 1
            # A later edit must still be applied.
            write_config(
                path,
                base_config(
                    tmp_path,
                    clients={
                        **good,
                        "stuck": {"memory_enabled": True, "mode": "both"},
                        "later": {"memory_enabled": True, "mode": "mcp_via_llm"},
                    },
                ),
            )
            wait_for(
                lambda: "later" in call(sock, "daemon.status")["clients"],
                30,
                0.2,
                "a later config edit applied",
            )
            assert _record(sock, "later", "new client?", "yes")["conversation"] == 1
            status = call(sock, "daemon.status")
            assert status["clients"]["stuck"] != {} or status["config_error"], (
                "the broken client is not reported anywhere"
            )
        finally:
            memd.stop()


def test_start_with_one_client_folder_read_only_serves_the_others(tmp_path: Path) -> None:
    """One client's folder is read-only when memd starts: memd starts anyway and the other
    clients get their memory."""
    _needs_mount()
    clients = {
        "gw": {"memory_enabled": True, "mode": "mcp_via_llm"},
        "stuck": {"memory_enabled": True, "mode": "both"},
    }
    with read_only_tmpfs(tmp_path / "memory" / "stuck"):
        path = write_config(tmp_path / "config.toml", base_config(tmp_path, clients=clients))
        memd = DaemonProcess(path)
        try:
            memd.start(timeout=60)
            assert _record(memd.socket, "gw", "works?", "yes")["conversation"] == 1
            with pytest.raises(RemoteError) as err:
                _record(memd.socket, "stuck", "u", "a")
            assert err.value.kind in ("storage_error", "not_started")
        finally:
            memd.stop()


# --- broken config edits ---------------------------------------------------------------------

GOOD_CLIENTS = {"gw": {"memory_enabled": True, "mode": "mcp_via_llm"}}
# Each edit would change something visible if it were applied: gw disabled, a new client.
CHANGED_CLIENTS = {
    "gw": {"memory_enabled": False, "mode": "mcp_via_llm"},
    "extra": {"memory_enabled": True, "mode": "both"},
}


def _toml(tmp: Path, **extra: Any) -> bytes:
    import tomli_w

    return tomli_w.dumps(base_config(tmp, clients=CHANGED_CLIENTS, **extra)).encode()


def _half_written(tmp: Path) -> bytes:
    text = _toml(tmp)
    cut = text.index(b"memory_enabled = true") + len(b"memory_ena")
    return text[:cut]  # an editor that writes in place, caught mid-write


def _client_table(client_id: str) -> Any:
    def build(tmp: Path) -> bytes:
        import tomli_w

        data = base_config(tmp, clients=GOOD_CLIENTS)
        text = tomli_w.dumps(data).encode()
        return text + f"\n[clients.{_toml_key(client_id)}]\nmemory_enabled = true\n".encode()

    return build


def _toml_key(key: str) -> str:
    import json

    return json.dumps(key)  # a TOML basic string: quotes, escapes, \\u0000


# (id, content builder or action, words the reported error must contain)
BROKEN_EDITS: list[tuple[str, Any, str]] = [
    ("invalid_toml", lambda tmp: b"[clients.gw\nmemory_enabled = true\n", "invalid TOML"),
    ("half_written", _half_written, "invalid TOML"),
    ("not_utf8", lambda tmp: _toml(tmp) + b"\n# caf\xe9\n", "UTF-8"),
    ("unknown_top_key", lambda tmp: _toml(tmp, memory_enabled=True), "memory_enabled"),
    (
        "unknown_client_key",
        lambda tmp: _toml(tmp).replace(b"memory_enabled = false", b"memory_enabeld = false"),
        "memory_enabeld",
    ),
    ("unknown_section_key", lambda tmp: _toml(tmp, embedding={"modle": "x"}), "modle"),
    (
        "wrong_type_bool",
        lambda tmp: _toml(tmp).replace(b"memory_enabled = false", b'memory_enabled = "false"'),
        "memory_enabled",
    ),
    (
        "wrong_type_clients",
        lambda tmp: _toml(tmp).split(b"[clients")[0] + b"clients = 5\n",
        "clients",
    ),
    (
        "wrong_type_duration",
        lambda tmp: _toml(tmp, monitor_interval_seconds="fast"),
        "monitor_interval_seconds",
    ),
    (
        "zero_duration",
        lambda tmp: _toml(tmp, session_inactivity_minutes=0),
        "session_inactivity_minutes",
    ),
    (
        "nan_duration",
        lambda tmp: _toml(tmp).replace(b"[clients", b"max_session_minutes = nan\n[clients", 1),
        "max_session_minutes",
    ),
    (
        "unset_env_secret",
        lambda tmp: _toml(
            tmp, embedding={"provider": "openai", "api_key": "env:MEMD_FAULTS_UNSET"}
        ),
        "MEMD_FAULTS_UNSET",
    ),
    ("bad_mode", lambda tmp: _toml(tmp).replace(b'mode = "both"', b'mode = "all"'), "mode"),
    ("empty_file", lambda tmp: b"", ""),
    ("deleted_file", None, ""),
    ("directory_instead", "dir", "cannot read"),
    ("client_id_dotdot", _client_table("../evil"), "client id"),
    ("client_id_nested", _client_table("gw/../../evil"), "client id"),
    ("client_id_absolute", _client_table("/tmp/evil"), "client id"),
    ("client_id_nul", _client_table("gw\x00evil"), "client id"),
    ("client_id_backslash", _client_table("gw\\..\\evil"), "client id"),
    ("client_id_lookalike_slash", _client_table("gw\u2215..\u2215evil"), "client id"),
    ("client_id_fullwidth_dots", _client_table("\uff0e\uff0e"), "client id"),
    ("client_id_too_long", _client_table("g" * 65), "client id"),
    ("client_id_dot", _client_table("."), "client id"),
    ("client_id_space", _client_table("gw evil"), "client id"),
]


@pytest.fixture(scope="module")
def config_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    tmp = tmp_path_factory.mktemp("faults-config")
    memd = _start(tmp, GOOD_CLIENTS)
    try:
        yield memd
    finally:
        memd.stop()


def _apply_broken(path: Path, action: Any) -> None:
    if path.is_dir():
        path.rmdir()
    elif path.exists() and action in (None, "dir"):
        path.unlink()
    if action == "dir":
        path.mkdir()
    elif action is not None:
        path.write_bytes(action(path.parent))  # in place, as some editors do


@pytest.mark.parametrize(
    ("action", "words"), [pytest.param(a, w, id=i) for i, a, w in BROKEN_EDITS]
)
def test_broken_config_edit_is_reported_and_last_good_config_stays(
    config_daemon: DaemonProcess, action: Any, words: str
) -> None:
    memd, sock, path = config_daemon, config_daemon.socket, config_daemon.config_path
    tmp = path.parent
    pid = call(sock, "daemon.status")["pid"]
    before = sorted(p.name for p in tmp.iterdir() if p != path)
    try:
        _apply_broken(path, action)
        error = wait_for(
            lambda: call(sock, "daemon.status")["config_error"],
            30,
            0.1,
            "the broken edit reported in daemon.status",
        )
        assert words in error, error
        status = call(sock, "daemon.status")
        assert status["pid"] == pid
        assert sorted(status["clients"]) == ["gw"], status["clients"].keys()
        assert status["clients"]["gw"]["memory_on"] is True
        assert _record(sock, "gw", "still on?", "yes")["session_id"]
        with pytest.raises(RemoteError) as err:
            _record(sock, "extra", "u", "a")
        assert err.value.kind == "unknown_client"
        # Path tricks in a client id never reach the filesystem.
        assert sorted(p.name for p in tmp.iterdir() if p != path) == before
        # memd's own .memd (the zygote's pidfile and log) sits beside the client folders.
        assert sorted(p.name for p in (tmp / "memory").iterdir()) == [".memd", "gw"]
    finally:
        if path.is_dir():
            path.rmdir()
        write_config(path, base_config(tmp, clients=GOOD_CLIENTS))
        wait_for(
            lambda: call(sock, "daemon.status")["config_error"] is None,
            30,
            0.1,
            "the good config accepted again",
        )
    assert memd.proc.poll() is None


@pytest.mark.parametrize(
    "action",
    [pytest.param(lambda tmp: b"", id="empty_file"), pytest.param(None, id="deleted_file")],
)
def test_config_on_defaults_emptied_or_deleted_keeps_last_good_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, action: Any
) -> None:
    """A config that relies on the default memory_dir and socket (the common case): an
    emptied or deleted file must not switch every client off under the running daemon."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "xdg"))
    path = tmp_path / "config.toml"
    write_config(path, {"clients": GOOD_CLIENTS})
    memd = DaemonProcess(path).start()
    try:
        sock = memd.socket
        assert sock.is_relative_to(tmp_path)
        assert _record(sock, "gw", "before", "edit")["conversation"] == 1
        _apply_broken(path, action)
        time.sleep(3)  # longer than the config poll interval (2 s) and the watch debounce
        status = call(sock, "daemon.status")
        assert status["clients"].get("gw", {}).get("memory_on") is True, (
            f"the last good config was dropped: {dump(status['clients'])}"
        )
        assert status["config_error"], "the emptied/deleted config was not reported"
        assert _record(sock, "gw", "after", "edit")["conversation"] == 1
    finally:
        memd.stop()


# --- clock jumps under the session monitor ---------------------------------------------------
# Session deadlines are wall-clock epoch seconds (ClientSessions(clock=time.time)); these
# drive the real library (real files, real sqlite) with a clock that jumps.

INACTIVITY, MAX = 10.0, 30.0  # minutes


def _sessions(root: Path, clock: Clock, ended: list[dict[str, Any]]) -> ClientSessions:
    return ClientSessions(
        ClientLayout(root, "jumpy"),
        inactivity_minutes=INACTIVITY,
        max_minutes=MAX,
        clock=clock,
        on_end=[ended.append],
    )


def _iso_minutes(m: float) -> str:
    return transcript.iso(T0 + m * 60)


def test_clock_jump_forward_ends_sessions_once_at_their_deadlines(tmp_path: Path) -> None:
    async def scenario() -> None:
        clock, ended = Clock(), []
        async with _sessions(tmp_path, clock, ended) as cs:
            idle = await cs.record_exchange("idle", "u", "a")  # session A
            clock.advance(5)
            await cs.record_exchange("idle", "u2", "a2")  # A's last activity: T0+5
            clock.advance(3 * 24 * 60)  # the machine resumes three days later
            [info] = await cs.expire()
            assert (info["session_id"], info["end_reason"], info["ended"]) == (
                idle["session_id"],
                "inactivity",
                _iso_minutes(5 + INACTIVITY),
            )
            assert await cs.expire() == []
            assert [e["session_id"] for e in ended] == [idle["session_id"]]

        # A busy session runs into the maximum duration before the jump.
        clock2, ended2 = Clock(), []
        async with _sessions(tmp_path / "busy", clock2, ended2) as cs:
            busy = await cs.record_exchange("busy", "u", "a")
            for _ in range(5):
                clock2.advance(5)
                await cs.record_exchange("busy", "u", "a")  # last activity T0+25
            clock2.advance(24 * 60)
            # A new conversation arrives before the monitor looks: it ends A at its
            # deadline (with the end hooks) and starts a fresh session now.
            fresh = await cs.record_exchange("new", "u", "a")
            assert fresh["session_id"] != busy["session_id"]
            assert await cs.expire() == []
            rows = {r["session_id"]: r for r in await cs.list_sessions()}
            assert (rows[busy["session_id"]]["end_reason"], rows[busy["session_id"]]["ended"]) == (
                "max_duration",
                _iso_minutes(MAX),
            )
            assert rows[fresh["session_id"]]["started"] == _iso_minutes(25 + 24 * 60)
            assert [e["session_id"] for e in ended2] == [busy["session_id"]]

        # The jump happens while memd is down: the reopened store ends A on the next check.
        clock3, ended3 = Clock(), []
        async with _sessions(tmp_path / "down", clock3, ended3) as cs:
            down = await cs.record_exchange("c", "u", "a")
        clock3.advance(7 * 24 * 60)
        async with _sessions(tmp_path / "down", clock3, ended3) as cs:
            [info] = await cs.expire()
            assert (info["session_id"], info["ended"]) == (
                down["session_id"],
                _iso_minutes(INACTIVITY),
            )
            assert await cs.expire() == []
        assert len(ended3) == 1

    asyncio.run(scenario())


def test_clock_jump_backward_ends_nothing_early_and_breaks_nothing(tmp_path: Path) -> None:
    async def scenario() -> None:
        clock, ended = Clock(), []
        async with _sessions(tmp_path, clock, ended) as cs:
            first = await cs.record_exchange("c", "u1", "a1")
            clock.advance(-120)  # NTP steps the clock back two hours
            assert await cs.expire() == []
            again = await cs.record_exchange("c", "u2", "a2")
            assert again["session_id"] == first["session_id"]
            other = await cs.record_chat(
                [{"role": "user", "content": "hello"}], {"role": "assistant", "content": "hi"}
            )
            assert other["session_id"] == first["session_id"]
            [active] = await cs.list_sessions()
            assert active["state"] == "active"
            assert active["last_activity"] == _iso_minutes(0)  # never moves backwards
            clock.advance(INACTIVITY + 1)  # real idle time passes, wall clock still behind
            assert await cs.expire() == []  # nothing ends early
            clock.advance(120)  # the clock is past the deadline again
            [info] = await cs.expire()
            assert (info["end_reason"], info["ended"]) == ("inactivity", _iso_minutes(INACTIVITY))
            assert await cs.expire() == []
            users = user_texts([Path(first["path"])])
            assert users == ["u1", "u2", "hello"]
            _assert_consecutive(Path(first["path"]))

            # sessions.close right after a backward jump: a session must not end before
            # its own last activity (nor before it started).
            later = await cs.record_exchange("d", "u", "a")
            clock.advance(-60)
            [closed] = await cs.close_active()
            assert closed["session_id"] == later["session_id"]
            for row in await cs.list_sessions():
                assert row["started"] <= row["last_activity"] <= row["ended"], row
        assert len(ended) == 2

    asyncio.run(scenario())
