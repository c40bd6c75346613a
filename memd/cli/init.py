"""`memd init`: write a first config, commented, with one client whose memory is on.

Every key is listed with its default and commented out, so the file documents itself and
stays valid as memd's defaults move; only the one client is live. The file is created
exclusively (0600, in a 0700 folder): an existing config is never overwritten.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import shutil
from pathlib import Path
from typing import Any

from memd.cli.common import EXIT_OK, UsageError, config_source
from memd.cli.service_files import memd_command
from memd.config import (
    CLIENT_ID_RE,
    DEFAULT_MEMORY_DIR,
    EMBEDDING_PROVIDERS,
    MEMORY_MODES,
    ClientConfig,
    Config,
    load_config,
)

# The commented values are memd.config's defaults, filled in when the file is written.
TEMPLATE = """\
# memd config, written by `memd init`. Every key is optional; the commented values are
# the defaults. memd notices edits while it runs (memory_dir and socket need a restart).

# memory_dir = "{memory_dir}"   # transcripts and indexes, one folder per client
# socket = ""                # default: $XDG_RUNTIME_DIR/memd/memd.sock, else <memory_dir>/memd.sock
# recall_tool_name = "{top.recall_tool_name}"
# search_top_k = {top.search_top_k}
# session_inactivity_minutes = {top.session_inactivity_minutes:g}
# max_session_minutes = {top.max_session_minutes:g}
# monitor_interval_seconds = {top.monitor_interval_seconds:g}

# [embedding]                 # bundled offline: "minilm" (all-MiniLM-L6-v2: finds facts
#                             # asked in other words), or "wordllama" (static vectors: less
#                             # indexing CPU, ~25 MB less memory); or a memsearch provider
# provider = "{top.embedding.provider}"      # {others}
# model = ""
# base_url = ""
# api_key = ""                # "env:VAR" reads the variable

# [compaction]                # summarise ended sessions with an LLM
# enabled = {enabled}
# llm_provider = "{llm}"     # openai (any OpenAI-compatible base_url), anthropic, gemini
# llm_model = ""
# base_url = ""
# api_key = ""
# max_input_tokens_per_day = {c.max_input_tokens_per_day}    # over all clients; 0: no cap
# max_input_tokens_per_day_per_client = {c.max_input_tokens_per_day_per_client}

# [milvus]
# uri = ""                    # empty: a Milvus Lite index per client; else a Milvus server
# token = ""

# [proxy]                     # `memd run` serves the proxy once upstream_base_url is set
# listen = {p[listen]}
# upstream_base_url = {p[upstream_base_url]}
# upstream_api_key = {p[upstream_api_key]}      # "env:VAR" reads the variable
# connect_timeout_seconds = {p[connect_timeout_seconds]}
# read_timeout_seconds = {p[read_timeout_seconds]}
# max_tool_rounds = {p[max_tool_rounds]}
# allow_non_loopback = {p[allow_non_loopback]}
# anthropic_base_url = {p[anthropic_base_url]}   # the Messages API upstream (Claude Code)
# anthropic_api_key = {p[anthropic_api_key]}      # "env:VAR" reads the variable

# [ui]                        # the memory browser on loopback (`memd ui` prints a login link)
# enabled = {u[enabled]}
# listen = {u[listen]}
# allow_non_loopback = {u[allow_non_loopback]}
# max_connections = {u[max_connections]}
# header_timeout_seconds = {u[header_timeout_seconds]}

# [privacy]                   # secrets become [redacted: kind] before anything is written
# redact_secrets = {v[redact_secrets]}
# allow = []                  # built-in kinds not to redact, e.g. ["jwt"]
# patterns = []               # your own: [{{ kind = "employee-id", regex = "EMP-[0-9]{{6}}" }}]

# [recall]                    # ranking and filtering (docs/quality.md)
# bm25_weight = {r[bm25_weight]}
# inference_bm25_weight = {r[inference_bm25_weight]}
# min_score = {r[min_score]}
# drop_below = {r[drop_below]}
# follow_questions = {r[follow_questions]}
# neighbours = {r[neighbours]}
# context_chars = {r[context_chars]}

