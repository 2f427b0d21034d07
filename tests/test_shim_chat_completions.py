"""`POST /v1/chat/completions` on the shim, with the official SDK's `chat.completions.create` over HTTP.

Every answer is checked against the SDK's `ChatCompletion` / `ChatCompletionChunk` types field by
field; a chat backend must see the conversation a direct client would have sent it (the same
answers both ways); bad input gets a 400 naming the chat parameter, and the next call works.
"""

from __future__ import annotations

import json
from typing import Any

import httpx2
import openai
import pytest
from openai import OpenAI
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from pydantic import TypeAdapter
from support.chat_server import ChatServer, text_reply, tool_call_reply
from support.wire import API_KEY, MODEL
from test_transport_chat_wrap import QUESTIONS, TOOLS, comparable, replies, run_loop

import ws_transport
from server_shim.chat_http import StopText

pytestmark = pytest.mark.timeout(60)

COMPLETION = TypeAdapter(ChatCompletion)
CHUNK = TypeAdapter(ChatCompletionChunk)
LOOKUP = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look a record up.",
        "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
    },
}


def post(server: Any, body: Any, key: str = API_KEY) -> httpx2.Response:
    content = body if isinstance(body, (str, bytes)) else json.dumps(body)
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    return httpx2.post(server.base_url + "/chat/completions", content=content, headers=headers, timeout=10)


def sse_chunks(body: bytes) -> list[dict[str, Any]]:
    lines = [line[6:] for line in body.decode().split("\n\n") if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


@pytest.fixture
def sdk(server: Any) -> Any:
    with OpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0) as client:
        yield client


def test_a_completion_parses_strictly_and_says_what_the_simulator_says(server: Any, sdk: OpenAI) -> None:
    reply = post(server, {"model": MODEL, "messages": [{"role": "user", "content": "hello"}]})
    assert reply.status_code == 200 and reply.headers["content-type"] == "application/json"
    body = reply.json()
    COMPLETION.validate_python(body, strict=True)
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    completion = sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hello"}])
    assert completion.choices[0].message.content == body["choices"][0]["message"]["content"]
    assert "simulat" in (completion.choices[0].message.content or "")
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage is not None and completion.usage.completion_tokens == 16


