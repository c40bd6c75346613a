"""memd's config: the immutable values and their defaults (`model`), the strict loader
(`parse`, with each table's rules in `tables`) and the file it is read from (`load`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from memd import lazy_face

if TYPE_CHECKING:
    from memd.config.load import (
        default_config_path,
        load_config,
        resolve_config_path,
        socket_for,
    )
    from memd.config.model import (
        CLIENT_ID_RE,
        DEFAULT_MEMORY_DIR,
        EMBEDDING_PROVIDERS,
        KEYED_EMBEDDING_PROVIDERS,
        LLM_PROVIDERS,
        MEMORY_MODES,
        MODES,
        TOOL_NAME_RE,
        ClientConfig,
        CompactionConfig,
        Config,
        ConfigError,
        EmbeddingConfig,
        LimitsConfig,
        MilvusConfig,
        PrivacyConfig,
        ProxyConfig,
        RecallConfig,
        SupervisionConfig,
        UiConfig,
        parse_listen,
    )
    from memd.config.parse import default_socket_path, parse_config
else:
    __getattr__ = lazy_face(__name__, __file__)
