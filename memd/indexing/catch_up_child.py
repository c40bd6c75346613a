"""Catch-up as a one-shot child: index the session files the watcher may have missed.

`maintenance.catch_up` runs memsearch's own indexing (`MemSearch.index_file`) with the
watcher's settings. Run inside memd it cost memd pymilvus (and pandas, pyarrow, gRPC:
~90 MB it never gave back) and 3-4 s of its GIL per catch-up under load, beside recall.
So memd runs it here instead: a child forked from the zygote like the watchers (which
preloaded memsearch and pymilvus, so it starts at once and shares their pages), or
spawned plainly when the zygote is off or down. It is not supervised: it runs once, is
waited for, and is not restarted; a failure is logged and the next look (the pipeline's
catch-up loop) tries again, from the same `since`.

Run: python -m memd.indexing.catch_up_child --sessions DIR --since T --run ID --provider P
     --model M --milvus-uri URI --collection C [...]
with the watcher's environment (its key, HOME, token variable: never on argv). Prints one
JSON line {"event": "catch_up_done", "run": ID, "files": n, "chunks": n} on stdout, which
is the child's log (stdout and stderr go there, as for every child); memd reads the line
with its run id back from the log's tail once the child has exited.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from memd.config import Config
from memd.indexing.embed_server import Endpoint
from memd.indexing.settings import (
    Command,
    IndexSettings,
    index_target,
    memsearch_toml,
    uses_embedded_model,
    watcher_embedding,
    watcher_env,
)
from memd.layout import ClientLayout

if TYPE_CHECKING:
    from memd.supervision.child import ChildSpec, Proc, Spawner

log = structlog.get_logger()

MODULE = "memd.indexing.catch_up_child"
DONE_EVENT = "catch_up_done"
TIMEOUT = 600.0  # a catch-up of every session file with a remote provider can take minutes
POLL = 0.05  # seconds between looks at the child (one waitid each)
_TOKEN_ENV = "MEMD_MILVUS_TOKEN"  # as the watcher's (settings.watcher_env sets it)
_LOG_TAIL = 64 * 1024


class CatchUpFailedError(RuntimeError):
    """The catch-up child exited without reporting (its log says why)."""


def catch_up_command(
    config: Config,
    layout: ClientLayout,
    endpoint: Endpoint | None,
    since: float,
    run: str,
    settings: IndexSettings | None = None,
) -> Command:
    """The child's command: the watcher's provider, target and environment."""
    settings = settings or IndexSettings()
    emb = watcher_embedding(config.embedding, endpoint)
    target = index_target(config, layout)
    batch = memsearch_toml(config, layout, settings)["embedding"]["batch_size"]
    argv = [
        sys.executable,
        "-m",
        MODULE,
        "--sessions",
        str(layout.sessions),
        "--since",
        repr(since),
        "--run",
        run,
        "--client",
        layout.client_id,
        "--provider",
        emb.provider,
        "--model",
        emb.model,
        "--milvus-uri",
        target.uri,
        "--collection",
        target.collection,
        "--batch-size",
        str(batch),
        "--max-chunk-size",
        str(settings.max_chunk_size),
        "--overlap-lines",
        str(settings.overlap_lines),
    ]
    if emb.base_url:
        argv += ["--base-url", emb.base_url]
    env = watcher_env(layout, emb, target, embedded=uses_embedded_model(config.embedding))
    return Command(tuple(argv), env, layout.root)


def child_spec(command: Command, layout: ClientLayout) -> ChildSpec:
    from memd.supervision import ChildSpec

    return ChildSpec(
        name=f"{layout.client_id}/catch_up",
        argv=command.argv,
        env=dict(command.env),
        cwd=command.cwd,
        log_path=layout.logs_dir / "catch_up.log",
    )


async def run_child(
    config: Config,
    layout: ClientLayout,
    endpoint: Endpoint | None,
    since: float,
    spawner: Spawner | None = None,
    timeout: float = TIMEOUT,
) -> int:
    """Run one catch-up child to its end and return the chunks it added.

    Call on the event loop thread: the spawn must come from a thread that lives as long
    as memd (PDEATHSIG, see memd.supervision.procs). Raises CatchUpFailedError when the
    child fails or times out; a cancelled caller kills it. Nothing changed since `since`:
    0 at once, no child."""
    if not await asyncio.to_thread(changed_files, layout.sessions, since):
        return 0
    if spawner is None:
        from memd.supervision.procs import PopenSpawner

        spawner = PopenSpawner()
    run = uuid.uuid4().hex
    spec = child_spec(catch_up_command(config, layout, endpoint, since, run), layout)
    proc = spawner.spawn(spec)
    try:
        code = await _exited(proc, time.monotonic() + timeout)
    finally:
        if proc.poll() is None:
            proc.signal(signal.SIGKILL)
            with contextlib.suppress(TimeoutError):
                await _exited(proc, time.monotonic() + 5.0)
    if code is None:
        raise CatchUpFailedError(f"catch-up of {layout.client_id} took over {timeout:.0f} s")
    report = read_report(layout.logs_dir / "catch_up.log", run) if code == 0 else None
    if report is None:
        raise CatchUpFailedError(
            f"catch-up of {layout.client_id} exited with {code} without a report "
            f"(see {spec.log_path})"
        )
    return int(report.get("chunks", 0))


async def _exited(proc: Proc, deadline: float) -> int | None:
    """The child's exit code, or None at the deadline."""
    while (code := proc.poll()) is None:
        if time.monotonic() >= deadline:
            return None
        await asyncio.sleep(POLL)
    return code


