"""Catch-up as a one-shot child: index the session files the watcher may have missed.

`maintenance.catch_up` runs memsearch's own indexing (`MemSearch.index_file`) with the
watcher's settings. Run inside memd it cost memd pymilvus (and pandas, pyarrow, gRPC:
~65 MB PSS it never gave back) and seconds of its GIL per catch-up under load, beside
recall. So memd runs this module instead (`memd.indexing.daemon.catch_up_run` builds the command
and waits for it): a child forked from the zygote like the watchers (which preloaded
memsearch and pymilvus, so it starts at once), or spawned plainly when the zygote is off
or down. It runs once and is not restarted.

This module is imported by the zygote before it forks, so it imports nothing at the top
beyond the standard library, structlog and the start-up routine with the engine's face
(which the watchers and index servers import too): every module more in the zygote cost
the forked children ~0.4 MB PSS each in copied pages (bench/scale.py, 20 clients).

Run: python -m memd.indexing.children.catch_up_child --sessions DIR --since T --run ID
     --provider P --model M --milvus-uri URI --collection C --batch-size N
     --max-chunk-size N --overlap-lines N [--base-url URL] [--client ID]
with the watcher's environment (its key, HOME, token variable: never on argv). Prints one
JSON line {"event": "catch_up_done", "run": ID, "files": n, "chunks": n} on stdout, which
is the child's log (stdout and stderr go there, as for every child).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

import structlog

from memd.indexing import engine
from memd.indexing.children import CATCH_UP, DONE_EVENT, changed_files, startup

log = structlog.get_logger()

TOKEN_ENV = "MEMD_MILVUS_TOKEN"  # as the watcher's (settings.watcher_env sets it)


def index_files(
    files: list[Path],
    *,
    sessions: Path,
    provider: str,
    model: str,
    milvus_uri: str,
    collection: str,
    batch_size: int,
    max_chunk_size: int,
    overlap_lines: int,
    base_url: str = "",
    api_key: str = "",
    token: str = "",
) -> int:
    """memsearch's `index_file` over `files`, as the watcher indexes them (so chunk ids
    match and nothing is embedded twice); the number of chunks added."""
    from memsearch.core import MemSearch

    # Chunk as the watcher does (the indexing size policy), and never beside the watcher's
    # run on the same files (the index lock): done at the child's start already, not when
    # `maintenance.catch_up` calls this in its own process.
    engine.prepare_catch_up()
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
    parser = argparse.ArgumentParser(prog=f"python -m {CATCH_UP}", description=__doc__)
    parser.add_argument("--sessions", type=Path, required=True)
    parser.add_argument("--since", type=float, required=True, help="a time.time()")
    parser.add_argument("--run", required=True, help="echoed in the report line")
    parser.add_argument("--client", default="")
    parser.add_argument("--provider", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--milvus-uri", required=True)
    parser.add_argument("--collection", required=True)
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--max-chunk-size", type=int, required=True)
    parser.add_argument("--overlap-lines", type=int, required=True)
    parser.add_argument("--base-url", default="")
    args = startup.start(engine.CATCH_UP, parser, argv)
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
            token=os.environ.get(TOKEN_ENV, ""),
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
