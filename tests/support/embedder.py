"""The real embedder child for tests, as memd runs it: `python -m memd.indexing.children.embedder`
on a Unix socket in a short private folder, and the `Endpoint` that names it to a watcher
(memsearch's `memd` provider) the way `EmbeddingService.endpoint` does.

`RecordingRelay` sits between a watcher and the child and writes down how many texts each
request carried, for the tests that check the batch size a watcher sends; it forwards the
bytes unchanged.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from memd.indexing import embedding
from memd.indexing.children import EMBEDDER, index_ready
from memd.indexing.targets import Endpoint


class EmbedderChild:
    """`with EmbedderChild() as child:` a running embedder; `child.endpoint()` for watchers."""

    def __init__(self, model: str = embedding.MODEL_NAME) -> None:
        self.model = model
        self.folder = Path(tempfile.mkdtemp(prefix="memd-emb-", dir="/tmp"))  # 0700, short
        self.socket = self.folder / "embedder.sock"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 120.0) -> EmbedderChild:
        argv = [sys.executable, "-m", EMBEDDER, "--socket", str(self.socket), "--model", self.model]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + timeout
        while not index_ready(self.socket):
            if self.proc.poll() is not None:
                raise RuntimeError(self.proc.stderr.read().decode() if self.proc.stderr else "")
            if time.monotonic() > deadline:
                raise TimeoutError("the embedder child did not get ready")
            time.sleep(0.05)
        return self

    def endpoint(self, model: str | None = None) -> Endpoint:
        """What `EmbeddingService.endpoint` names to the watchers for `model`."""
        return Endpoint(model or self.model, str(self.socket))

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc is not None and self.proc.stderr is not None:
            self.proc.stderr.close()
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> EmbedderChild:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class RecordingRelay:
    """A socket in front of the embedder child that records each embed request's size,
    and can hold back the requests holding a word (`hold`): a test then looks at the
    index while a watcher is in the middle of embedding."""

    def __init__(self, target: Path) -> None:
        self.target = target
        self.folder = Path(tempfile.mkdtemp(prefix="memd-rel-", dir="/tmp"))
        self.socket = self.folder / "relay.sock"
        self.batches: list[int] = []
        self.urgent: list[bool] = []  # per embed request: whether it asked to go first
        self.held = threading.Event()  # a request holding the word is waiting
        self._word: str | None = None
        self._release = threading.Event()
        self._lock = threading.Lock()
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(self.socket))
        self._listener.listen(16)
        threading.Thread(target=self._accept, daemon=True, name="relay").start()

    def endpoint(self, model: str = embedding.MODEL_NAME) -> Endpoint:
        return Endpoint(model, str(self.socket))

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        """Line by line: a request to the child, its answer back."""
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with conn, upstream, contextlib.suppress(OSError):
            upstream.connect(str(self.target))
            requests, answers = conn.makefile("rb"), upstream.makefile("rb")
            for line in requests:
                request = json.loads(line)
                texts = request.get("texts")
                if isinstance(texts, list):
                    with self._lock:
                        self.batches.append(len(texts))
                        self.urgent.append(request.get("urgent") is True)
                    self._wait_if_held(texts)
                upstream.sendall(line)
                conn.sendall(answers.readline())

    def _wait_if_held(self, texts: list[str]) -> None:
        word = self._word
        if word is not None and any(word in str(t) for t in texts):
            self.held.set()
            self._release.wait(60)

    @contextlib.contextmanager
    def hold(self, word: str) -> Iterator[None]:
        """Requests with a text holding `word` wait until the block ends."""
        self.held.clear()
        self._release.clear()
        self._word = word
        try:
            yield
        finally:
            self._word = None
            self._release.set()

    def close(self) -> None:
        self._release.set()
        self._listener.close()
        shutil.rmtree(self.folder, ignore_errors=True)
