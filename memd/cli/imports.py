"""`memd import CLIENT FILE`: memd's JSON lines, or a ChatGPT or Claude.ai data export.

The file is streamed (memd.histories) and each conversation goes to the daemon through
`memory.import_exchanges` (up to BATCH exchanges a call, committed together), each
exchange with its original time and an id taken from the source, so a second run (or
one after Ctrl-C or an error) writes only what the first did not. On a terminal a bar
shows the bytes read; the summary at the end counts conversations, exchanges, what was
already there and what was left out and why. Exit 0 when all went in, 1 when an
exchange failed or the file broke off, 2 when the file cannot be read or is no history
memd knows, 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ALL_COMPLETED, FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import UTC
from typing import TYPE_CHECKING, Any

from memd.cli.client import MemdClient, RemoteError
from memd.config import socket_for
from memd.histories import FORMATS, Conversation, History, HistoryError, open_history

if TYPE_CHECKING:
    from tqdm import tqdm

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
WORKERS = 4  # connections at once (see _run)
BATCH, BATCH_CHARS = 200, 1_000_000  # exchanges and characters per call
FATAL = ("unknown_client", "memory_disabled", "unsupported_mode")


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add `import` to the `memd` subcommands."""
    imp = sub.add_parser(
        "import",
        parents=[common],
        help="import memd JSON lines, or a ChatGPT or Claude.ai data export",
        description="Record every conversation of FILE into CLIENT with its original times "
        "and title: `memd export` JSON lines ('-' for stdin), or a ChatGPT or Claude.ai data "
        "export (its .zip or its conversations.json). Running it again writes nothing twice.",
    )
    imp.add_argument("client", help="a client id with memory enabled")
    imp.add_argument("file", help="the export's .zip, conversations.json, JSON lines, or -")
    imp.add_argument("--format", choices=FORMATS, help="the file's format (default: detected)")
    imp.add_argument("--json", action="store_true", help="print the summary as JSON")
    imp.set_defaults(func=cmd_import)


@dataclass
class Summary:
    """What an import did; `skipped` merges what the reader left out and what memd refused."""

    conversations: int = 0
    exchanges: int = 0
    already_there: int = 0
    failed: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    error: str | None = None

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "conversations": self.conversations,
            "imported": self.exchanges,
            "already_there": self.already_there,
            "failed": self.failed,
            "skipped": dict(self.skipped),
        }
        return out | ({"error": self.error} if self.error else {})

    def text(self) -> str:
        line = (
            f"imported {self.exchanges} exchange(s) in {self.conversations} conversation(s), "
            f"{self.already_there} already there, {self.failed} failed"
        )
        left = ", ".join(f"{n} {why}" for why, n in sorted(self.skipped.items()))
        return line + (f"; left out: {left}" if left else "")