def test_a_stream_has_the_chat_chunk_shapes_and_the_same_text(server: Any, sdk: OpenAI) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"}]
    body = {"model": MODEL, "messages": messages, "stream": True, "stream_options": {"include_usage": True}}
    reply = post(server, body)
    assert reply.headers["content-type"].startswith("text/event-stream")
    chunks = sse_chunks(reply.content)
    for chunk in chunks:
        CHUNK.validate_python(chunk, strict=True)
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert [c["usage"] for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 16
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    streamed = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    whole = sdk.chat.completions.create(model=MODEL, messages=messages)  # type: ignore[arg-type]
    assert streamed == whole.choices[0].message.content
    without_usage = sse_chunks(post(server, {"model": MODEL, "messages": messages, "stream": True}).content)
    assert all("usage" not in c and c["choices"] for c in without_usage)


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
def test_a_tool_loop_over_the_simulator(sdk: OpenAI, stream: bool) -> None:
    messages: list[Any] = [{"role": "user", "content": 'call lookup {"n": 7}'}]
    first = _answer(sdk, messages, stream=stream, tools=[LOOKUP])
    assert first["finish_reason"] == "tool_calls"
    (call,) = first["message"]["tool_calls"]
    assert call["function"] == {"name": "lookup", "arguments": '{"n": 7}'} and call["type"] == "function"
    messages += [first["message"], {"role": "tool", "tool_call_id": call["id"], "content": "blue"}]
    second = _answer(sdk, messages, stream=stream, tools=[LOOKUP])
    assert second["finish_reason"] == "stop"
    assert f"Tool {call['id']} returned: blue" in second["message"]["content"]


def _answer(sdk: OpenAI, messages: list[Any], *, stream: bool, **fields: Any) -> dict[str, Any]:
    if not stream:
        choice = sdk.chat.completions.create(model=MODEL, messages=messages, **fields).choices[0]
        return {"message": choice.message.model_dump(exclude_none=True), "finish_reason": choice.finish_reason}
    from test_transport_chat_wrap import assemble

    return assemble(list(sdk.chat.completions.create(model=MODEL, messages=messages, stream=True, **fields)))


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
def test_stop_cuts_the_answer_before_the_stop_sequence(sdk: OpenAI, stream: bool) -> None:
    messages = [{"role": "user", "content": "hello"}]
    full = sdk.chat.completions.create(model=MODEL, messages=messages).choices[0].message.content or ""  # type: ignore[arg-type]
    stop = full[10:14]
    cut = _answer(sdk, messages, stream=stream, stop=[stop, "never-said"])
    assert cut["message"]["content"] == full[: full.index(stop)]
    assert cut["finish_reason"] == "stop"


def test_stop_text_holds_back_only_what_may_begin_a_stop_sequence() -> None:
    stop = StopText(("END", "xyz"))
    assert [stop.feed(piece) for piece in ["abc E", "N", "x", "D tail", " xy"]] == ["abc ", "", "EN", "xD tail", " "]
    assert stop.hit is False and stop.flush() == "xy"
    stop = StopText(("END",))
    assert stop.feed("one E") == "one " and stop.feed("ND two") == "" and stop.hit
    assert stop.feed("more") == "" and stop.flush() == ""


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
def test_n_choices_run_one_turn_each(server: Any, stream: bool) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "n": 3, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    reply = post(server, body)
    assert reply.status_code == 200
    if not stream:
        completion = COMPLETION.validate_python(reply.json(), strict=True)
        assert [c.index for c in completion.choices] == [0, 1, 2]
        assert completion.usage is not None and completion.usage.completion_tokens == 48
        return
    chunks = sse_chunks(reply.content)
    finishes = sorted(c["choices"][0]["index"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"])
    assert finishes == [0, 1, 2]
    assert chunks[-1]["usage"]["completion_tokens"] == 48
    assert sum(1 for c in chunks if not c["choices"]) == 1


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"model": MODEL}, "messages", "missing_required_parameter"),
        ({"model": MODEL, "messages": []}, "messages", "invalid_value"),
        ({"model": MODEL, "messages": ["hi"]}, "messages[0]", "invalid_type"),
        ({"model": MODEL, "messages": [{"role": "robot", "content": "hi"}]}, "messages[0]", "invalid_value"),
        ({"model": MODEL, "messages": [{"role": "tool", "content": "x"}]}, "messages[0]", "missing_required_parameter"),
        (
            {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "input_audio"}]}]},
            "messages[0]",
            "unsupported_value",
        ),
        ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "n": 0}, "n", "invalid_value"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stop": ["a"] * 5}, "stop", "invalid_value"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": "yes"}, "stream", "invalid_value"),
        (
            {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "audio": {}},
            "audio",
            "unsupported_parameter",
        ),
        (
            {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "custom"}]},
            "tools[0]",
            "unsupported_value",
        ),
        (
            {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "xml"}},
            "response_format",
            "invalid_value",
        ),
    ],
)
def test_bad_input_is_a_400_naming_the_chat_parameter_and_the_next_call_works(
    server: Any, sdk: OpenAI, body: dict[str, Any], param: str, code: str
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:  # the SDK's own request path; it would refuse some itself
        sdk.post("/chat/completions", body=body, cast_to=ChatCompletion)
    assert refused.value.code == code and refused.value.param == param
    assert sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}]).choices


def test_unknown_model_and_bad_json(server: Any, sdk: OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        sdk.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "hi"}])
    reply = post(server, b"{not json")
    assert reply.status_code == 400 and reply.json()["error"]["code"] == "invalid_json"


def test_keys_tenants_and_turn_limits_hold_for_chat_calls(make_server: Any) -> None:
    server = make_server(api_keys=["alice sk-a"], tenant_turns_per_minute=2)
    hi = [{"role": "user", "content": "hi"}]
    with (
        OpenAI(base_url=server.base_url, api_key="wrong", max_retries=0) as stranger,
        pytest.raises(openai.AuthenticationError),
    ):
        stranger.chat.completions.create(model=MODEL, messages=hi)  # type: ignore[arg-type]
    with OpenAI(base_url=server.base_url, api_key="sk-a", max_retries=0) as alice:
        for _ in range(2):
            alice.chat.completions.create(model=MODEL, messages=hi)  # type: ignore[arg-type]
        with pytest.raises(openai.RateLimitError):
            alice.chat.completions.create(model=MODEL, messages=hi)  # type: ignore[arg-type]


@pytest.fixture
def chat_shim(make_server: Any, chat_server: ChatServer) -> Any:
    return make_server(backend=chat_server.base_url)


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
def test_a_chat_backend_answers_the_shims_endpoint_as_it_answers_a_direct_client(
    chat_server: ChatServer, chat_shim: Any, stream: bool
) -> None:
    chat_server.enqueue(*replies())
    with OpenAI(base_url=chat_server.base_url, api_key="k", max_retries=0) as direct:
        answers = run_loop(direct, stream=stream)
    direct_messages = [r.body["messages"] for r in chat_server.received]
    chat_server.enqueue(*replies())
    with OpenAI(base_url=chat_shim.base_url, api_key="k", max_retries=0) as through_shim:
        shimmed = run_loop(through_shim, stream=stream)
    shim_messages = [r.body["messages"] for r in chat_server.received[len(direct_messages) :]]
    assert comparable(shimmed) == comparable(answers)
    assert shim_messages == direct_messages
    assert len(answers) == 2 * len(QUESTIONS)


