"""`wrap(client, chat_completions=True)`: a Chat Completions tool loop over WebSocket mode, against the same loop over HTTP.

Both loops talk to one real Chat Completions server (tests/support/chat_server.py) that answers
both with the same queued replies: over HTTP the client calls it directly; over the session the
client's turns go to the shim (the client's `websocket_url`), which calls it as its backend. The
caller must get the same answers, the backend must see the same messages, and every turn after
the first must send only its new messages.
"""

from __future__ import annotations

from typing import Any

import openai
import pytest
from openai import AsyncOpenAI, OpenAI
from openai.types.chat import ChatCompletion
from support.chat_server import ChatServer, Reply, text_reply, tool_call_reply

import ws_transport
from server_shim import BackgroundServer

pytestmark = pytest.mark.timeout(60)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look up a record by number.",
            "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
        },
    }
]
SYSTEM = {"role": "system", "content": "You are a records clerk. Answer briefly."}
QUESTIONS = ["What is record 3?", "And record 4?", "Thanks, and record 5?"]


def replies() -> list[Reply]:
    """Per question: a tool call (arguments in pieces), then an answer that uses the result."""
    out: list[Reply] = []
    for i, _ in enumerate(QUESTIONS):
        n = i + 3
        out.append(tool_call_reply("lookup", ['{"n":', f" {n}}}"], call_id=f"call_{n}", text="Let me check."))
        out.append(text_reply(f"Record {n} ", "is ", "blue."))
    return out


def run_loop(client: OpenAI, *, stream: bool) -> list[dict[str, Any]]:
    """The usual agent loop: append the answer, run the tool, ask the next question; returns the answers."""
    messages: list[Any] = [SYSTEM]
    answers = []
    for question in QUESTIONS:
        messages.append({"role": "user", "content": question})
        while True:
            answer = ask(client, messages, stream=stream)
            answers.append(answer)
            if stream:
                messages.append(answer["message"])  # rebuilt from chunks, as frameworks do
            else:
                messages.append(answer["object"].choices[0].message)  # the SDK's own object, appended as is
            calls = answer["message"].get("tool_calls") or []
            if not calls:
                break
            for call in calls:
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": f"record: {call['id']}"})
    return answers


def ask(client: OpenAI, messages: list[Any], *, stream: bool) -> dict[str, Any]:
    if not stream:
        completion = client.chat.completions.create(model="gpt-test", messages=messages, tools=TOOLS)
        assert isinstance(completion, ChatCompletion)
        choice = completion.choices[0]
        return {
            "object": completion,
            "message": choice.message.model_dump(exclude_none=True, exclude={"annotations"}),
            "finish_reason": choice.finish_reason,
            "usage": completion.usage.model_dump() if completion.usage else None,
        }
    chunks = list(
        client.chat.completions.create(
            model="gpt-test", messages=messages, tools=TOOLS, stream=True, stream_options={"include_usage": True}
        )
    )
    return assemble(chunks)


def assemble(chunks: list[Any]) -> dict[str, Any]:
    text, calls, finish, usage = "", {}, None, None
    for chunk in chunks:
        if chunk.usage is not None:
            usage = chunk.usage.model_dump()
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
            for call in choice.delta.tool_calls or []:
                entry = calls.setdefault(
                    call.index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
                )
                entry["id"] += call.id or ""
                if call.function is not None:
                    entry["function"]["name"] += call.function.name or ""
                    entry["function"]["arguments"] += call.function.arguments or ""
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return {"message": message, "finish_reason": finish, "usage": usage}


def comparable(answers: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(a["message"], a["finish_reason"], a["usage"]) for a in answers]


def _backend_messages(chat_server: ChatServer, start: int) -> list[list[dict[str, Any]]]:
    return [r.body["messages"] for r in chat_server.received[start:]]


def _wrapped(chat_server: ChatServer, shim: BackgroundServer, **options: Any) -> OpenAI:
    client = OpenAI(base_url=chat_server.base_url, api_key="test-key", max_retries=0)
    websocket_url = shim.base_url.replace("http://", "ws://") + "/responses"
    return ws_transport.wrap(client, chat_completions=True, websocket_url=websocket_url, **options)


@pytest.fixture
def shim(make_server: Any, chat_server: ChatServer) -> BackgroundServer:
    return make_server(backend=chat_server.base_url)


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
def test_a_chat_tool_loop_gives_the_same_answers_and_sends_only_new_messages(
    chat_server: ChatServer, shim: BackgroundServer, stream: bool
) -> None:
    chat_server.enqueue(*replies())
    with OpenAI(base_url=chat_server.base_url, api_key="test-key", max_retries=0) as plain:
        over_http = run_loop(plain, stream=stream)
    http_messages = _backend_messages(chat_server, 0)

    frames: list[dict[str, Any]] = []
    chat_server.enqueue(*replies())
    with _wrapped(chat_server, shim, on_request=frames.append) as client:
        over_ws = run_loop(client, stream=stream)
        stats = ws_transport.session_of(client).stats
    ws_messages = _backend_messages(chat_server, len(http_messages))

    assert comparable(over_ws) == comparable(over_http)
    assert ws_messages == http_messages  # the backend saw the same conversation both ways
    assert (stats.turns, stats.chat_turns, stats.turns_chained, stats.fallbacks) == (6, 6, 5, 0)
    assert stats.chat_fallbacks == {}
    assert "previous_response_id" not in frames[0] and len(frames[0]["input"]) == 2
    for frame in frames[1:]:
        assert frame["previous_response_id"]
        assert len(frame["input"]) == 1  # a tool output, or the next question: never the history
    sizes = [len(str(frame)) for frame in frames[1:]]
    assert max(sizes) - min(sizes) < 200  # bytes flat per turn while the history grows


