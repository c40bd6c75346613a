"""The real zygote's preload list covers what a watcher imports when it starts (issue 29).

A watcher builds its embedding provider at start (memd's `memd` provider for the bundled
models). Whatever that imports lazily is imported anew in every fork: the OpenAI SDK's
HTTP transport once cost each watcher's start 0.3-0.5 s, most of a killed watcher's
replacement time. The zygote must also run no thread when it forks.
"""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import importlib, json, sys, threading
from memd.indexing.daemon.zygote import ZYGOTE_PRELOAD
for name in ZYGOTE_PRELOAD:
    importlib.import_module(name)
before = set(sys.modules)
from memd.indexing import embedding
from memd.indexing.engine import embedder_provider
embedder_provider.provider(embedding.MODEL_NAME, 64, "/nonexistent/embedder.sock")
print(json.dumps({"new": sorted(set(sys.modules) - before), "threads": threading.active_count()}))
"""


def test_building_memds_provider_imports_nothing_the_zygote_did_not_preload() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=120
    )
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["new"] == []
    assert found["threads"] == 1, "the zygote must run no threads (it forks)"
