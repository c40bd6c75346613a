"""Per-client indexing: generated settings, command lines, rebuilds, and the real pipeline.

End-to-end tests run the real thing: `python -m memd.indexing.children.index_server` on a
Unix socket, an
unmodified `memsearch watch` subprocess, memd's embedder child (memsearch's `memd`
provider on its socket), and pymilvus reads. The only stand-in is a "remote"
OpenAI-compatible embedding API (a real HTTP server on 127.0.0.1,
`tests.support.fake_openai`) for the model-change test.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from memd import indexing
from memd.config import Config, EmbeddingConfig, MilvusConfig
from memd.indexing import embedding, index_lock
from memd.indexing.children import index_ready
from memd.indexing.daemon import catch_up_run
from memd.indexing.daemon.plan import ClientPlan
from memd.indexing.daemon.settings import IndexSettings
from memd.indexing.query.search import IndexSearcher
from memd.indexing.targets import Endpoint
from memd.layout import ClientLayout, write_memsearch_toml
from tests.support.children import Child, wait_for
from tests.support.embedder import EmbedderChild, RecordingRelay
from tests.support.embedding import embed_one
from tests.support.fake_openai import FakeUpstream

ENDPOINT = Endpoint(embedding.MODEL_NAME, "/run/memd/embedder.sock")


@pytest.fixture(autouse=True)
def user_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in for the user's HOME, with personal memsearch settings that must not leak."""
    home = tmp_path / "userhome"
    (home / ".memsearch").mkdir(parents=True)
    (home / ".memsearch" / "config.toml").write_text(
        '[milvus]\ntoken = "users-own-token"\ncollection = "users_collection"\n'
        '[embedding]\nprovider = "google"\nbatch_size = 1\n'
        '[chunking]\nmax_chunk_size = 40\n[llm]\nmodel = "users-llm"\n',
        encoding="utf-8",
    )
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.delenv("HF_HOME", raising=False)
    monkeypatch.setenv("OPENAI_BASE_URL", "https://example.invalid/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-users-own")
    monkeypatch.setenv("MEMSEARCH_DIR", str(home / "elsewhere"))
    return home


def make_config(tmp_path: Path, **kw: Any) -> Config:
    return Config(memory_dir=tmp_path / "memory", **kw)


# -- names, generated settings, command lines ------------------------------------------------


def test_collection_names_are_milvus_safe_and_distinct() -> None:
    names = [indexing.collection_name(c) for c in ("alice", "a-b", "a_b", "a.b", "9lives")]
    assert names[0] == "memd_alice"
    assert len(set(names)) == len(names)
    assert all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,254}", n) for n in names)


def test_memsearch_toml_sets_every_trusted_key_and_nothing_else(tmp_path: Path) -> None:
    from memsearch.config import _PROJECT_CONFIG_ALLOWED_PATHS, _filter_project_config

    layout = ClientLayout(tmp_path / "memory", "alice")
    doc = indexing.memsearch_toml(
        make_config(tmp_path), layout, IndexSettings(debounce_ms=250, max_chunk_size=900)
    )
    assert _filter_project_config(doc) == doc  # memsearch would not drop any of it
    keys = {(section, key) for section, table in doc.items() for key in table}
    assert keys == _PROJECT_CONFIG_ALLOWED_PATHS
    assert doc["watch"]["debounce_ms"] == 250
    assert doc["chunking"]["max_chunk_size"] == 900
    assert doc["milvus"]["collection"] == "memd_alice"


