"""The real zygote's preload list covers what a watcher imports when it starts (issue 29).

memsearch's openai provider builds the SDK's clients at a watcher's (and a catch-up
child's) start; what they import lazily then (the SDK's HTTP transport: ~105 modules,
0.3-0.5 s) was imported anew in every fork, most of a killed watcher's replacement time.
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
import openai
openai.AsyncOpenAI(api_key="unused", base_url="http://127.0.0.1:9/v1")
openai.OpenAI(api_key="unused", base_url="http://127.0.0.1:9/v1")
print(json.dumps({"new": sorted(set(sys.modules) - before), "threads": threading.active_count()}))
"""


def test_building_the_sdk_clients_imports_nothing_the_zygote_did_not_preload() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=120
    )
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["new"] == []
    assert found["threads"] == 1, "the zygote must run no threads (it forks)"
