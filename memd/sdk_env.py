"""The provider SDKs' own environment variables: none of them decides anything in memd.

A variable set for some other program must never choose where a transcript or a chunk
goes, or with which key (issue #14). Two places act on that: the indexing children's
environment (`memd.indexing.daemon.settings.watcher_env` strips these, memd passes the
key it configured) and the compaction LLM clients (`memd.compaction.llm` hides them while
a client is built). They used to keep two lists, and the shorter one (compaction's:
OpenAI, Anthropic, Gemini, Google) lacked the embedding providers. One list, the union,
serves both: the embedding providers memsearch drives (Voyage, Jina, Mistral besides
OpenAI and Google) matter to the children, and hiding them for the instant an LLM client
is built costs compaction nothing (its SDKs read only their own), while a provider added
to either side is then covered on both. Ollama's one variable, OLLAMA_HOST, is an exact
name, not a prefix: the watcher's environment handles it with the others it replaces.
"""

from __future__ import annotations

SDK_ENV_PREFIXES = (
    "OPENAI_",
    "ANTHROPIC_",
    "GEMINI_",
    "GOOGLE_",
    "VOYAGE_",
    "JINA_",
    "MISTRAL_",
)


def is_sdk_variable(name: str) -> bool:
    """Whether an environment variable belongs to a provider SDK (see the module doc)."""
    return name.startswith(SDK_ENV_PREFIXES)
