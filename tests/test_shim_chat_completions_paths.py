"""`POST /v1/chat/completions` on every path a turn takes: a `responses` upstream, a failing chat backend,
a client that goes away mid-stream. The official SDK is the client; answers parse as its types."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI
from support.chat_server import ChatServer, fault_reply, text_reply
from test_shim_backend_responses import shims  # noqa: F401  (fixture)
from test_shim_chat_completions import LOOKUP
from test_shim_disconnect import TOKENS, assert_quiet, metered, server_errors  # noqa: F401  (fixture)
from test_transport_chat_wrap import assemble

from server_shim import metrics

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
def test_a_responses_upstream_answers_a_chat_tool_loop(shims: Any, stream: bool) -> None:  # noqa: F811
    front, _upstream, seen = shims
    with OpenAI(base_url=front.base_url, api_key="k", max_retries=0) as client:
        messages: list[Any] = [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": 'call lookup {"n": 2}'},
        ]
        first = _ask(client, messages, stream)
        (call,) = first["message"]["tool_calls"]
        assert first["finish_reason"] == "tool_calls" and call["function"]["name"] == "lookup"
        messages += [first["message"], {"role": "tool", "tool_call_id": call["id"], "content": "green"}]
        second = _ask(client, messages, stream)
    assert f"Tool {call['id']} returned: green" in second["message"]["content"]
    assert second["finish_reason"] == "stop"
    assert [item["type"] for item in seen[-1]["items"]] == [
        "message",
        "message",
        "function_call",
        "function_call_output",
    ]
    assert seen[-1]["store"] is False and seen[-1]["previous"] is None  # the whole conversation, never stored


def _ask(client: OpenAI, messages: list[Any], stream: bool) -> dict[str, Any]:
    if stream:
        return assemble(list(client.chat.completions.create(model="m", messages=messages, tools=[LOOKUP], stream=True)))
    choice = client.chat.completions.create(model="m", messages=messages, tools=[LOOKUP]).choices[0]
    return {"message": choice.message.model_dump(exclude_none=True), "finish_reason": choice.finish_reason}


@pytest.fixture
def chat_shim(make_server: Any, chat_server: ChatServer) -> Any:
    return make_server(backend=chat_server.base_url)


def test_a_failing_backend_is_the_sdks_error_and_the_next_call_works(chat_server: ChatServer, chat_shim: Any) -> None:
    hi = [{"role": "user", "content": "hi"}]
    chat_server.enqueue(fault_reply("http_500"), fault_reply("cut"), text_reply("fine"))
    with OpenAI(base_url=chat_shim.base_url, api_key="k", max_retries=0) as client:
        with pytest.raises(openai.APIStatusError) as failed:
            client.chat.completions.create(model="gpt-test", messages=hi)  # type: ignore[arg-type]
        assert failed.value.status_code == 502 and failed.value.code == "backend_error"
        counted = metrics.ERRORS.labels("backend_error")._value.get()
        stream = client.chat.completions.create(model="gpt-test", messages=hi, stream=True)  # type: ignore[arg-type]
        with pytest.raises(openai.APIError, match=r"ended before the response finished|failed") as cut:
            for _ in stream:
                pass
        assert cut.value.code == "backend_error"
        assert metrics.ERRORS.labels("backend_error")._value.get() == counted + 1
        again = client.chat.completions.create(model="gpt-test", messages=hi)  # type: ignore[arg-type]
    assert again.choices[0].message.content == "fine"


async def test_a_chat_stream_dropped_mid_answer_stops_the_turn_quietly_and_meters_it(metered: Any, caplog: Any) -> None:  # noqa: F811
    server, recorder = metered
    errors = server_errors()
    body = {"model": "simulated-1", "messages": [{"role": "user", "content": "a long story"}], "stream": True}
    body["max_tokens"] = TOKENS
    async with (
        httpx.AsyncClient() as http,
        http.stream("POST", server.base_url + "/chat/completions", json=body) as reply,
    ):
        async for line in reply.aiter_lines():
            if line.startswith("data:") and json.loads(line[5:])["choices"][0]["delta"].get("content"):
                break
    for _ in range(200):
        if recorder.responses:
            break
        await asyncio.sleep(0.01)
    (record,) = recorder.responses
    assert record["status"] == "cancelled" and 1 <= record["usage"]["output_tokens"] < TOKENS
    assert_quiet(caplog, errors)
