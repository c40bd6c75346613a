"""Milvus Lite's analyzer factory taught the filters of memd's analyzer, as a server has them.

The collection's `content` field carries Milvus's own `analyzer_params`
(`memd.indexing.analysis.ANALYZER_PARAMS`: the `standard` tokenizer, then `lowercase`,
`stop` and `stemmer`). Milvus Lite 3.2.2 knows only the `standard`/`jieba` tokenizers and
the `stop` filter and silently ignores other filters, so the index server (the third of
its patches, `memd.indexing.engine.roles`, before the database opens) wraps Lite's
factory: a `standard` tokenizer with those filters runs them all, in order, with
Snowball's English stemmer (the algorithm Milvus's `stemmer` filter implements too), the
same words `analysis.terms` gives recall. Anything else goes to Lite's factory unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from memd.indexing.analysis import WORD_RE, stem, stemmer
from memd.indexing.engine.registry import Registry

GROUP = "lite.analyzers"


class _FilteredAnalyzer:
    """Lite's standard tokenizer followed by Milvus's filters, in the order given."""

    def __init__(self, steps: Sequence[Any]) -> None:
        self._steps = list(steps)

    def tokenize(self, text: str) -> list[str]:
        tokens = WORD_RE.findall(text)
        for step in self._steps:
            tokens = step(tokens)
        return tokens


def _filter_step(spec: Any) -> Any:
    """One Milvus filter as a function over a token list; ValueError for unknown ones."""
    kind = _filter_kind(spec)
    if kind == "lowercase":
        return lambda tokens: [t.lower() for t in tokens]
    if kind == "stop":
        words = frozenset(str(w) for w in spec.get("stop_words", []))
        return lambda tokens: [t for t in tokens if t not in words]
    if kind == "stemmer":
        language = str(spec.get("language", "english")).lower()
        stemmer(language)  # an unknown language fails here, when the analyzer is built
        return lambda tokens: [stem(t, language) for t in tokens]
    raise ValueError(f"unsupported analyzer filter {spec!r}")


def _needs_filters(params: Any) -> bool:
    if not isinstance(params, dict) or params.get("tokenizer", "standard") != "standard":
        return False
    filters = params.get("filter") or []
    return any(_filter_kind(f) not in ("stop",) for f in filters)


def _filter_kind(spec: Any) -> Any:
    return spec if isinstance(spec, str) else (spec.get("type") if isinstance(spec, dict) else None)


def install(registry: Registry) -> None:
    """Make Milvus Lite build `standard` analyzers with all their filters."""
    from milvus_lite.analyzer import factory
    from milvus_lite.analyzer.protocol import Analyzer
    from milvus_lite.exceptions import SchemaValidationError

    original = registry.original(factory, "create_analyzer")

    class FilteredAnalyzer(_FilteredAnalyzer, Analyzer):
        pass

    def create_analyzer(params: dict[str, Any] | None = None) -> Any:
        if not _needs_filters(params):
            return original(params)
        assert params is not None
        try:
            return FilteredAnalyzer([_filter_step(f) for f in params.get("filter") or []])
        except (ValueError, KeyError) as exc:
            raise SchemaValidationError(str(exc)) from None

    registry.replace(GROUP, factory, "create_analyzer", create_analyzer)