def test_watcher_command_for_the_embedded_model(tmp_path: Path, user_home: Path) -> None:
    config = make_config(tmp_path)
    layout = ClientLayout(config.memory_dir, "alice")
    cmd = indexing.watcher_command(config, layout, ENDPOINT)
    argv = list(cmd.argv)
    assert argv[:5] == [
        sys.executable,
        "-m",
        "memd.indexing.children.memsearch_watch",
        "watch",
        str(layout.sessions),
    ]
    opts = dict(zip(argv[5::2], argv[6::2], strict=True))
    assert opts == {
        "--provider": "memd",
        "--model": embedding.MODEL_NAME,
        "--collection": "memd_alice",
        "--milvus-uri": f"unix:{indexing.index_socket_path(layout)}",
    }
    assert cmd.cwd == layout.root  # memsearch reads .memsearch.toml from the cwd
    env = cmd.env
    assert env["HOME"] == str(indexing.watcher_home(layout))
    assert env["MEMD_EMBEDDER_SOCKET"] == ENDPOINT.socket
    assert "OPENAI_BASE_URL" not in env and "OPENAI_API_KEY" not in env
    assert env["MEMSEARCH_DIR"] == str(layout.memsearch_dir)
    assert env["HF_HOME"] == str(user_home / ".cache" / "huggingface")  # caches stay shared
    assert "127.0.0.1" in env["NO_PROXY"]


def test_the_embedder_socket_makes_the_watcher_use_memds_provider(tmp_path: Path) -> None:
    """The daemon's endpoint is the embedder's socket: memsearch's `memd` provider, no
    URL, no key; the model name (in every chunk id) and the index spec stay the same."""
    config = make_config(tmp_path)
    layout = ClientLayout(config.memory_dir, "alice")
    sock = str(tmp_path / "embedder.sock")
    at_socket = Endpoint(embedding.MODEL_NAME, sock)
    for cmd in (
        indexing.watcher_command(config, layout, at_socket),
        ClientPlan.of(config, layout).catch_up(at_socket, 0.0, "r"),
    ):
        argv = list(cmd.argv)
        assert argv[argv.index("--provider") + 1] == "memd"
        assert argv[argv.index("--model") + 1] == embedding.MODEL_NAME
        assert "--base-url" not in argv
        assert cmd.env["MEMD_EMBEDDER_SOCKET"] == sock and "OPENAI_API_KEY" not in cmd.env
    assert indexing.index_spec(config, layout).provider == config.embedding.provider


