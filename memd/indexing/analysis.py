"""English text analysis for BM25: one analyzer for Milvus servers, Milvus Lite and memd.

The collection's `content` field carries Milvus's own `analyzer_params`: the `standard`
tokenizer, then `lowercase`, `stop` (an English list) and `stemmer` (english). A Milvus
server understands that natively. Milvus Lite 3.2.2 knows only the `standard`/`jieba`
tokenizers and the `stop` filter and silently ignores other filters, so the index server
teaches Lite's analyzer factory the same pipeline (`memd.indexing.engine.lite_analyzers`,
with this module's words and stems), with Snowball's English stemmer (`snowballstemmer`,
the algorithm Milvus's `stemmer` filter implements too). This module patches nothing:
recall imports it for `terms()`.

Measured on the LoCoMo dev split (bench/locomo.py, offline over the same chunks), BM25
recall@5 goes from 0.619 (plain lower-cased words) to 0.642 with stemming and 0.692 with
stemming and stop words.

memd itself uses `terms()` (the same pipeline) to see which query terms a result holds,
one of the two inputs of the relevance score (memd.indexing.query.ranking).

memsearch creates a client's collection without analyzer params when it is missing; memd
creates it first (`create_collection`, memsearch 0.4.23's schema plus the analyzer) so the
watcher finds it in place, and the index server adds the analyzer to any collection
created through it (`memd.indexing.engine.servicer.with_analyzer`). The analyzer's name
is part of the index fingerprint (`ANALYZER_NAME` in `IndexSpec`): an index built before
it is rebuilt from the markdown.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import re
import sys
import threading
from types import ModuleType
from typing import Any

import structlog

log = structlog.get_logger()

# Bump when the analyzer changes: the fingerprint then rebuilds every index.
ANALYZER_NAME = "standard+lowercase+stop(en)+snowball(en)/1"

# Lucene's English stop words plus pronouns and auxiliaries that questions are made of
# ("what did she ...?"); negations are kept ("not", "no"), they carry meaning.
_STOP_TEXT = """
a an and are as at be but by for if in into is it of on or such that the their then there
these they this to was will with i me my myself we our ours you your yours he him his she
her hers its it's they them what which who whom whose when where why how do does did doing
done have has had having am been being were would should could can may might shall must
from about after before up down out over under again further once here all any both each
few more most other some so than too very s t just now also onto that's
"""
STOP_WORDS: tuple[str, ...] = tuple(sorted(set(_STOP_TEXT.split())))

ANALYZER_PARAMS: dict[str, Any] = {
    "tokenizer": "standard",
    "filter": [
        "lowercase",
        {"type": "stop", "stop_words": list(STOP_WORDS)},
        {"type": "stemmer", "language": "english"},
    ],
}

WORD_RE = re.compile(r"\w+", re.UNICODE)  # Milvus Lite's `standard` tokenizer


_STEMMERS = threading.local()
_ALONE = "_memd_snowballstemmer"  # the package's folder, imported without its __init__
_ALONE_LOCK = threading.Lock()


def stemmer(language: str) -> Any:
    """This thread's Snowball stemmer for `language`: a stemmer keeps the word it works on
    in itself, so one shared by threads (the index server's gRPC workers, recall's lanes)
    mixes their words up and fails (IndexError in snowballstemmer)."""
    mine = getattr(_STEMMERS, "by_language", None)
    if mine is None:
        mine = _STEMMERS.by_language = {}
    if language not in mine:
        mine[language] = _new_stemmer(language)
    return mine[language]


def _new_stemmer(language: str) -> Any:
    """PyStemmer's stemmer (Snowball's C library, a dependency): 5 µs a word where
    snowballstemmer's Python takes 65, with the same stems (all 295,488 distinct words of
    the virtualenv's sources and LoCoMo's dev split compared; docs/performance.md,
    "Recall latency, round 9"). Where it cannot be imported, snowballstemmer's. Both
    raise KeyError for a language they do not know."""
    try:
        import Stemmer
    except ImportError:
        return stemmer_class(language)()
    return Stemmer.Stemmer(language)


@functools.cache
def stemmer_class(language: str) -> Any:
    """snowballstemmer's (pure Python) stemmer class for `language`, loaded alone when it
    can be: `import snowballstemmer` imports all of its 30-odd languages (2.1 MB of memd's
    PSS, issue 29) and memd stems English only. Its modules are imported from the
    package's folder under another package name, whose `__init__` is not run. A language
    it has no module for takes the package's own `stemmer()` (which raises KeyError for an
    unknown language)."""
    module = _alone(language)
    if module is None:
        import snowballstemmer

        return type(snowballstemmer.stemmer(language))
    return getattr(module, "".join(p.capitalize() for p in language.split("_")) + "Stemmer")


def _alone(language: str) -> ModuleType | None:
    """snowballstemmer's `<language>_stemmer` module, imported without the package."""
    if not re.fullmatch(r"[a-z_]+", language):
        return None
    package = importlib.util.find_spec("snowballstemmer")
    if package is None or not package.submodule_search_locations:
        return None
    with _ALONE_LOCK:
        if _ALONE not in sys.modules:
            alone = ModuleType(_ALONE, "snowballstemmer's modules, without its __init__")
            alone.__path__ = list(package.submodule_search_locations)
            sys.modules[_ALONE] = alone
    if importlib.util.find_spec(f"{_ALONE}.{language}_stemmer") is None:
        return None
    return importlib.import_module(f"{_ALONE}.{language}_stemmer")