# [limits]                    # bounds that keep one caller from stalling the others
# max_connections = {l[max_connections]}
# max_buffered_mib = {l[max_buffered_mib]}
# recall_queue = {l[recall_queue]}
# index_exchange_kib = {l[index_exchange_kib]}

# [supervision]               # read at start only
# zygote = {zygote}               # fork children from one preloaded process
# shared_index_server = {shared} # every client's index in one process (docs/supervision.md)
# watcher_idle_minutes = {idle}   # stop an idle client's watcher, start it on a change; 0: never

# Memory is opt-in per client: only clients listed here with memory_enabled = true are
# recorded. Modes with memory: {memory_modes}.
[clients.{client}]
memory_enabled = true
mode = "{mode}"
# inject_recall = {inject}        # the proxy adds the recall tool to this client's requests
"""


def _toml_values(table: object) -> dict[str, str]:
    """A config table's defaults, each written as TOML (for the template's comments)."""
    out = {}
    for item in dataclasses.fields(table):  # type: ignore[arg-type]
        value = getattr(table, item.name)
        if isinstance(value, bool):
            out[item.name] = str(value).lower()
        elif isinstance(value, str):
            out[item.name] = json.dumps(value)
        else:
            out[item.name] = repr(value)
    return out


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    init = sub.add_parser(
        "init",
        parents=[common],
        help="write a first config with one client",
        description="Write a commented config (default ~/.config/memd/config.toml, or "
        "--config PATH) with one client whose memory is on. An existing file "
        "is never overwritten.",
    )
    init.add_argument(
        "--client",
        default="default",
        metavar="ID",
        help="the client id your gateway or MCP client will use (default: %(default)s)",
    )
    init.add_argument(
        "--mode",
        default=ClientConfig().mode,
        choices=MEMORY_MODES,
        help="how the client talks to memd (default: %(default)s)",
    )
    init.set_defaults(func=cmd_init, needs_config=False)


def invocation() -> str:
    """How the user can type this memd: `memd` when that is on PATH, else its full path."""
    command = memd_command()
    if len(command) == 1 and shutil.which("memd") == command[0]:
        return "memd"
    return " ".join(shlex.quote(word) for word in command)


def render(client: str, mode: str) -> str:
    if not CLIENT_ID_RE.match(client) or client in (".", ".."):
        raise UsageError(
            f"--client {client!r}: a client id is 1-64 of A-Z a-z 0-9 _ . - "
            "and starts with a letter or digit"
        )
    top = Config()
    return TEMPLATE.format(
        client=client,
        mode=mode,
        top=top,
        memory_dir=DEFAULT_MEMORY_DIR,
        others=", ".join(p for p in EMBEDDING_PROVIDERS if p != top.embedding.provider),
        enabled=str(top.compaction.enabled).lower(),
        llm=top.compaction.llm_provider,
        zygote=str(top.supervision.zygote).lower(),
        shared=str(top.supervision.shared_index_server).lower(),
        idle=top.supervision.watcher_idle_minutes,
        memory_modes=", ".join(MEMORY_MODES),
        c=top.compaction,
        p=_toml_values(top.proxy),
        r=_toml_values(top.recall),
        l=_toml_values(top.limits),
        u=_toml_values(top.ui),
        v=_toml_values(top.privacy),
        inject=str(ClientConfig().inject_recall).lower(),
    )


def cmd_init(args: argparse.Namespace) -> int:
    path, origin = config_source(args.config)
    path = Path(os.path.abspath(path))
    text = render(args.client, args.mode)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise UsageError(
            f"{path} already exists; edit it, or pass --config NEW_PATH for another one"
        ) from None
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)
    load_config(path)  # the template must stay a valid config
    print(f"wrote {path} with client {args.client!r} (mode {args.mode}, memory on)")
    print()
    print("next:")
    memd = invocation()
    flag = f" --config {shlex.quote(str(path))}" if origin == "--config" else ""
    for command, why in (
        (f"{memd} run{flag}", "try it in the foreground"),
        (f"{memd} service install{flag}", "or run it as a user service"),
        (
            f"{memd} mcp --print-config --client {args.client}{flag}",
            "give an MCP client its recall tool",
        ),
        (f"{memd} status{flag}", "see it running"),
    ):
        print(f"  {command}\n      {why}")
    return EXIT_OK