def test_index_server_command_serves_the_client_database(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    layout = ClientLayout(config.memory_dir, "alice")
    cmd = indexing.index_server_command(config, layout)
    assert cmd is not None
    assert list(cmd.argv) == [
        sys.executable,
        "-m",
        "memd.indexing.children.index_server",
        "--data-dir",
        str(layout.memsearch_dir / "milvus"),
        "--socket",
        str(indexing.index_socket_path(layout)),
    ]


def test_other_providers_stay_configurable(tmp_path: Path) -> None:
    layout = ClientLayout(tmp_path / "memory", "alice")
    remote = make_config(
        tmp_path,
        embedding=EmbeddingConfig(
            provider="openai",
            model="text-embedding-3-large",
            base_url="https://llm.example/v1",
            api_key="sk-memd",
        ),
    )
    cmd = indexing.watcher_command(remote, layout)
    assert "--base-url" in cmd.argv and "https://llm.example/v1" in cmd.argv
    assert cmd.env["OPENAI_API_KEY"] == "sk-memd" and "sk-memd" not in cmd.argv

    ollama = make_config(
        tmp_path,
        embedding=EmbeddingConfig(
            provider="ollama", model="nomic-embed-text", base_url="http://127.0.0.1:11434"
        ),
    )
    cmd = indexing.watcher_command(ollama, layout)
    assert cmd.argv[cmd.argv.index("--provider") + 1] == "ollama"
    assert "--base-url" not in cmd.argv  # memsearch passes base_url to openai only
    assert cmd.env["OLLAMA_HOST"] == "http://127.0.0.1:11434"

    voyage = make_config(tmp_path, embedding=EmbeddingConfig(provider="voyage", api_key="pa-1"))
    cmd = indexing.watcher_command(voyage, layout)
    assert cmd.argv[cmd.argv.index("--model") + 1] == "voyage-3-lite"
    assert cmd.env["VOYAGE_API_KEY"] == "pa-1"

    default_openai = make_config(
        tmp_path, embedding=EmbeddingConfig(provider="openai", api_key="sk-configured")
    )
    cmd = indexing.watcher_command(default_openai, layout)
    assert cmd.argv[cmd.argv.index("--base-url") + 1] == "https://api.openai.com/v1"
    assert cmd.env["OPENAI_API_KEY"] == "sk-configured"  # never the user's own variable
    assert "OLLAMA_HOST" not in cmd.env and not any(
        k.startswith(("OPENAI_B", "GOOGLE_", "GEMINI_")) for k in cmd.env
    )

    with pytest.raises(ValueError):
        indexing.watcher_command(make_config(tmp_path), layout)  # embedded model, no endpoint


def test_scale_out_runs_no_index_server_and_passes_the_token_by_env(tmp_path: Path) -> None:
    config = make_config(
        tmp_path, milvus=MilvusConfig(uri="https://milvus.example:19530", token="root:secret")
    )
    layout = ClientLayout(config.memory_dir, "a-b")
    assert indexing.index_server_command(config, layout) is None
    target = indexing.index_target(config, layout)
    assert (target.uri, target.local) == ("https://milvus.example:19530", False)
    assert target.collection == indexing.collection_name("a-b")
    cmd = indexing.watcher_command(config, layout, ENDPOINT)
    assert "root:secret" not in " ".join(cmd.argv)
    assert cmd.argv[cmd.argv.index("--milvus-token") + 1] == "env:MEMD_MILVUS_TOKEN"
    assert cmd.env["MEMD_MILVUS_TOKEN"] == "root:secret"


def test_deep_memory_dirs_get_a_short_private_socket(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A short runtime dir, as XDG_RUNTIME_DIR is (/run/user/<uid>): pytest's tmp_path is
    # itself deep, and deeper still under xdist.
    run = Path(tempfile.mkdtemp(prefix="memd-rt-"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(run))
    deep = ClientLayout(tmp_path / ("d" * 60) / ("e" * 60), "alice")
    sock = indexing.index_socket_path(deep)
    assert len(os.fsencode(sock)) <= 107
    assert sock.parent == run / f"memd-{os.getuid()}"
    other = ClientLayout(tmp_path / ("d" * 60) / ("e" * 60), "bob")
    assert indexing.index_socket_path(other) != sock
    shutil.rmtree(run)
    assert indexing.index_socket_path(deep) == sock  # stable across runs


def test_the_users_memsearch_config_does_not_reach_the_watcher(tmp_path: Path) -> None:
    """memsearch's own config resolution, run with the watcher's env and cwd."""
    config = make_config(tmp_path)
    layout = ClientLayout(config.memory_dir, "alice")
    indexing.ensure_dirs(layout)
    write_memsearch_toml(layout, indexing.memsearch_toml(config, layout))
    cmd = indexing.watcher_command(config, layout, ENDPOINT)
    probe = subprocess.run(
        [sys.executable, "-m", "memsearch", "config", "list", "--json-output"],
        env=dict(cmd.env),
        cwd=cmd.cwd,
        capture_output=True,
        text=True,
        check=True,
    )
    resolved = json.loads(probe.stdout)
    assert resolved["milvus"]["token"] == ""
    assert resolved["milvus"]["collection"] == "memd_alice"  # from the generated file
    assert resolved["embedding"]["batch_size"] == 64
    assert resolved["chunking"]["max_chunk_size"] == 1500
    assert resolved["llm"]["model"] == ""


# -- fingerprint and rebuild -----------------------------------------------------------------


def test_needs_rebuild_follows_the_embedding_settings(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    layout = ClientLayout(config.memory_dir, "alice")
    layout.ensure()
    spec = indexing.index_spec(config, layout)
    assert (spec.provider, spec.model, spec.dimension) == ("minilm", embedding.MODEL_NAME, 384)
    assert not indexing.needs_rebuild(layout, spec)  # fresh client, nothing indexed
    indexing.write_spec(layout, spec)
    assert not indexing.needs_rebuild(layout, spec)
    changed = indexing.index_spec(
        make_config(
            tmp_path, embedding=EmbeddingConfig(provider="openai", model="text-embedding-3-small")
        ),
        layout,
    )
    assert indexing.needs_rebuild(layout, changed)
    scaled = indexing.index_spec(
        make_config(tmp_path, milvus=MilvusConfig(uri="http://h:1")), layout
    )
    assert indexing.needs_rebuild(layout, scaled)


def test_unknown_index_data_is_rebuilt(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    layout = ClientLayout(config.memory_dir, "alice")
    layout.ensure()
    (layout.memsearch_dir / "milvus").mkdir()
    (layout.memsearch_dir / "milvus" / "LOCK").touch()
    assert indexing.needs_rebuild(layout, indexing.index_spec(config, layout))


def test_rebuild_wipes_the_local_index_but_refuses_while_it_is_open(tmp_path: Path) -> None:
    from milvus_lite.db import MilvusLite

    config = make_config(tmp_path)
    layout = ClientLayout(config.memory_dir, "alice")
    layout.ensure()
    (layout.sessions / "keep.md").write_text("# kept\n\ntext\n", encoding="utf-8")
    indexing.write_spec(layout, indexing.index_spec(config, layout))
    db = MilvusLite(str(indexing.milvus_data_dir(layout)))
    (layout.memsearch_dir / ".index-state.json").write_text("{}", encoding="utf-8")
    with pytest.raises(indexing.IndexBusyError):
        indexing.rebuild(layout)
    db.close()
    indexing.rebuild(layout)
    assert list(layout.memsearch_dir.iterdir()) == []
    assert indexing.read_spec(layout) is None
    assert (layout.sessions / "keep.md").exists()  # the markdown is the source of truth


# -- end to end ------------------------------------------------------------------------------


@pytest.fixture
def recorder(embedder: EmbedderChild) -> Iterator[RecordingRelay]:
    """The embedder child behind a relay that records the batch sizes the watchers send."""
    relay = RecordingRelay(embedder.socket)
    yield relay
    relay.close()


@pytest.fixture
def endpoint(recorder: RecordingRelay) -> Endpoint:
    return recorder.endpoint()


@dataclass
class RunningClient:
    config: Config
    layout: ClientLayout
    watcher: Child
    server: Child | None

    @property
    def target(self) -> indexing.IndexTarget:
        return indexing.index_target(self.config, self.layout)

    def rows(self, fields: tuple[str, ...] = ("content", "source", "heading")) -> list[dict]:
        return index_rows(self.target, fields)

    def searcher(self) -> IndexSearcher:
        return IndexSearcher(self.target, self.config.embedding, root=self.layout.root)


def index_rows(target: indexing.IndexTarget, fields: tuple[str, ...]) -> list[dict[str, Any]]:
    from pymilvus import MilvusClient

    client = MilvusClient(uri=target.uri, token=target.token, dedicated=True)
    try:
        if not client.has_collection(target.collection):
            return []
        client.load_collection(target.collection)
        return client.query(
            target.collection, filter='chunk_hash != ""', output_fields=["chunk_hash", *fields]
        )
    finally:
        client.close()


def start_client(
    children: list[Child],
    config: Config,
    client_id: str,
    endpoint: Endpoint | None,
    settings: IndexSettings | None = None,
    prepare: bool = True,
    server: bool = True,
) -> RunningClient:
    """What the supervisor does for one client, with plain subprocesses."""
    settings = settings or IndexSettings()
    layout = ClientLayout(config.memory_dir, client_id)
    indexing.ensure_dirs(layout)
    if prepare:
        indexing.prepare_index(config, layout)
    write_memsearch_toml(layout, indexing.memsearch_toml(config, layout, settings))
    index_child = None
    server_cmd = indexing.index_server_command(config, layout) if server else None
    if server_cmd is not None:
        index_child = Child(
            server_cmd.argv, layout.logs_dir / "index.log", dict(server_cmd.env), server_cmd.cwd
        )
        children.append(index_child)
        sock = indexing.index_socket_path(layout)
        wait_for(lambda: index_ready(sock), what="index server")
    watcher = start_watcher(children, config, layout, endpoint)
    return RunningClient(config, layout, watcher, index_child)


def start_watcher(
    children: list[Child], config: Config, layout: ClientLayout, endpoint: Endpoint | None
) -> Child:
    cmd = indexing.watcher_command(config, layout, endpoint)
    watcher = Child(cmd.argv, layout.logs_dir / "watcher.log", dict(cmd.env), cmd.cwd)
    children.append(watcher)
    return watcher


def wait_watching(client: RunningClient) -> None:
    """Until the watcher's inotify watch exists: its "Watching" line comes too early."""
    wait_for(
        lambda: (
            indexing.watcher_ready(client.watcher.pid, client.layout.sessions)
            or client.watcher.proc.poll() is not None
        ),
        what="watcher start",
    )
    assert client.watcher.proc.poll() is None, client.watcher.output()


EXCHANGE = (
    "# Conversation 1 (2026-11-30 09:00:00 UTC)\n\n"
    "## 2026-11-30 09:00:01 UTC · exchange 1\n\n"
    "**User:** Which port does the staging database listen on?\n\n"
    "**Assistant:** The staging Postgres listens on port 6543 behind pgbouncer.\n"
)


@pytest.mark.slow
def test_watcher_indexes_a_new_file_and_forgets_a_deleted_one(
    tmp_path: Path, children: list[Child], endpoint: Endpoint, recorder: RecordingRelay
) -> None:
    config = make_config(tmp_path)
    client = start_client(children, config, "alice", endpoint)
    wait_watching(client)
    session = client.layout.sessions / "s1.md"
    session.write_text(EXCHANGE, encoding="utf-8")
    searcher = client.searcher()
    try:
        hits = wait_for(
            lambda: searcher.search("staging database port", top_k=3),
            what="the exchange to be searchable",
        )
        assert "6543" in hits[0].content
        assert hits[0].source == str(session.resolve())
        assert recorder.batches, "the watcher did not embed through memd's embedder"

        # The vector recall computes for a text is the one the watcher stored for it.
        from memsearch.chunker import clean_content_for_embedding

        (row,) = client.rows(("content", "embedding"))
        stored = row["embedding"]
        ours = embed_one(clean_content_for_embedding(row["content"]))
        assert len(stored) == embedding.DIMENSION
        assert max(abs(a - b) for a, b in zip(stored, ours, strict=True)) < 1e-6

        # The user's personal memsearch config did not reach the watcher.
        assert client.target.collection == "memd_alice"
        assert not (tmp_path / "userhome" / "elsewhere").exists()

        session.unlink()
        wait_for(lambda: not client.rows(), what="the deleted file's chunks to go")
        assert searcher.search("staging database port") == []
    finally:
        searcher.close()


@pytest.mark.slow
def test_generated_settings_take_effect(
    tmp_path: Path, children: list[Child], endpoint: Endpoint, recorder: RecordingRelay
) -> None:
    """Chunk size, batch size and debounce from the generated .memsearch.toml are what the
    watcher uses (memsearch's defaults are 1500 chars, the provider's batch, 1500 ms)."""
    config = make_config(tmp_path)
    settings = IndexSettings(debounce_ms=4000, max_chunk_size=300, batch_size=2)
    layout = ClientLayout(config.memory_dir, "alice")
    indexing.ensure_dirs(layout)
    long_answer = "\n\n".join(
        f"Paragraph {i}: " + "the deployment uses blue green. " * 6 for i in range(5)
    )
    (layout.sessions / "long.md").write_text(
        "## 2026-11-30 09:00:01 UTC · exchange 1\n\n**User:** explain the deployment\n\n"
        f"**Assistant:** {long_answer}\n",
        encoding="utf-8",
    )
    client = start_client(children, config, "alice", endpoint, settings)
    wait_watching(client)
    rows = client.rows()
    assert len(rows) > 3
    assert max(len(r["content"]) for r in rows) <= 300  # chunking.max_chunk_size
    assert max(recorder.batches) == 2  # embedding.batch_size (the trial embed is 1)

    # Debounce: three writes 2 s apart. memsearch's default (1500 ms) would index after
    # each of them; 4000 ms folds them into one event.
    notes = client.layout.sessions / "notes.md"
    for i in range(3):
        with notes.open("a", encoding="utf-8") as fh:
            fh.write(f"## 2026-11-30 10:00:0{i} UTC · exchange {i + 1}\n\n**User:** note {i}\n\n")
        time.sleep(2.0)
    wait_for(
        lambda: "from " + str(notes.resolve()) in client.watcher.output(),
        what="the notes to be indexed",
    )
    time.sleep(1.0)
    events = [
        ln
        for ln in client.watcher.output().splitlines()
        if ln.startswith("Indexed") and ln.endswith(str(notes.resolve()))
    ]
    assert len(events) == 1, events


def _bag_of_words(dim: int) -> Callable[[list[str], str], list[list[float]]]:
    """A small deterministic embedding for the stand-in remote API."""

    def embed(texts: list[str], model: str) -> list[list[float]]:
        out = []
        for text in texts:
            vec = [0.0] * dim
            for word in re.findall(r"\w+", text.lower()):
                vec[int(hashlib.sha256(word.encode()).hexdigest(), 16) % dim] += 1.0
            norm = math.sqrt(sum(x * x for x in vec)) or 1.0
            out.append([x / norm for x in vec])
        return out

    return embed


@pytest.mark.slow
def test_model_change_rebuilds_the_index_instead_of_crash_looping(
    tmp_path: Path, children: list[Child], endpoint: Endpoint
) -> None:
    remote = FakeUpstream(embedder=_bag_of_words(64)).start()
    try:
        old = make_config(tmp_path)
        client = start_client(children, old, "alice", endpoint)
        (client.layout.sessions / "s1.md").write_text(EXCHANGE, encoding="utf-8")
        wait_for(lambda: client.rows(("embedding",)), what="first indexing")
        assert len(client.rows(("embedding",))[0]["embedding"]) == embedding.DIMENSION

        new = make_config(
            tmp_path,
            embedding=EmbeddingConfig(
                provider="openai",
                model="remote-embed-64",
                base_url=remote.base_url,
                api_key="sk-remote",
            ),
        )
        layout = client.layout
        assert indexing.needs_rebuild(layout, indexing.index_spec(new, layout))

        # What happens without a rebuild: memsearch refuses to start, every time.
        client.watcher.stop()
        naive = start_watcher(children, new, layout, None)
        assert naive.wait(60) != 0
        assert "Embedding dimension mismatch" in naive.output()  # memsearch's own check

        # memd's way: stop the client's processes, rebuild, start again.
        assert client.server is not None
        client.server.stop()
        rebuilt = start_client(children, new, "alice", None)
        assert indexing.read_spec(layout) == indexing.index_spec(new, layout)
        rows = wait_for(lambda: rebuilt.rows(("embedding",)), what="re-indexing")
        assert {len(r["embedding"]) for r in rows} == {64}
        searcher = rebuilt.searcher()  # recall embeds with memsearch's openai provider
        try:
            assert "6543" in searcher.search("staging database port")[0].content
        finally:
            searcher.close()
        assert rebuilt.watcher.proc.poll() is None
    finally:
        remote.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_scale_out_gives_each_client_its_own_collection(
    tmp_path: Path, children: list[Child], endpoint: Endpoint
) -> None:
    """A Milvus Lite gRPC server on TCP stands in for a remote Milvus."""
    port = _free_port()
    milvus = Child(
        [
            sys.executable,
            "-m",
            "milvus_lite",
            "server",
            "--data-dir",
            str(tmp_path / "remote-milvus"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        tmp_path / "milvus.log",
    )
    children.append(milvus)

    def listening() -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    wait_for(listening, what="the stand-in Milvus server")
    config = make_config(tmp_path, milvus=MilvusConfig(uri=f"http://127.0.0.1:{port}"))
    alice = start_client(children, config, "alice", endpoint)
    bob = start_client(children, config, "bob", endpoint)
    assert alice.server is None and bob.server is None
    (alice.layout.sessions / "a.md").write_text(EXCHANGE, encoding="utf-8")
    (bob.layout.sessions / "b.md").write_text(
        "## 2026-11-30 09:00:01 UTC · exchange 1\n\n**User:** favourite fruit?\n\n"
        "**Assistant:** Bob likes mangoes.\n",
        encoding="utf-8",
    )
    searchers = [alice.searcher(), bob.searcher()]
    try:
        wait_for(lambda: searchers[0].search("staging database"), what="alice's index")
        wait_for(lambda: searchers[1].search("mangoes"), what="bob's index")
        assert {r["source"] for r in alice.rows()} == {
            str((alice.layout.sessions / "a.md").resolve())
        }
        assert all("mango" not in h.content for h in searchers[0].search("mangoes fruit"))
        assert all("6543" not in h.content for h in searchers[1].search("staging database"))
    finally:
        for s in searchers:
            s.close()
    from pymilvus import MilvusClient

    remote = MilvusClient(uri=f"http://127.0.0.1:{port}", dedicated=True)
    assert {"memd_alice", "memd_bob"} <= set(remote.list_collections())
    remote.close()


@pytest.mark.slow
def test_watcher_keeps_indexing_across_an_index_server_restart(
    tmp_path: Path, children: list[Child], endpoint: Endpoint
) -> None:
    """The supervisor may restart an index server alone; the running watcher must go on."""
    config = make_config(tmp_path)
    client = start_client(children, config, "alice", endpoint)
    wait_watching(client)
    session = client.layout.sessions / "s1.md"
    session.write_text(EXCHANGE, encoding="utf-8")
    wait_for(lambda: client.rows(), what="first indexing")
    assert client.server is not None
    client.server.stop()
    cmd = indexing.index_server_command(config, client.layout)
    assert cmd is not None
    restarted = Child(cmd.argv, tmp_path / "index-2.log", dict(cmd.env), cmd.cwd)
    children.append(restarted)
    wait_for(lambda: index_ready(indexing.index_socket_path(client.layout)), what="restart")
    with session.open("a", encoding="utf-8") as fh:
        fh.write(
            "## 2026-11-30 09:05:00 UTC · exchange 2\n\n**User:** and production?\n\n"
            "**Assistant:** Production uses port 5432.\n"
        )

    # Judge by the watcher's own report: reading the index here would load the collection
    # and hide the bug this test is about (a restarted Milvus Lite opens it "released").
    def reacted() -> bool:
        out = client.watcher.output()
        return out.count(" chunks from ") >= 2 or "Failed to process" in out

    wait_for(reacted, what="the watcher to react")
    assert "Failed to process" not in client.watcher.output(), client.watcher.output()
    assert len(client.rows()) == 2
    assert client.watcher.proc.poll() is None


@pytest.mark.slow
def test_watcher_ready_means_the_watch_is_in_place(
    tmp_path: Path, children: list[Child], endpoint: Endpoint
) -> None:
    config = make_config(tmp_path)
    layout = ClientLayout(config.memory_dir, "alice")
    indexing.ensure_dirs(layout)
    assert not indexing.watcher_ready(os.getpid(), layout.sessions)
    client = start_client(children, config, "alice", endpoint)
    wait_watching(client)
    # From this moment on a new file is seen without any further wait.
    (layout.sessions / "s1.md").write_text(EXCHANGE, encoding="utf-8")
    wait_for(lambda: client.rows(), what="indexing")
    client.watcher.stop()
    assert not indexing.watcher_ready(client.watcher.pid, layout.sessions)


@pytest.mark.slow
def test_catch_up_indexes_like_the_watcher(
    tmp_path: Path, children: list[Child], endpoint: Endpoint
) -> None:
    """What catch_up stores is exactly what the watcher would: the watcher then finds
    nothing to add (same chunk ids, same model name, same chunking)."""
    config = make_config(tmp_path)
    layout = ClientLayout(config.memory_dir, "alice")
    indexing.ensure_dirs(layout)
    cmd = indexing.index_server_command(config, layout)
    assert cmd is not None
    children.append(Child(cmd.argv, tmp_path / "index.log", dict(cmd.env), cmd.cwd))
    wait_for(lambda: index_ready(indexing.index_socket_path(layout)), what="index server")
    old = layout.sessions / "old.md"
    old.write_text(EXCHANGE.replace("6543", "1111"), encoding="utf-8")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    since = time.time() - 1
    (layout.sessions / "s1.md").write_text(EXCHANGE, encoding="utf-8")
    # As memd runs it: a one-shot child (plainly spawned here), its report read back.
    assert asyncio.run(catch_up_run.run_child(config, layout, endpoint, since)) == 1
    rows = index_rows(indexing.index_target(config, layout), ("source",))
    assert [Path(r["source"]).name for r in rows] == ["s1.md"]  # old.md is not "since"
    assert indexing.catch_up(config, layout, endpoint, since) == 0  # idempotent, in-process too
    assert asyncio.run(catch_up_run.run_child(config, layout, endpoint, time.time() + 60)) == 0

    client = start_client(children, config, "alice", endpoint, prepare=False, server=False)
    wait_watching(client)
    assert "Indexed 1 chunks." in client.watcher.output()  # old.md only; s1.md was there
    assert len(client.rows()) == 2


# -- one indexing run at a time (memd.indexing.index_lock) ----------------------------------
# A real `memsearch watch` waits for the client's lock, which memd's catch-up holds while it
# indexes the same files, and indexes the file once the lock is free. Without it the two
# interleaved on a growing session file and left an outdated chunk in the index.


def _waiters(path: Path) -> list[int]:
    """Pids blocked on `path`'s flock, from /proc/locks ("->" marks a waiting request)."""
    st = os.stat(path)
    ident = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    pids = []
    with open("/proc/locks", encoding="ascii") as fh:
        for line in fh:
            fields = line.split()
            waiting = len(fields) > 6 and fields[1:3] == ["->", "FLOCK"]
            if waiting and fields[6] == ident:
                pids.append(int(fields[5]))
    return pids


@pytest.mark.slow
def test_the_watcher_waits_for_the_clients_index_lock(
    tmp_path: Path, children: list[Child], endpoint: Endpoint
) -> None:
    config = make_config(tmp_path)
    client = start_client(children, config, "alice", endpoint)
    wait_watching(client)
    lock = index_lock.lock_path(client.layout)
    environ = Path(f"/proc/{client.watcher.pid}/environ").read_bytes().split(b"\0")
    assert f"{index_lock.ENV}={lock}".encode() in environ
    with index_lock.locked(lock):  # as a catch-up holds it
        (client.layout.sessions / "s1.md").write_text(EXCHANGE, encoding="utf-8")
        wait_for(lambda: client.watcher.pid in _waiters(lock), what="the watcher to wait")
        assert client.rows() == []  # it has not read the file yet
    wait_for(lambda: client.rows(), what="indexing once the lock is free")
    assert [Path(r["source"]).name for r in client.rows()] == ["s1.md"]
    assert indexing.watcher_ready(client.watcher.pid, client.layout.sessions)


@pytest.mark.slow
def test_the_catch_up_child_waits_for_the_clients_index_lock(
    tmp_path: Path, children: list[Child], endpoint: Endpoint
) -> None:
    config = make_config(tmp_path)
    layout = ClientLayout(config.memory_dir, "alice")
    indexing.ensure_dirs(layout)
    cmd = indexing.index_server_command(config, layout)
    assert cmd is not None
    children.append(Child(cmd.argv, tmp_path / "index.log", dict(cmd.env), cmd.cwd))
    wait_for(lambda: index_ready(indexing.index_socket_path(layout)), what="index server")
    since = time.time() - 1
    (layout.sessions / "s1.md").write_text(EXCHANGE, encoding="utf-8")
    lock = index_lock.lock_path(layout)
    added: list[int] = []
    with index_lock.locked(lock):  # as the watcher holds it while it indexes
        run = threading.Thread(
            target=lambda: added.append(
                asyncio.run(catch_up_run.run_child(config, layout, endpoint, since))
            )
        )
        run.start()
        wait_for(lambda: bool(_waiters(lock)), what="the catch-up child to wait")
        assert index_rows(indexing.index_target(config, layout), ("source",)) == []
    run.join(120)
    assert added == [1]