def read_report(log_path: Path, run: str) -> dict[str, Any] | None:
    """The child's JSON line for `run`, from the log's tail."""
    try:
        with open(log_path, "rb") as fh:
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - _LOG_TAIL))
            lines = fh.read().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        if b'"event"' not in line:
            continue
        with contextlib.suppress(ValueError):
            report = json.loads(line)
            if isinstance(report, dict) and (report.get("event"), report.get("run")) == (
                DONE_EVENT,
                run,
            ):
                return report
    return None


# -- the child ----------------------------------------------------------------------------


def changed_files(sessions: Path, since: float) -> list[Path]:
    """Session files (not in hidden folders) modified at or after `since`."""
    return [
        p
        for p in sorted(sessions.glob("**/*.md"))
        if not any(part.startswith(".") for part in p.relative_to(sessions).parts)
        and _mtime(p) >= since
    ]


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def index_files(
    files: list[Path],
    *,
    sessions: Path,
    provider: str,
    model: str,
    milvus_uri: str,
    collection: str,
    batch_size: int = 0,
    base_url: str = "",
    api_key: str = "",
    token: str = "",
    max_chunk_size: int = IndexSettings.max_chunk_size,
    overlap_lines: int = IndexSettings.overlap_lines,
) -> int:
    """memsearch's `index_file` over `files`, as the watcher indexes them (so chunk ids
    match and nothing is embedded twice); the number of chunks added."""
    from memsearch.core import MemSearch

    from memd.indexing import chunking

    chunking.install()  # chunk as the watcher does (the indexing size policy)
    mem = MemSearch(
        [str(sessions)],
        embedding_provider=provider,
        embedding_model=model,
        embedding_batch_size=batch_size,
        embedding_base_url=base_url or None,
        embedding_api_key=api_key or None,
        milvus_uri=milvus_uri,
        milvus_token=token or None,
        collection=collection,
        max_chunk_size=max_chunk_size,
        overlap_lines=overlap_lines,
    )

    async def index_all() -> int:
        total = 0
        for path in files:
            if path.exists():
                total += await mem.index_file(path)
        return total

    try:
        return asyncio.run(index_all())
    finally:
        mem.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__)
    parser.add_argument("--sessions", type=Path, required=True)
    parser.add_argument("--since", type=float, required=True, help="a time.time()")
    parser.add_argument("--run", required=True, help="echoed in the report line")
    parser.add_argument("--client", default="")
    parser.add_argument("--provider", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--milvus-uri", required=True)
    parser.add_argument("--collection", required=True)
    parser.add_argument("--batch-size", type=int, default=0)
    parser.add_argument("--max-chunk-size", type=int, default=IndexSettings.max_chunk_size)
    parser.add_argument("--overlap-lines", type=int, default=IndexSettings.overlap_lines)
    parser.add_argument("--base-url", default="")
    args = parser.parse_args(argv)
    from memd import heap
    from memd.logs import configure_logging

    heap.tune()
    configure_logging()
    files = changed_files(args.sessions, args.since)
    added = 0
    if files:  # the key is in the provider's own variable (settings.watcher_env)
        added = index_files(
            files,
            sessions=args.sessions,
            provider=args.provider,
            model=args.model,
            milvus_uri=args.milvus_uri,
            collection=args.collection,
            batch_size=args.batch_size,
            base_url=args.base_url,
            token=os.environ.get(_TOKEN_ENV, ""),
            max_chunk_size=args.max_chunk_size,
            overlap_lines=args.overlap_lines,
        )
    if files:
        log.info("index.catch_up", client=args.client, files=len(files), chunks=added)
    report = {"event": DONE_EVENT, "run": args.run, "files": len(files), "chunks": added}
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