async def test_the_async_client_chains_chat_calls_too(chat_server: ChatServer, shim: BackgroundServer) -> None:
    chat_server.enqueue(*replies()[:2])
    websocket_url = shim.base_url.replace("http://", "ws://") + "/responses"
    client = AsyncOpenAI(base_url=chat_server.base_url, api_key="test-key", max_retries=0)
    async with ws_transport.wrap(client, chat_completions=True, websocket_url=websocket_url) as wrapped:
        messages: list[Any] = [SYSTEM, {"role": "user", "content": QUESTIONS[0]}]
        first = await wrapped.chat.completions.create(model="gpt-test", messages=messages, tools=TOOLS)
        calls = first.choices[0].message.tool_calls or []
        messages += [first.choices[0].message, {"role": "tool", "tool_call_id": calls[0].id, "content": "blue"}]
        stream = await wrapped.chat.completions.create(model="gpt-test", messages=messages, tools=TOOLS, stream=True)
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        stats = ws_transport.session_of(wrapped).stats
    assert calls[0].function.arguments == '{"n": 3}'
    assert text == "Record 3 is blue."
    assert (stats.chat_turns, stats.turns_chained) == (2, 1)


@pytest.mark.parametrize(
    ("extra", "reason"),
    [({"n": 2}, "n > 1"), ({"logit_bias": {"42": 1}}, "logit_bias"), ({"seed": 7}, "seed")],
)
def test_a_call_without_a_faithful_translation_goes_over_http_unchanged_and_says_why(
    chat_server: ChatServer, shim: BackgroundServer, extra: dict[str, Any], reason: str
) -> None:
    chat_server.enqueue(text_reply("over ", "http"))
    with _wrapped(chat_server, shim) as client:
        messages = [{"role": "user", "content": "hi"}]
        completion = client.chat.completions.create(model="gpt-test", messages=messages, **extra)
        stats = ws_transport.session_of(client).stats
    assert completion.choices[0].message.content == "over http"
    assert chat_server.received[-1].body == {"model": "gpt-test", "messages": messages, **extra}
    assert stats.chat_fallbacks == {reason: 1}
    assert stats.chat_turns == 0


def test_with_the_option_off_chat_calls_stay_on_http(chat_server: ChatServer, shim: BackgroundServer) -> None:
    chat_server.enqueue(text_reply("plain"))
    websocket_url = shim.base_url.replace("http://", "ws://") + "/responses"
    plain = OpenAI(base_url=chat_server.base_url, api_key="k")
    client = ws_transport.wrap(plain, websocket_url=websocket_url, chat_completions=False)
    with client:
        client.chat.completions.create(model="gpt-test", messages=[{"role": "user", "content": "hi"}])
        assert ws_transport.session_of(client).stats.turns == 0
    assert len(chat_server.received) == 1


def test_a_backend_error_raises_the_same_exception_class_as_over_http(
    chat_server: ChatServer, shim: BackgroundServer
) -> None:
    from support.chat_server import fault_reply

    chat_server.enqueue(fault_reply("http_429"))
    with _wrapped(chat_server, shim) as client, pytest.raises(openai.APIStatusError) as raised:
        client.chat.completions.create(model="gpt-test", messages=[{"role": "user", "content": "hi"}])
    assert raised.value.status_code == 429


def test_the_socket_opens_on_the_responses_url_beside_the_chat_url(
    chat_server: ChatServer, shim: BackgroundServer
) -> None:
    chat_server.enqueue(text_reply("from ", "the socket"))
    with ws_transport.wrap(OpenAI(base_url=shim.base_url, api_key="k"), chat_completions=True) as client:
        completion = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        stats = ws_transport.session_of(client).stats
    assert completion.choices[0].message.content == "from the socket"
    assert (stats.turns, stats.chat_turns, stats.fallbacks) == (1, 1, 0)


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
def test_logprobs_ride_the_session_and_come_back_as_over_http(
    chat_server: ChatServer, shim: BackgroundServer, stream: bool
) -> None:
    messages: list[Any] = [{"role": "user", "content": "hi"}]
    asked = {"logprobs": True, "top_logprobs": 2}

    def logprobs(client: OpenAI, messages: list[Any], stream: bool = stream) -> list[Any]:
        if not stream:
            completion = client.chat.completions.create(model="gpt-test", messages=messages, **asked)
            return [p.model_dump() for p in completion.choices[0].logprobs.content]
        chunks = client.chat.completions.create(model="gpt-test", messages=messages, stream=True, **asked)
        return [
            p.model_dump() for c in chunks if c.choices and c.choices[0].logprobs for p in c.choices[0].logprobs.content
        ]

    chat_server.enqueue(text_reply("Hel", "lo"), text_reply("Hel", "lo"), text_reply("again"))
    with OpenAI(base_url=chat_server.base_url, api_key="test-key", max_retries=0) as plain:
        over_http = logprobs(plain, messages, stream=True)  # the test server gives logprobs in its streams only
    with _wrapped(chat_server, shim) as client:
        over_ws = logprobs(client, messages)
        messages += [{"role": "assistant", "content": "Hello"}, {"role": "user", "content": "again"}]
        logprobs(client, messages)
        stats = ws_transport.session_of(client).stats
    assert over_ws == over_http and [p["token"] for p in over_ws] == ["Hel", "lo"]
    assert (stats.chat_turns, stats.turns_chained, stats.chat_fallbacks) == (2, 1, {})
