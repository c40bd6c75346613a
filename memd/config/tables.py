"""The rules of each config table beyond key names and types: ranges, providers, addresses.

`check` is called with the table already read into its dataclass (memd.config.parse) and
returns it, or raises the parser's ConfigError naming `file: table.key`.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from memd.config.model import (
    EMBEDDING_PROVIDERS,
    KEYED_EMBEDDING_PROVIDERS,
    LLM_PROVIDERS,
    CompactionConfig,
    EmbeddingConfig,
    LimitsConfig,
    PrivacyConfig,
    ProxyConfig,
    RecallConfig,
    SupervisionConfig,
    UiConfig,
    parse_listen,
)

if TYPE_CHECKING:
    from memd.config.parse import Parser


def check(parser: Parser, data: Mapping[str, Any], name: str, value: Any) -> Any:
    """The table `name` of `data`, as read into `value`, checked by its own rule (if any)."""
    rule = _RULES.get(name)
    if rule is not None:
        rule(parser, data, value)
    return value


def _embedding(parser: Parser, _data: Mapping[str, Any], emb: EmbeddingConfig) -> None:
    if emb.provider not in EMBEDDING_PROVIDERS:
        allowed = ", ".join(EMBEDDING_PROVIDERS)
        raise parser.fail("embedding.provider", f"must be one of {allowed}")
    if (
        emb.provider in KEYED_EMBEDDING_PROVIDERS
        and not emb.api_key
        and not (emb.provider == "openai" and emb.base_url)
    ):
        # An SDK would take its key from the environment and send every chunk there.
        raise parser.fail(
            "embedding.api_key",
            f"must be set for provider {emb.provider} "
            '(memd never reads SDK variables; write api_key = "env:VAR")',
        )


def _recall(parser: Parser, _data: Mapping[str, Any], rec: RecallConfig) -> None:
    for key in ("bm25_weight", "inference_bm25_weight", "min_score", "drop_below"):
        if not 0.0 <= getattr(rec, key) <= 1.0:
            raise parser.fail(f"recall.{key}", "must be between 0 and 1")
    if rec.drop_below > rec.min_score:
        raise parser.fail("recall.drop_below", "must not be above recall.min_score")
    if rec.context_chars < 0:
        raise parser.fail("recall.context_chars", "must be 0 (off) or a positive number")


def _compaction(parser: Parser, data: Mapping[str, Any], comp: CompactionConfig) -> None:
    if comp.llm_provider not in LLM_PROVIDERS:
        allowed = ", ".join(LLM_PROVIDERS)
        raise parser.fail("compaction.llm_provider", f"must be one of {allowed}")
    for key in ("max_input_tokens_per_day", "max_input_tokens_per_day_per_client"):
        if getattr(comp, key) < 0:
            raise parser.fail(f"compaction.{key}", "must be 0 (no cap) or a positive integer")
    if comp.enabled:
        # Transcripts leave the machine only for an LLM the user named: no default
        # provider or model may pick one for them.
        table = data.get("compaction", {})
        for key in ("llm_provider", "llm_model"):
            if not table.get(key):
                raise parser.fail(
                    f"compaction.{key}",
                    "must be set when compaction is enabled (transcripts are sent there)",
                )


def _proxy(parser: Parser, _data: Mapping[str, Any], proxy: ProxyConfig) -> None:
    try:
        host, _port = parse_listen(proxy.listen)
    except ValueError as exc:
        raise parser.fail("proxy.listen", str(exc)) from None
    if not proxy.allow_non_loopback and not _loopback(host):
        raise parser.fail(
            "proxy.listen",
            f"{host} is not a loopback address; the proxy would be reachable from "
            "other machines (set allow_non_loopback = true if that is what you want)",
        )
    for key, example in (
        ("upstream_base_url", "https://api.openai.com/v1"),
        ("anthropic_base_url", "https://api.anthropic.com"),
    ):
        url = getattr(proxy, key)
        if url and not re.match(r"^https?://[^/\s]+", url):
            raise parser.fail(f"proxy.{key}", f"must be an http:// or https:// URL, e.g. {example}")
    for key in ("connect_timeout_seconds", "read_timeout_seconds"):
        value = getattr(proxy, key)
        if not value > 0 or value == float("inf"):
            raise parser.fail(f"proxy.{key}", "must be a positive, finite number")
    if not 1 <= proxy.max_tool_rounds <= 20:
        raise parser.fail("proxy.max_tool_rounds", "must be between 1 and 20")


def _ui(parser: Parser, _data: Mapping[str, Any], ui: UiConfig) -> None:
    try:
        host, _port = parse_listen(ui.listen)
    except ValueError as exc:
        raise parser.fail("ui.listen", str(exc)) from None
    if not ui.allow_non_loopback and not _loopback(host):
        raise parser.fail(
            "ui.listen",
            f"{host} is not a loopback address; your memory would be served to other "
            "machines (set allow_non_loopback = true if that is what you want)",
        )
    if ui.max_connections < 1:
        raise parser.fail("ui.max_connections", "must be at least 1")
    if not 0 < ui.header_timeout_seconds < float("inf"):
        raise parser.fail("ui.header_timeout_seconds", "must be a positive, finite number")


def _limits(parser: Parser, _data: Mapping[str, Any], limits: LimitsConfig) -> None:
    if limits.max_connections < 1:
        raise parser.fail("limits.max_connections", "must be at least 1")
    if not 0 < limits.max_buffered_mib < float("inf"):
        raise parser.fail("limits.max_buffered_mib", "must be a positive, finite number")
    if limits.recall_queue < 0:
        raise parser.fail("limits.recall_queue", "must be 0 or more")
    if limits.index_exchange_kib < 0:
        raise parser.fail("limits.index_exchange_kib", "must be 0 (no bound) or more")


_KIND_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,47}\Z")


def _privacy(parser: Parser, _data: Mapping[str, Any], priv: PrivacyConfig) -> None:
    from memd.redaction import KINDS  # the built-in kinds users may allow

    own: set[str] = set()
    for i, item in enumerate(priv.patterns):
        key = f"privacy.patterns[{i}]"
        if not isinstance(item, dict) or set(item) != {"kind", "regex"}:
            raise parser.fail(key, 'must be a table { kind = "name", regex = "..." }')
        kind, regex = item["kind"], item["regex"]
        if not isinstance(kind, str) or not _KIND_RE.match(kind) or kind in KINDS:
            raise parser.fail(f"{key}.kind", "must be a new lowercase name of a-z 0-9 -")
        try:
            compiled = re.compile(regex) if isinstance(regex, str) else None
        except re.error as exc:
            raise parser.fail(f"{key}.regex", f"is not a valid regex: {exc}") from None
        if compiled is None or compiled.match(""):
            raise parser.fail(f"{key}.regex", "must be a regex that matches some text, not none")
        own.add(kind)
    for i, kind in enumerate(priv.allow):
        if kind not in KINDS and kind not in own:
            known = ", ".join(KINDS)
            raise parser.fail(f"privacy.allow[{i}]", f"{kind!r} is not a kind ({known})")


def _supervision(parser: Parser, _data: Mapping[str, Any], sup: SupervisionConfig) -> None:
    minutes = sup.watcher_idle_minutes
    if not 0 <= minutes < float("inf"):  # also NaN
        raise parser.fail("supervision.watcher_idle_minutes", "must be 0 (never) or more")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


_RULES: dict[str, Callable[[Parser, Mapping[str, Any], Any], None]] = {
    "embedding": _embedding,
    "recall": _recall,
    "compaction": _compaction,
    "proxy": _proxy,
    "ui": _ui,
    "limits": _limits,
    "privacy": _privacy,
    "supervision": _supervision,
}
