"""One recording model: the same conversation carried by Chat Completions, the Anthropic
Messages API and the OpenAI Responses API is recorded as the same messages (memd's own
hash keys and rendered parts compared), and the proxy's response-id map is durable,
bounded, private and per client."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from memd.proxy import convert
from memd.proxy.chain import ResponseChain
from memd.sessions.messages import parse_messages, parse_response

CALL_ARGS = {"city": "Zürich", "days": 2}
CHAT: list[dict[str, Any]] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Zürich?"},
    {
        "role": "assistant",
        "content": "Let me check.",
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "arguments": json.dumps(CALL_ARGS, ensure_ascii=False),
                },
            }
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "sunny, 21C"},
    {"role": "user", "content": "Thanks!"},
]
ANTHROPIC = {
    "system": [{"type": "text", "text": "Be brief."}],
    "messages": [
        {"role": "user", "content": "Weather in Zürich?"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me check."},
                {"type": "tool_use", "id": "c1", "name": "get_weather", "input": CALL_ARGS},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "c1", "content": "sunny, 21C"},
                {"type": "text", "text": "Thanks!"},
            ],
        },
    ],
}
RESPONSES = {
    "instructions": "Be brief.",
    "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "Weather in Zürich?"}]},
        {
            "type": "message",
            "id": "msg_1",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Let me check.", "annotations": []}],
        },
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "c1",
            "name": "get_weather",
            "arguments": json.dumps(CALL_ARGS, ensure_ascii=False),
        },
        {"type": "function_call_output", "call_id": "c1", "output": "sunny, 21C"},
        {"role": "user", "content": "Thanks!"},
    ],
}


def keys(messages: list[dict[str, Any]]) -> list[bytes]:
    return [m.key for m in parse_messages(messages)]


def shown(messages: list[dict[str, Any]]) -> list[Any]:
    return [m.parts for m in parse_messages(messages)]


def test_three_apis_record_one_conversation_the_same_way() -> None:
    from_anthropic = convert.anthropic_messages(ANTHROPIC)
    from_responses = convert.responses_input(RESPONSES, with_instructions=True)
    assert keys(from_anthropic) == keys(CHAT) == keys(from_responses)
    assert shown(from_anthropic) == shown(CHAT) == shown(from_responses)


def test_a_reply_and_the_same_reply_resent_are_one_message() -> None:
    """What is recorded as turn 1's reply is what turn 2's history holds: it continues."""
    blocks = ANTHROPIC["messages"][1]["content"]  # type: ignore[index]
    reply = parse_response(convert.anthropic_reply(blocks))
    resent = convert.anthropic_messages({"messages": ANTHROPIC["messages"][:2]})[-1]
    assert reply.key == parse_messages([resent])[0].key
    output = RESPONSES["input"][1:3]  # type: ignore[index]
    answer = parse_response(convert.responses_reply(output))
    again = convert.responses_input({"input": RESPONSES["input"][:3]}, False)[-1]  # type: ignore[index]
    assert answer.key == parse_messages([again])[0].key == keys([CHAT[2]])[0]


def test_payloads_are_noted_not_recorded() -> None:
    secret = "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo" * 10
    body = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image", "source": {"type": "base64", "data": secret}},
                    {"type": "document", "title": "Lease", "source": {"data": secret}},
                    {"type": "text", "text": "Look"},
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "private chain", "signature": "s"},
                    {"type": "text", "text": "Seen"},
                ],
            },
        ]
    }
    converted = convert.anthropic_messages(body)
    assert secret not in json.dumps(converted) and "private chain" not in json.dumps(converted)
    texts = [" ".join(p.text for p in parts) for parts in shown(converted)]
    assert texts == ["[image]\n[file: Lease]\nLook", "[thinking]\nSeen"]
    image = {"role": "user", "content": [{"type": "input_image", "image_url": secret}]}
    assert secret not in json.dumps(convert.responses_input({"input": [image]}, False))


def test_the_response_map_is_durable_bounded_private_and_per_client(tmp_path: Path) -> None:
    folder = tmp_path / ".proxy"
    chain = ResponseChain(folder, max_rows=3)
    for i in range(5):
        chain.add("alice", f"resp_{i}", f"{i:032x}")
    chain.close()
    reopened = ResponseChain(folder, max_rows=3)
    assert [reopened.head("alice", f"resp_{i}") for i in range(5)] == [
        None,
        None,
        f"{2:032x}",
        f"{3:032x}",
        f"{4:032x}",
    ]
    assert reopened.head("bob", "resp_4") is None
    assert (folder / "responses.sqlite3").stat().st_mode & 0o777 == 0o600
    assert folder.stat().st_mode & 0o777 == 0o700
