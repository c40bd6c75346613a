"""`memd proxy` (run the proxy on its own) and `memd proxy key CLIENT` (its bearer keys)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from memd.config import load_config, resolve_config_path

EXIT_OK, EXIT_USAGE, EXIT_UNAVAILABLE = 0, 2, 3


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    """Register `memd proxy` and `memd proxy key` on the memd command's subparsers."""
    proxy = sub.add_parser(
        "proxy",
        parents=[common],
        help="the OpenAI/Anthropic-compatible proxy: run it alone, or manage its keys",
        description="Run the proxy of [proxy] (OpenAI Chat Completions and Responses, "
        "Anthropic Messages) in the foreground, for a memd that runs elsewhere (`memd run` "
        "starts it by itself when [proxy] names an upstream). `memd proxy key CLIENT` "
        "shows a client's key.",
        usage="%(prog)s [-h] [--config PATH] [--log-level LEVEL] [key CLIENT [--rotate]]",
    )
    proxy.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    proxy.set_defaults(func=cmd_proxy)
    actions = proxy.add_subparsers(dest="proxy_action", metavar="ACTION")
    key = actions.add_parser(
        "key",
        parents=[common],
        help="print a client's proxy key (created on first use)",
        description="Print the key an app must send to the proxy for CLIENT (as its API "
        "key: `Authorization: Bearer` or `x-api-key`); it is "
        "created the first time. --rotate replaces it (the old key stops "
        "working at once).",
    )
    key.add_argument("client", help="a client id from the config's [clients] tables")
    key.add_argument("--rotate", action="store_true", help="issue a new key")
    key.set_defaults(func=cmd_key)


def services() -> list[Any]:
    """What `memd run` runs beside its socket: the proxy (idle unless [proxy] is set)."""
    from memd.proxy.hook import ProxyService

    return [ProxyService()]


def status_line(p: dict[str, Any]) -> str:
    """The `proxy` line of `memd status`."""
    if p["state"] != "running":
        return f"{p['state']}: {p.get('error', '')}"
    line = f"{p['url']} -> {p['upstream']}  ({p['requests']} requests, {p['recorded']} recorded"
    if p["record_failures"]:
        line += f", {p['record_failures']} record failures: {p['last_record_error']}"
    return line + ")"


def cmd_key(args: argparse.Namespace) -> int:
    from memd.proxy.keys import KeyStore, KeyStoreError

    config = load_config(args.config)
    if args.client not in config.clients:
        print(
            f"memd: unknown client {args.client!r}: add [clients.{args.client}] to "
            f"{resolve_config_path(args.config)} first",
            file=sys.stderr,
        )
        return EXIT_USAGE
    store = KeyStore(config.memory_dir)
    try:
        if args.rotate:
            key, note = store.rotate(args.client), "new key; the old one no longer works"
        else:
            key, created = store.ensure(args.client)
            note = "new key" if created else ""
    except KeyStoreError as exc:
        print(f"memd: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    print(key)
    if note:
        print(
            f"memd: {note} for {args.client} (stored in {store.path(args.client)})", file=sys.stderr
        )
    return EXIT_OK


def cmd_proxy(args: argparse.Namespace) -> int:
    from memd.logs import configure_logging
    from memd.proxy.service import serve_standalone

    path = resolve_config_path(args.config)
    config = load_config(path)
    if not config.proxy.enabled:
        print(
            f"memd: no upstream: set upstream_base_url (or anthropic_base_url) in the "
            f"[proxy] table of {path}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    configure_logging(args.log_level)
    try:
        return asyncio.run(serve_standalone(path, config))
    except OSError as exc:
        from memd.proxy.service import served_by_memd

        if url := asyncio.run(served_by_memd(config)):
            print(
                f"memd: `memd run` already serves the proxy at {url}; point your app there "
                f"(a second proxy needs another [proxy] listen address)",
                file=sys.stderr,
            )
            return EXIT_UNAVAILABLE
        print(
            f"memd: cannot listen on {config.proxy.listen}: {exc.strerror or exc}", file=sys.stderr
        )
        return EXIT_UNAVAILABLE
