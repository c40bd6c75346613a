"""An index's life beside its watcher: start-up detection, catch-up, fingerprint and rebuild.

The watcher is started by the pipeline from the client's plan (`memd.indexing.daemon.plan`);
this module decides whether the index it will write into still matches the configured
embedding (`IndexSpec`), rebuilds it from the markdown files when it does not, and indexes
what the watcher missed while it was starting.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
from dataclasses import asdict, replace
from pathlib import Path

import structlog

from memd import trust
from memd.config import Config
from memd.indexing import analysis
from memd.indexing.daemon.plan import ClientPlan
from memd.indexing.daemon.settings import IndexSettings, IndexSpec, milvus_data_dir, spec_path
from memd.indexing.targets import Endpoint, IndexTarget, watcher_embedding
from memd.layout import ClientLayout

log = structlog.get_logger()

# -- watcher start-up --------------------------------------------------------------------


def watcher_ready(pid: int, sessions: Path) -> bool:
    """True once process `pid` holds an inotify watch on `sessions` (Linux).

    `memsearch watch` prints "Watching ..." *before* it starts its observer, and indexes
    what exists *before* that: a file written in between is not indexed until it changes
    again. The inotify watch, visible in /proc/<pid>/fdinfo, is the real start. Where
    /proc does not exist this returns True (use the log line and `catch_up`).
    """
    if not Path("/proc/self/fdinfo").exists():
        return True
    try:
        st = sessions.stat()
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return False
    sdev = (os.major(st.st_dev) << 20) | os.minor(st.st_dev)
    wanted = f"ino:{st.st_ino:x} sdev:{sdev:x} "
    for fd in fds:
        try:
            if os.readlink(fd) != "anon_inode:inotify":
                continue
            info = Path(f"/proc/{pid}/fdinfo/{fd.name}").read_text(encoding="ascii")
        except OSError:
            continue
        if wanted in info:
            return True
    return False


def catch_up(
    config: Config,
    layout: ClientLayout,
    endpoint: Endpoint | None,
    since: float,
    settings: IndexSettings | None = None,
) -> int:
    """Index the session files changed since `since` (a time.time()), as the watcher would.

    Call it once a (re)started watcher is ready, with `since` a little before its spawn:
    it covers exchanges written while the watcher was doing its initial index, which
    memsearch's watcher misses. It runs memsearch's own indexing code with the watcher's
    settings, so chunk ids match and nothing is embedded twice. Returns the number of
    chunks it added. This runs in the calling process (it imports memsearch and
    pymilvus); memd itself runs it in a child instead (`memd.indexing.children.catch_up_child`).
    """
    from memd.indexing.children import changed_files
    from memd.indexing.children.catch_up_child import index_files

    plan = ClientPlan.of(config, layout, settings)
    files = changed_files(layout.sessions, since)
    if not files:
        return 0
    emb = watcher_embedding(plan.embedding, endpoint)
    added = index_files(
        files,
        sessions=layout.sessions,
        provider=emb.provider,
        model=emb.model,
        milvus_uri=plan.target.uri,
        collection=plan.target.collection,
        batch_size=plan.batch_size,
        base_url=emb.socket or emb.base_url,  # memsearch's memd provider takes the socket
        api_key=emb.api_key,
        token=plan.target.token,
        max_chunk_size=plan.settings.max_chunk_size,
        overlap_lines=plan.settings.overlap_lines,
    )
    log.info("index.catch_up", client=layout.client_id, files=len(files), chunks=added)
    return added


# -- fingerprint and rebuild -------------------------------------------------------------


def read_spec(layout: ClientLayout) -> IndexSpec | None:
    try:
        data = json.loads(spec_path(layout).read_text(encoding="utf-8"))
        return IndexSpec(**data)
    except (FileNotFoundError, ValueError, TypeError):
        return None


def write_spec(layout: ClientLayout, spec: IndexSpec) -> None:
    path = spec_path(layout)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(asdict(spec), indent=2, sort_keys=True) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    trust.fsync_dir(path.parent)  # a crash must not bring back the old spec (a rebuild)


def needs_rebuild(layout: ClientLayout, spec: IndexSpec) -> bool:
    """True when the index was built with other settings, or with unknown ones.

    No recorded spec and no index data is a fresh client: nothing to rebuild. No spec but
    data present (or a remote collection we cannot vouch for) is rebuilt.
    """
    recorded = read_spec(layout)
    if recorded is not None:
        if not recorded.sessions:  # recorded before memd kept the folder: ask memsearch
            recorded = replace(recorded, sessions=_last_watched(layout) or spec.sessions)
        return recorded != spec
    if spec.target != "local":
        return True
    data = milvus_data_dir(layout)
    return data.exists() and any(data.iterdir())


def _last_watched(layout: ClientLayout) -> str:
    """The folder the client's last watcher indexed, from memsearch's `.index-state.json`
    ("" when unknown). It lets an index whose spec predates `IndexSpec.sessions` be checked
    for a moved memory_dir without rebuilding every unmoved one once on upgrade."""
    try:
        state = json.loads((layout.memsearch_dir / ".index-state.json").read_text("utf-8"))
        paths = state.get("paths")
    except (OSError, ValueError, AttributeError):
        return ""
    if not isinstance(paths, list) or len(paths) != 1 or not isinstance(paths[0], str):
        return ""
    return str(Path(paths[0]).resolve())  # memsearch keeps the path it was given


class IndexBusyError(RuntimeError):
    """The local index is still open by its index server; stop it before a rebuild."""


def rebuild(layout: ClientLayout, target: IndexTarget | None = None, timeout: float = 10.0) -> None:
    """Drop the client's index so its watcher re-indexes sessions/ from the markdown files.

    Local mode wipes `.memsearch/` (the index server must be stopped: checked with the
    database's own lock). Scale-out drops the client's collection on the server. The
    recorded spec is removed; write the new one with `write_spec` afterwards (or use
    `prepare_index`).
    """
    if target is None or target.local:
        _wipe_local(layout)
    else:
        _drop_remote(target, timeout)
    spec_path(layout).unlink(missing_ok=True)
    log.info(
        "index.rebuild",
        client=layout.client_id,
        target="local" if target is None or target.local else target.uri,
    )


def prepare_index(config: Config, layout: ClientLayout) -> bool:
    """`prepare` for a config and a layout."""
    return prepare(ClientPlan.of(config, layout))


def prepare(plan: ClientPlan) -> bool:
    """Before starting a client's index server and watcher: rebuild if the spec changed.

    Returns True when it rebuilt. Call with the client's index server stopped.
    """
    rebuilt = False
    if needs_rebuild(plan.layout, plan.spec):
        rebuild(plan.layout, plan.target)
        rebuilt = True
    if not plan.target.local:
        _create_remote(plan, plan.spec)
    write_spec(plan.layout, plan.spec)
    return rebuilt


def _create_remote(plan: ClientPlan, spec: IndexSpec, timeout: float = 30.0) -> None:
    """Create the client's collection on the Milvus server with memd's analyzer before
    the watcher starts (memsearch would create it without one). A local index needs
    nothing here: its index server adds the analyzer to the collection memsearch creates."""
    from pymilvus import MilvusClient

    target = plan.target
    dimension = spec.dimension or _provider_dimension(plan)
    client = MilvusClient(uri=target.uri, token=target.token or "", timeout=timeout)
    try:
        analysis.create_collection(client, target.collection, dimension, timeout)
    finally:
        with contextlib.suppress(Exception):
            client.close()


def _provider_dimension(plan: ClientPlan) -> int:
    """The dimension memsearch's provider reports for the configured model."""
    from memsearch.embeddings import get_provider

    emb = watcher_embedding(plan.embedding, None)
    provider = get_provider(
        emb.provider, model=emb.model, base_url=emb.base_url or None, api_key=emb.api_key or None
    )
    return int(provider.dimension)


def _wipe_local(layout: ClientLayout) -> None:
    data = milvus_data_dir(layout)
    lock = data / "LOCK"
    if lock.exists():
        fd = os.open(lock, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise IndexBusyError(f"{data} is open by a running index server") from None
        finally:
            os.close(fd)  # closing releases our lock too
    if layout.memsearch_dir.exists():
        for child in layout.memsearch_dir.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()


def _drop_remote(target: IndexTarget, timeout: float) -> None:
    from pymilvus import MilvusClient

    client = MilvusClient(uri=target.uri, token=target.token or "", timeout=timeout)
    try:
        if client.has_collection(target.collection, timeout=timeout):
            client.drop_collection(target.collection, timeout=timeout)
    finally:
        with contextlib.suppress(Exception):
            client.close()