def test_chat_only_fields_reach_a_chat_backend(chat_server: ChatServer, chat_shim: Any) -> None:
    chat_server.enqueue(tool_call_reply("lookup", ['{"n": 1}']), text_reply("fine"))
    extra = {"stop": ["\n\n"], "seed": 7, "logit_bias": {"42": -5}, "presence_penalty": 0.5}
    with OpenAI(base_url=chat_shim.base_url, api_key="k", max_retries=0) as client:
        messages: list[Any] = [{"role": "user", "content": "hi", "name": "ann"}]
        client.chat.completions.create(model="gpt-test", messages=messages, tools=TOOLS, **extra)  # type: ignore[arg-type]
    sent = chat_server.received[-1].body
    assert {k: sent.get(k) for k in extra} == extra
    assert sent["messages"] == [{"role": "user", "content": "hi"}]
    assert sent["tools"][0]["function"]["name"] == "lookup"


def test_wrapped_clients_calls_that_stay_on_http_are_answered_by_the_shim(server: Any) -> None:
    websocket_url = server.base_url.replace("http://", "ws://") + "/responses"
    plain = OpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0)
    with ws_transport.wrap(plain, websocket_url=websocket_url) as client:
        messages = [{"role": "user", "content": "hello"}]
        chained = client.chat.completions.create(model=MODEL, messages=messages)  # type: ignore[arg-type]
        two = client.chat.completions.create(model=MODEL, messages=messages, n=2)  # type: ignore[arg-type]
        stopped = client.chat.completions.create(model=MODEL, messages=messages, stop="lat")  # type: ignore[arg-type]
        stats = ws_transport.session_of(client).stats
    assert len(two.choices) == 2 and two.choices[1].message.content == chained.choices[0].message.content
    assert "lat" not in (stopped.choices[0].message.content or "")
    assert stats.chat_fallbacks == {"n > 1": 1, "stop": 1} and stats.chat_turns == 1


def test_logprobs_asked_for_come_back_as_the_chat_choices_logprobs(chat_server: ChatServer, chat_shim: Any) -> None:
    chat_server.enqueue(text_reply("Hel", "lo"), text_reply("Hel", "lo"), text_reply("Hel", "lo"))
    hi = [{"role": "user", "content": "hi"}]
    with OpenAI(base_url=chat_shim.base_url, api_key="k", max_retries=0) as client:
        whole = client.chat.completions.create(model="gpt-test", messages=hi, logprobs=True, top_logprobs=2)  # type: ignore[arg-type]
        chunks = list(
            client.chat.completions.create(model="gpt-test", messages=hi, logprobs=True, top_logprobs=2, stream=True)  # type: ignore[arg-type]
        )
        plain = client.chat.completions.create(model="gpt-test", messages=hi)  # type: ignore[arg-type]
    assert chat_server.received[0].body["logprobs"] is True and chat_server.received[0].body["top_logprobs"] == 2
    logprobs = whole.choices[0].logprobs
    assert logprobs is not None and logprobs.content is not None
    assert [(p.token, p.logprob, [t.token for t in p.top_logprobs]) for p in logprobs.content] == [
        ("Hel", -0.25, ["Hel", "else"]),
        ("lo", -0.25, ["lo", "else"]),
    ]
    streamed = [c.choices[0].logprobs for c in chunks if c.choices and c.choices[0].delta.content]
    assert [lp.content[0].token for lp in streamed if lp is not None and lp.content] == ["Hel", "lo"]
    assert "logprobs" not in chat_server.received[-1].body and plain.choices[0].logprobs is None


def test_the_servers_request_limits_hold_for_chat_requests(make_server: Any) -> None:
    server = make_server(max_input_items=10)
    deep: dict[str, Any] = {}
    nested = deep
    for _ in range(100):
        nested["a"] = {}
        nested = nested["a"]
    hi = [{"role": "user", "content": "hi"}]
    cases = [
        ({"model": MODEL, "messages": hi * 11}, "too_many_input_items", "messages"),
        ({"model": MODEL, "messages": hi, "tools": [LOOKUP] * 200}, "too_many_tools", "tools"),
        (
            {
                "model": MODEL,
                "messages": hi,
                "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": deep}},
            },
            "invalid_value",
            "response_format",
        ),
    ]
    with OpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0) as sdk:
        for body, code, param in cases:
            with pytest.raises(openai.BadRequestError) as refused:
                sdk.post("/chat/completions", body=body, cast_to=ChatCompletion)
            assert (refused.value.code, refused.value.param) == (code, param)
        assert sdk.chat.completions.create(model=MODEL, messages=hi).choices  # type: ignore[arg-type]