def terms(text: str) -> list[str]:
    """The analyzer's tokens for `text`: lower-cased words, stop words out, stemmed."""
    return [stem(w) for w in words(text) if w not in _STOP_SET]


def words(text: str) -> list[str]:
    """`text`'s words as `WORD_RE` finds them, lower-cased. An ASCII text (nearly all of
    them) is cut by `str.translate` and `split`, 3x the regex's speed with the same
    words (every non-word ASCII character becomes a space): finding words was three
    quarters of analysing a candidate's text, which recall does for up to 120 a query
    (docs/performance.md, "Recall latency, round 9")."""
    if text.isascii():
        return text.translate(_ASCII_WORDS).split()
    return WORD_RE.findall(text.lower())


# ASCII: a word character (letter, digit, underscore) kept, lower-cased; any other a space
_ASCII_WORDS = {
    i: (chr(i).lower() if chr(i).isalnum() or chr(i) == "_" else " ") for i in range(128)
}


@functools.lru_cache(maxsize=16_384)
def stem(word: str, language: str = "english") -> str:
    """One word's stem, remembered: Snowball in Python cost 20-600 µs a word (under load;
    PyStemmer's C 5 µs), and recall analyses every result's text to see which query terms
    it holds (a recall's fusion took 78 ms at p50 on LoCoMo before, 9 ms with the words
    cached). 16,384 words, not 65,536: an entry costs 168 B (232 B with the language, as
    the index server's analyzer calls it), so a long-lived memd and index server each grew
    by up to 11 and 15 MB with what people wrote (issue 29); now ≤ 2.8 and 3.8 MB. The
    five LoCoMo dev conversations hold 6,440 distinct words, and a word that fell out costs
    PyStemmer's 5 µs."""
    return str(stemmer(language).stemWord(word))


_STOP_SET = frozenset(STOP_WORDS)


# -- the collection ---------------------------------------------------------------------


def create_collection(client: Any, name: str, dimension: int, timeout: float = 30.0) -> bool:
    """Create `name` with memsearch 0.4.23's schema (`_ensure_collection` of MilvusStore) and
    memd's analyzer on `content`; False when it exists already."""
    from pymilvus import DataType, Function, FunctionType

    if client.has_collection(name, timeout=timeout):
        return False
    schema = client.create_schema(enable_dynamic_field=True, description="")
    schema.add_field(
        field_name="chunk_hash", datatype=DataType.VARCHAR, max_length=64, is_primary=True
    )
    schema.add_field(field_name="embedding", datatype=DataType.FLOAT_VECTOR, dim=dimension)
    schema.add_field(
        field_name="content",
        datatype=DataType.VARCHAR,
        max_length=65535,
        enable_analyzer=True,
        analyzer_params=ANALYZER_PARAMS,
    )
    schema.add_field(field_name="sparse_vector", datatype=DataType.SPARSE_FLOAT_VECTOR)
    schema.add_field(field_name="source", datatype=DataType.VARCHAR, max_length=1024)
    schema.add_field(field_name="heading", datatype=DataType.VARCHAR, max_length=1024)
    schema.add_field(field_name="heading_level", datatype=DataType.INT64)
    schema.add_field(field_name="start_line", datatype=DataType.INT64)
    schema.add_field(field_name="end_line", datatype=DataType.INT64)
    schema.add_function(
        Function(
            name="bm25_fn",
            function_type=FunctionType.BM25,
            input_field_names=["content"],
            output_field_names=["sparse_vector"],
        )
    )
    index_params = client.prepare_index_params()
    index_params.add_index(field_name="embedding", index_type="FLAT", metric_type="COSINE")
    index_params.add_index(
        field_name="sparse_vector", index_type="SPARSE_INVERTED_INDEX", metric_type="BM25"
    )
    client.create_collection(
        collection_name=name, schema=schema, index_params=index_params, timeout=timeout
    )
    log.info("index.collection_created", collection=name, analyzer=ANALYZER_NAME)
    return True
