"""The config validation table: every bad value is refused naming the file and the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from memd.config import (
    ClientConfig,
    ConfigError,
    default_config_path,
    load_config,
    parse_config,
    resolve_config_path,
    socket_for,
)


def test_missing_file_gives_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    cfg = load_config(tmp_path / "nope.toml")
    assert cfg.source is None
    assert cfg.memory_dir == tmp_path / ".localrouter" / "memory"
    assert cfg.socket == cfg.memory_dir / "memd.sock"
    assert cfg.recall_tool_name == "MemoryRecall"
    assert cfg.search_top_k == 5
    assert (cfg.session_inactivity_minutes, cfg.max_session_minutes) == (180.0, 480.0)
    assert cfg.monitor_interval_seconds == 60.0
    assert cfg.embedding.provider == "minilm"
    assert cfg.compaction.enabled is False
    assert cfg.milvus.uri == ""
    assert dict(cfg.clients) == {}


def test_socket_prefers_xdg_runtime_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    assert parse_config({}).socket == tmp_path / "run" / "memd" / "memd.sock"


def test_config_path_resolution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.delenv("MEMD_CONFIG", raising=False)
    assert default_config_path() == tmp_path / ".config" / "memd" / "config.toml"
    monkeypatch.setenv("MEMD_CONFIG", str(tmp_path / "env.toml"))
    assert resolve_config_path(None) == tmp_path / "env.toml"
    assert resolve_config_path(str(tmp_path / "flag.toml")) == tmp_path / "flag.toml"


def test_full_config_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_KEY", "sk-secret")
    path = tmp_path / "c.toml"
    path.write_text(
        """
memory_dir = "mem"
socket = "/tmp/x.sock"
recall_tool_name = "Recall_2"
search_top_k = 7
session_inactivity_minutes = 0.05
max_session_minutes = 1
monitor_interval_seconds = 0.5
[embedding]
provider = "openai"
model = "text-embedding-3-small"
base_url = "http://127.0.0.1:9/v1"
api_key = "env:MY_KEY"
[compaction]
enabled = true
llm_provider = "anthropic"
llm_model = "claude"
[milvus]
uri = "http://127.0.0.1:19530"
token = "t"
[clients.gw]
memory_enabled = true
mode = "mcp_via_llm"
[clients."agent-2.x"]
memory_enabled = false
[clients.plain]
mode = "llm_only"
""",
        encoding="utf-8",
    )
    cfg = load_config(path)
    assert cfg.memory_dir == tmp_path / "mem"  # relative to the config file
    assert cfg.socket == Path("/tmp/x.sock")
    assert cfg.session_inactivity_minutes == 0.05
    assert cfg.max_session_minutes == 1.0 and isinstance(cfg.max_session_minutes, float)
    assert cfg.embedding.api_key == "sk-secret"
    assert cfg.compaction.llm_provider == "anthropic"
    assert cfg.clients["gw"] == ClientConfig(memory_enabled=True, mode="mcp_via_llm")
    assert cfg.clients["agent-2.x"].memory_on is False
    assert cfg.clients["plain"].memory_enabled is None
    assert list(cfg.enabled_clients()) == ["gw"]


def test_enabled_client_in_unsupported_mode_is_loaded_but_off() -> None:
    cfg = parse_config({"clients": {"a": {"memory_enabled": True, "mode": "mcp_only"}}})
    assert cfg.clients["a"].memory_on is False
    assert cfg.enabled_clients() == {}


BAD = [
    ({"memroy_dir": "x"}, "memroy_dir", "unknown key"),
    ({"search_top_k": "5"}, "search_top_k", "must be an integer"),
    ({"search_top_k": True}, "search_top_k", "must be an integer"),
    ({"search_top_k": 0}, "search_top_k", "between 1 and 100"),
    ({"search_top_k": 5.5}, "search_top_k", "must be an integer"),
    ({"session_inactivity_minutes": 0}, "session_inactivity_minutes", "positive"),
    ({"max_session_minutes": -1}, "max_session_minutes", "positive"),
    ({"monitor_interval_seconds": "60"}, "monitor_interval_seconds", "must be a number"),
    ({"monitor_interval_seconds": float("inf")}, "monitor_interval_seconds", "finite"),
    ({"monitor_interval_seconds": float("nan")}, "monitor_interval_seconds", "positive"),
    ({"recall_tool_name": "bad name"}, "recall_tool_name", "letter"),
    ({"memory_dir": 3}, "memory_dir", "must be a string"),
    ({"embedding": "x"}, "embedding", "must be a table"),
    ({"embedding": {"provder": "x"}}, "embedding.provder", "unknown key"),
    ({"embedding": {"provider": "nope"}}, "embedding.provider", "must be one of"),
    ({"embedding": {"api_key": "env:MEMD_TEST_UNSET_VAR"}}, "embedding.api_key", "not set"),
    ({"embedding": {"api_key": "env:"}}, "embedding.api_key", "variable name"),
    ({"compaction": {"enabled": "yes"}}, "compaction.enabled", "must be a boolean"),
    ({"compaction": {"llm_provider": "cohere"}}, "compaction.llm_provider", "must be one of"),
    ({"milvus": {"uri": 1}}, "milvus.uri", "must be a string"),
    ({"clients": {"../etc": {}}}, "clients.../etc", "client id"),
    ({"clients": {"a/b": {}}}, "clients.a/b", "client id"),
    ({"clients": {".hidden": {}}}, "clients..hidden", "client id"),
    ({"clients": {"x" * 65: {}}}, "clients." + "x" * 65, "client id"),
    ({"clients": {"a": 1}}, "clients.a", "must be a table"),
    ({"clients": {"a": {"mode": "everything"}}}, "clients.a.mode", "must be one of"),
    ({"clients": {"a": {"memory_enabled": "true"}}}, "clients.a.memory_enabled", "boolean"),
    ({"clients": {"a": {"memory": True}}}, "clients.a.memory", "unknown key"),
    ({"clients": []}, "clients", "must be a table"),
]


@pytest.mark.parametrize(("data", "key", "problem"), BAD, ids=[b[1] + ":" + b[2] for b in BAD])
def test_bad_values_name_file_and_key(data: dict, key: str, problem: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(data, source=Path("/etc/memd.toml"))
    message = str(err.value)
    assert message.startswith(f"/etc/memd.toml: {key}: "), message
    assert problem in message


def test_invalid_toml_names_file(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("memory_dir = \n", encoding="utf-8")
    with pytest.raises(ConfigError, match=str(path) + ": invalid TOML"):
        load_config(path)
    path.write_bytes(b"memory_dir = '\xff'\n")
    with pytest.raises(ConfigError, match="not valid UTF-8"):
        load_config(path)


def test_socket_for_survives_an_invalid_edit(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('socket = "/tmp/s.sock"\nsearch_top_k = "oops"\n', encoding="utf-8")
    socket, error = socket_for(path)
    assert socket == Path("/tmp/s.sock")
    assert error is not None and "search_top_k" in str(error)
