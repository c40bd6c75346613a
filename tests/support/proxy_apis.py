"""The daemon + fake upstream pair the Messages and Responses tests share.

One `memd run` with the proxy on, its upstreams a FakeApis on 127.0.0.1 (OpenAI routes
at `.../v1`, Anthropic's at the root), and the clients of tests/test_proxy.py.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anthropic

from memd.cli.client import RemoteError
from tests.support.daemon import DaemonProcess, base_config, write_config
from tests.support.fake_apis import FakeApis
from tests.test_proxy import CLIENTS, Env

UPSTREAM_KEY = "upstream-secret-key"
ANTHROPIC_KEY = "anthropic-secret-key"


class ApisEnv(Env):
    upstream: FakeApis

    @property
    def root(self) -> str:
        return self.url.removesuffix("/v1")

    def claude(self, client_id: str, **kw: Any) -> anthropic.Anthropic:
        return anthropic.Anthropic(
            base_url=self.root, api_key=self.keys[client_id], max_retries=0, **kw
        )

    def async_claude(self, client_id: str, **kw: Any) -> anthropic.AsyncAnthropic:
        return anthropic.AsyncAnthropic(
            base_url=self.root, api_key=self.keys[client_id], max_retries=0, **kw
        )

    def recalled(self, client_id: str, query: str) -> str:
        """What recall finds, as JSON; empty while the client's index is (re)starting."""
        try:
            return json.dumps(self.call("memory.recall", client_id=client_id, query=query))
        except RemoteError:
            return ""

    def raw(
        self, path: str, body: bytes, headers: dict[str, str]
    ) -> tuple[int, dict[str, str], bytes]:
        """A plain HTTP POST: what an SDK cannot send (no key, a malformed header)."""
        request = urllib.request.Request(
            f"{self.root}{path}",
            method="POST",
            data=body,
            headers={"Content-Type": "application/json", **headers},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return answer.status, dict(answer.headers), answer.read()
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers), exc.read()

    def raw_json(self, path: str, body: Any, headers: dict[str, str]) -> tuple[int, Any]:
        status, _headers, data = self.raw(path, json.dumps(body).encode(), headers)
        return status, json.loads(data)


@contextmanager
def apis_env(tmp: Path) -> Iterator[ApisEnv]:
    with FakeApis() as upstream:
        config = base_config(
            tmp,
            clients=CLIENTS,
            proxy={
                "listen": "127.0.0.1:0",
                "upstream_base_url": upstream.base_url,
                "upstream_api_key": "env:FAKE_UPSTREAM_KEY",
                "anthropic_base_url": upstream.anthropic_url,
                "anthropic_api_key": "env:FAKE_ANTHROPIC_KEY",
                "read_timeout_seconds": 3,
            },
        )
        proc = DaemonProcess(
            write_config(tmp / "config.toml", config),
            env={"FAKE_UPSTREAM_KEY": UPSTREAM_KEY, "FAKE_ANTHROPIC_KEY": ANTHROPIC_KEY},
        )
        try:
            proc.start()
            yield ApisEnv(proc, upstream)
        finally:
            proc.stop()
