"""A client's index plan and the index-server seam, without processes.

`ClientPlan` is derived once per client and config; `IndexServers` is chosen once from
`[supervision] shared_index_server` (a server per client, or one shared child that
hands its clients to a server each once it went FATAL). The supervisor is the real one
on the `FakeSpawner` of tests/test_supervisor.py: nothing is spawned here (no step).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from memd import indexing
from memd.config import Config, parse_config
from memd.indexing.daemon.plan import ClientPlan
from memd.indexing.daemon.servers import OwnServers, SharedServers, index_servers
from memd.indexing.daemon.shared_index import SHARED_NAME
from memd.indexing.targets import Endpoint
from memd.layout import ClientLayout
from memd.supervision import Supervisor
from tests.test_supervisor import FakeSpawner

ENDPOINT = Endpoint("wordllama", "/run/embedder.sock")


def make_config(tmp_path: Path, *, shared: bool = False, milvus_uri: str = "") -> Config:
    data: dict[str, object] = {
        "memory_dir": str(tmp_path / "mem"),
        "clients": {cid: {"memory_enabled": True, "mode": "both"} for cid in ("alice", "bob")},
        "supervision": {"shared_index_server": shared},
    }
    if milvus_uri:
        data["milvus"] = {"uri": milvus_uri}
    return parse_config(data)


def plan_of(config: Config, client_id: str) -> ClientPlan:
    return ClientPlan.of(config, ClientLayout(config.memory_dir, client_id))


def no_zygote() -> tuple[str, ...]:
    return ()


async def _no_fallback(client_ids: object) -> None:
    raise AssertionError(f"no fallback expected: {client_ids}")


def test_a_plan_holds_what_the_per_call_forms_compute(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    layout = ClientLayout(config.memory_dir, "alice")
    plan = ClientPlan.of(config, layout)
    assert plan.target == indexing.index_target(config, layout)
    assert plan.spec == indexing.index_spec(config, layout)
    assert dict(plan.memsearch_toml) == indexing.memsearch_toml(config, layout)
    server = indexing.index_server_command(config, layout)
    assert plan.index_server is not None and server is not None
    assert plan.index_server.argv == server.argv
    assert plan.watcher(ENDPOINT).argv == indexing.watcher_command(config, layout, ENDPOINT).argv
    assert plan.target.uri == f"unix:{plan.index_socket}"
    assert str(plan.data_dir) in plan.index_server.argv
    assert plan.memsearch_toml["milvus"]["collection"] == plan.target.collection


def test_a_remote_milvus_plan_has_no_index_server(tmp_path: Path) -> None:
    plan = plan_of(make_config(tmp_path, milvus_uri="http://127.0.0.1:19530"), "alice")
    assert plan.index_server is None
    assert not plan.target.local and plan.target.uri == "http://127.0.0.1:19530"
    assert plan.spec.target == "http://127.0.0.1:19530"


def test_the_config_chooses_the_index_servers_once(tmp_path: Path) -> None:
    supervisor = Supervisor(spawner=FakeSpawner())
    own = index_servers(make_config(tmp_path), supervisor, no_zygote, _no_fallback)
    shared = index_servers(make_config(tmp_path, shared=True), supervisor, no_zygote, _no_fallback)
    assert isinstance(own, OwnServers)
    assert isinstance(shared, SharedServers)


def test_own_servers_supervise_one_index_server_per_client(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    supervisor = Supervisor(spawner=FakeSpawner())
    servers = index_servers(config, supervisor, no_zygote, _no_fallback)

    async def run() -> None:
        alice, bob = plan_of(config, "alice"), plan_of(config, "bob")
        served = await servers.add(alice)
        assert (served.name, served.requires, served.gate) == (
            "alice/index",
            ("alice/index",),
            None,
        )
        assert alice.index_server is not None
        assert supervisor.child("alice/index").spec.argv == alice.index_server.argv
        assert (await servers.add(bob)).name == "bob/index"
        await servers.remove(alice, served)
        assert "alice/index" not in supervisor and "bob/index" in supervisor
        await servers.close()

    asyncio.run(run())


def test_shared_servers_serve_every_client_from_one_child_then_one_each(tmp_path: Path) -> None:
    config = make_config(tmp_path, shared=True)
    supervisor = Supervisor(spawner=FakeSpawner())
    servers = index_servers(config, supervisor, no_zygote, _no_fallback)
    assert isinstance(servers, SharedServers)

    async def run() -> None:
        alice, bob = plan_of(config, "alice"), plan_of(config, "bob")
        served_a, served_b = await servers.add(alice), await servers.add(bob)
        assert served_a.name == served_b.name == SHARED_NAME
        assert served_a.requires == (SHARED_NAME,)
        assert served_a.gate is not None and not served_a.gate()  # nothing answers yet
        manifest = json.loads(servers.shared.manifest.read_text(encoding="utf-8"))
        assert manifest["clients"]["alice"] == {
            "data_dir": str(alice.data_dir),
            "socket": str(alice.index_socket),
        }
        assert servers.shared.clients == ("alice", "bob")
        servers.shared.failed = True  # the shared child went FATAL: a server each from now
        await servers.remove(bob, served_b)
        fallback = await servers.add(bob)
        assert (fallback.name, fallback.gate) == ("bob/index", None)
        await servers.remove(bob, fallback)
        await servers.remove(alice, served_a)
        assert "bob/index" not in supervisor and SHARED_NAME not in supervisor
        await servers.close()

    asyncio.run(run())
