"""Secrets sent through `memd proxy` are scrubbed by the daemon (issue #26, item 5).

The proxy is a client of the socket API and scrubs nothing itself: what an app sends
(and what the upstream echoes back) is recorded through `memory.record_chat`, where the
daemon replaces it. Reuses tests/test_proxy.py's daemon, upstream stand-in and SDK setup
(its module fixture gives this module a daemon of its own).
"""

from __future__ import annotations

import pytest

from tests.secret_corpus import secrets
from tests.test_proxy import Env, env, user  # noqa: F401 - env is the module's fixture

pytestmark = pytest.mark.slow


def test_a_secret_sent_through_the_proxy_is_stored_as_a_marker(env: Env) -> None:  # noqa: F811
    key = next(v for k, v, _w in secrets(seed=9) if k == "anthropic-api-key")
    sdk = env.sdk("alice")
    before = env.status()["recorded"]
    turn1 = [user(f"deploy with {key} and <private>my pin 9911</private> thanks")]
    first = sdk.chat.completions.create(model="m", messages=turn1)
    echoed = first.choices[0].message.content
    assert key in echoed  # the upstream stand-in echoes it back
    turn2 = [*turn1, {"role": "assistant", "content": echoed}, user("next step?")]
    sdk.chat.completions.create(model="m", messages=turn2)
    env.wait_recorded(before + 2)
    text = env.transcripts("alice")
    assert key not in text and "9911" not in text
    # the user message, the echo, and the title in each exchange heading
    assert text.count("[redacted: anthropic-api-key]") >= 2 and "[private]" in text
    sessions = env.call("sessions.list", client_id="alice")["sessions"]
    assert [s["conversations"] for s in sessions] == [1]  # the resend was a continuation