def cmd_import(args: argparse.Namespace) -> int:
    try:
        history = open_history(args.file, args.format, sys.stdin.buffer)
    except OSError as exc:
        print(f"memd: cannot read {args.file}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    except HistoryError as exc:
        print(f"memd: {exc}", file=sys.stderr)
        return EXIT_USAGE
    summary = Summary()
    code = EXIT_OK
    with history, _bar(history) as bar:
        try:
            _run(args, history, summary, bar)
        except HistoryError as exc:
            summary.error, code = str(exc), EXIT_ERROR
        except KeyboardInterrupt:
            summary.error = "interrupted: run the same command again to import the rest"
            code = EXIT_INTERRUPTED
        except RemoteError as exc:
            if exc.kind not in FATAL:
                raise
            print(f"memd: {exc}", file=sys.stderr)
            return EXIT_USAGE
        summary.skipped.update(history.tally.skipped)
    if summary.error:
        print(f"memd: {summary.error}", file=sys.stderr)
    print(json.dumps(summary.as_json()) if args.json else summary.text())
    return code if code != EXIT_OK else (EXIT_ERROR if summary.failed else EXIT_OK)


def _run(args: argparse.Namespace, history: History, summary: Summary, bar: tqdm | None) -> None:
    """Conversations go to the daemon on WORKERS connections at once, so its group commit
    shares the state's commit between them (one exchange a call, one at a time, was
    16-19 exchanges/s on a loaded 2-core machine: each waited for its fsyncs). A
    conversation's exchanges stay in order on one connection. memd's own JSON lines go
    one conversation at a time: one may continue across sessions, in order."""
    socket, warning = socket_for(args.config)
    if warning is not None:
        print(f"memd: warning: {warning}", file=sys.stderr)
    workers = 1 if history.format == "memd" else WORKERS
    local = threading.local()
    clients: list[MemdClient] = []

    def one(conv: Conversation) -> Summary:
        if not hasattr(local, "client"):
            local.client = MemdClient(socket, timeout=60.0)
            clients.append(local.client)
        return _conversation(local.client, args.client, conv)

    pending: set[Future[Summary]] = set()
    try:
        with ThreadPoolExecutor(workers, thread_name_prefix="memd-import") as pool:
            try:
                for conv in history.conversations():
                    if len(pending) >= 2 * workers:
                        _merge(summary, pending, FIRST_COMPLETED)
                    pending.add(pool.submit(one, conv))
                    if bar is not None:
                        bar.update(history.position - bar.n)
            except BaseException:  # Ctrl-C, a broken file: finish what started, no more
                for future in pending:
                    future.cancel()
                raise
            finally:
                _merge(summary, pending, ALL_COMPLETED)
    finally:
        for client in clients:
            client.close()


def _merge(summary: Summary, pending: set[Future[Summary]], when: str) -> None:
    """Add what finished (all of it, or at least one) to the summary; errors propagate."""
    done, _ = wait(pending, return_when=when)
    for future in done:
        pending.discard(future)
        if future.cancelled():
            continue
        part = future.result()
        summary.conversations += part.conversations
        summary.exchanges += part.exchanges
        summary.already_there += part.already_there
        summary.failed += part.failed
        summary.skipped.update(part.skipped)


def _conversation(client: MemdClient, client_id: str, conv: Conversation) -> Summary:
    """Import one conversation's exchanges, in order, a batch per call; what happened."""
    s = Summary()
    head: dict[str, Any] = {"client_id": client_id, "conversation_id": conv.conversation_id}
    if conv.title:
        head["title"] = conv.title
    if conv.session_id is not None:
        head["session_id"] = conv.session_id
    for batch in _batches(conv):
        try:
            reply = client.call("memory.import_exchanges", {**head, "exchanges": batch})
        except RemoteError as exc:
            if exc.kind in FATAL:
                raise
            print(f"memd: {conv.conversation_id} ({conv.title}): {exc}", file=sys.stderr)
            s.failed += len(batch)
            continue
        for result in reply["results"]:
            if "error" in result:
                print(
                    f"memd: {conv.conversation_id}: {result['error']['message']}", file=sys.stderr
                )
                s.failed += 1
            elif result.get("duplicate"):
                s.already_there += 1
            elif result.get("skipped"):
                s.skipped[f"exchange(s) in compacted sessions ({result['skipped']})"] += 1
            else:
                s.exchanges += 1
    s.conversations = 1 if s.exchanges else 0
    return s


def _batches(conv: Conversation) -> Iterator[list[dict[str, Any]]]:
    """The exchanges as memory.import_exchanges items, BATCH at most or about BATCH_CHARS
    of text per call (a request line is bounded at 8 MiB)."""
    batch: list[dict[str, Any]] = []
    size = 0
    for ex in conv.exchanges:
        item: dict[str, Any] = {
            "user": ex.user,
            "assistant": ex.assistant,
            "timestamp": ex.when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "exchange_id": ex.exchange_id,
        }
        if ex.origin is not None:
            item["conversation"], item["exchange"] = ex.origin
        length = len(ex.user) + len(ex.assistant)
        if batch and (len(batch) >= BATCH or size + length > BATCH_CHARS):
            yield batch
            batch, size = [], 0
        batch.append(item)
        size += length
    if batch:
        yield batch


class _NoBar:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _bar(history: History) -> Any:
    """tqdm over the bytes read, on a terminal only (as memd.cli.progress does)."""
    if not sys.stderr.isatty() or not history.size:
        return _NoBar()
    from tqdm import tqdm  # here: memd's daemon imports the CLI and never draws a bar (~3 MB)

    return tqdm(
        total=history.size,
        unit="B",
        unit_scale=True,
        desc="importing",
        file=sys.stderr,
        leave=False,
        dynamic_ncols=True,
    )
