"""`POST /v1/chat/completions` under hostile use: long stop sequences, dropped streams, clients that do
not read, `n` against tenant limits, stop sequences that end a choice early, per-choice seeds.

Real uvicorn on loopback, the official SDK (or raw httpx) as client; the stream merge is also driven
directly with sources that count what was pulled from them, so back-pressure is a count, not a time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from typing import Any

import httpx
import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st
from openai import OpenAI
from support.chat_server import ChatServer, text_reply
from support.wire import API_KEY, MODEL
from test_shim_chat_completions import LOOKUP
from test_shim_disconnect import metered_fast  # noqa: F401  (fixture)

from server_shim.chat_http import StopText, interleaved
from server_shim.chat_requests import MAX_STOP_CHARS

pytestmark = pytest.mark.timeout(60)

HI = [{"role": "user", "content": "hi"}]


def test_a_stop_sequence_longer_than_the_bound_is_a_400_naming_stop(server: Any, sdk: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.chat.completions.create(model=MODEL, messages=HI, stop=["x" * (MAX_STOP_CHARS + 1)])  # type: ignore[arg-type]
    assert refused.value.code == "invalid_value" and refused.value.param == "stop"
    assert "Value error" not in refused.value.message, "the message is the rule, without pydantic's prefix"
    longest = sdk.chat.completions.create(model=MODEL, messages=HI, stop="x" * MAX_STOP_CHARS)  # type: ignore[arg-type]
    assert longest.choices[0].finish_reason == "stop" and longest.choices[0].message.content


@given(
    pieces=st.lists(st.text(alphabet="abE", max_size=6), max_size=12),
    stops=st.lists(st.text(alphabet="abE", min_size=1, max_size=4), min_size=1, max_size=4),
)
def test_stop_text_cuts_where_the_first_stop_completes_however_split_and_holds_back_less_than_the_longest(
    pieces: list[str], stops: list[str]
) -> None:
    stop = StopText(tuple(stops))
    out = []
    for piece in pieces:
        out.append(stop.feed(piece))
        assert len(stop.held) < max(map(len, stops))
    said = "".join(out) + stop.flush()
    text = "".join(pieces)
    completed = [(at + len(s), at) for s in stops if (at := text.find(s)) >= 0]
    assert said == (text[: min(completed)[1]] if completed else text)
    assert stop.hit is bool(completed)


def test_a_chat_stream_dropped_after_its_first_chunk_frees_the_tenants_slot(make_server: Any) -> None:
    server = make_server(api_keys=["alice sk-a"], tenant_max_concurrent=1, simulated_tokens_per_s=200.0)
    with OpenAI(base_url=server.base_url, api_key="sk-a", max_retries=0) as alice:
        stream = alice.chat.completions.create(model=MODEL, messages=HI, stream=True, max_tokens=2000)  # type: ignore[arg-type]
        for _ in stream:
            break
        stream.close()
        assert _answered_within(alice, 5.0).choices[0].message.content


def _answered_within(client: OpenAI, seconds: float) -> Any:
    """The next call's answer, retried on 429 while the server notices the dropped stream."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return client.chat.completions.create(model=MODEL, messages=HI)  # type: ignore[arg-type]
        except openai.RateLimitError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


async def _counted(pulled: list[int], index: int) -> AsyncGenerator[int, None]:
    for item in range(10_000):
        pulled[index] += 1
        yield item


async def test_interleaved_pulls_each_source_only_as_fast_as_its_items_are_taken() -> None:
    pulled = [0, 0, 0, 0]
    merged = interleaved([_counted(pulled, i) for i in range(4)])
    taken = [await anext(merged) for _ in range(10)]
    for _ in range(100):  # the sources get every chance to run ahead of a reader that stopped
        await asyncio.sleep(0)
    assert len(taken) == 10
    assert sum(pulled) <= 10 + 2 * 4  # the queue's one item per source, and one in each source's hand
    await merged.aclose()


async def _forever(closed: list[int]) -> AsyncGenerator[int, None]:
    try:
        while True:
            yield 1
            await asyncio.sleep(0)
    finally:
        closed.append(1)


async def test_closing_interleaved_closes_every_source() -> None:
    closed: list[int] = []
    merged = interleaved([_forever(closed) for _ in range(3)])
    await anext(merged)
    await merged.aclose()
    for _ in range(10):
        await asyncio.sleep(0)
    assert closed == [1, 1, 1]


async def test_a_chat_stream_nobody_reads_does_not_run_ahead(metered_fast: Any) -> None:  # noqa: F811
    """n = 4 answers of 32,768 tokens (about 26 MB of chunks, more than the sockets hold) at 100,000
    tokens/s to a client that reads nothing: no choice runs to its end; the tokens generated when the
    client leaves are what the sockets took, counted by the usage ledger's path."""
    server, recorder = metered_fast
    body = {"model": MODEL, "messages": HI, "stream": True, "n": 4, "max_tokens": 32_768}
    async with (
        httpx.AsyncClient(timeout=10) as http,
        http.stream("POST", server.base_url + "/chat/completions", json=body) as reply,
    ):
        assert reply.status_code == 200
        for _ in range(30):  # 4 x 32,768 tokens take 1.3 s at that pace: ample time to finish, had they run ahead
            await asyncio.sleep(0.1)
            assert not recorder.responses, "a choice ran to its end while its client read nothing"
    for _ in range(300):
        if len(recorder.responses) == 4:
            break
        await asyncio.sleep(0.01)
    assert [r["status"] for r in recorder.responses] == ["cancelled"] * 4
    assert sum(r["usage"]["output_tokens"] for r in recorder.responses) < 32_768


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
def test_n_choices_count_as_n_responses_for_the_tenants_limits(make_server: Any, stream: bool) -> None:
    server = make_server(api_keys=["alice sk-a"], tenant_max_concurrent=2, tenant_turns_per_minute=3)
    with OpenAI(base_url=server.base_url, api_key="sk-a", max_retries=0) as alice:
        with pytest.raises(openai.BadRequestError) as over:
            _consume(alice.chat.completions.create(model=MODEL, messages=HI, n=3, stream=stream))  # type: ignore[arg-type]
        assert over.value.param == "n" and "limit of 2" in over.value.message
        _consume(alice.chat.completions.create(model=MODEL, messages=HI, n=2, stream=stream))  # type: ignore[arg-type]
        with pytest.raises(openai.RateLimitError):  # 2 of 3 this minute are spent: 2 more are one too many
            _consume(alice.chat.completions.create(model=MODEL, messages=HI, n=2, stream=stream))  # type: ignore[arg-type]
        _consume(alice.chat.completions.create(model=MODEL, messages=HI, stream=stream))  # type: ignore[arg-type]


def _consume(answer: Any) -> None:
    if isinstance(answer, openai.Stream):
        list(answer)


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
def test_a_stop_sequence_ends_the_choice_and_its_turn_there(server: Any, sdk: OpenAI, stream: bool) -> None:
    """The simulator's text says 'token' in its first ten words; the answer asked for 2,000 tokens:
    the turn ends at the stop sequence, and the usage counts what was generated up to it."""
    fields: dict[str, Any] = {"model": MODEL, "messages": HI, "max_tokens": 2000, "stop": "token", "n": 2}
    if stream:
        chunks = list(sdk.chat.completions.create(stream=True, stream_options={"include_usage": True}, **fields))
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices and c.choices[0].index == 0)
        usage = chunks[-1].usage
    else:
        answer = sdk.chat.completions.create(**fields)
        finishes = [choice.finish_reason for choice in answer.choices]
        text, usage = answer.choices[0].message.content or "", answer.usage
    assert finishes == ["stop", "stop"] and text == "simulated reply from the responses-ws simulator "
    assert usage is not None and 2 * 6 <= usage.completion_tokens <= 2 * 20


def test_n_choices_with_a_seed_get_a_seed_each(make_server: Any, chat_server: ChatServer) -> None:
    shim = make_server(backend=chat_server.base_url)
    chat_server.enqueue(text_reply("a"), text_reply("b"), text_reply("c"))
    with OpenAI(base_url=shim.base_url, api_key=API_KEY, max_retries=0) as client:
        client.chat.completions.create(model="gpt-test", messages=HI, n=3, seed=7)  # type: ignore[arg-type]
    assert sorted(received.body["seed"] for received in chat_server.received[-3:]) == [7, 8, 9]


@pytest.fixture
def sdk(server: Any) -> Any:
    with OpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0) as client:
        yield client


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
def test_n_choices_calling_a_tool_get_distinct_call_ids(sdk: OpenAI, stream: bool) -> None:
    """The simulator makes the same call, with the same id, in every choice: the ids the client gets differ."""
    fields: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": 'call lookup {"n": 2}'}]}
    fields.update(n=3, tools=[LOOKUP], stream=stream)
    if stream:
        chunks = list(sdk.chat.completions.create(**fields))
        ids = [call.id for c in chunks if c.choices for call in c.choices[0].delta.tool_calls or () if call.id]
    else:
        answer = sdk.chat.completions.create(**fields)
        ids = [call.id for choice in answer.choices for call in choice.message.tool_calls or ()]
    assert len(ids) == 3 and len(set(ids)) == 3 and all(i.startswith("call_sim_") for i in ids)


def test_an_assistant_refusal_in_the_history_is_its_refusal_part(server: Any, sdk: OpenAI, recorder: Any) -> None:
    messages: list[Any] = [
        {"role": "user", "content": "something forbidden"},
        {"role": "assistant", "content": None, "refusal": "I can't help with that."},
        {"role": "user", "content": "then say hello"},
    ]
    assert sdk.chat.completions.create(model=MODEL, messages=messages).choices[0].message.content
    refused = [item for item in recorder.calls[-1].items if item.get("role") == "assistant"]
    assert refused == [
        {"type": "message", "role": "assistant", "content": [{"type": "refusal", "refusal": "I can't help with that."}]}
    ]


@pytest.mark.parametrize("role", ["system", "developer", "assistant", "tool", "user"])
@pytest.mark.parametrize("text", [None, {"a": 1}, 3], ids=["null", "object", "number"])
def test_a_text_part_whose_text_is_not_a_string_is_a_400_naming_it(sdk: OpenAI, role: str, text: Any) -> None:
    message: dict[str, Any] = {"role": role, "content": [{"type": "text", "text": text}]}
    if role == "tool":
        message["tool_call_id"] = "call_1"
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.post("/chat/completions", body={"model": MODEL, "messages": [message]}, cast_to=dict)
    assert refused.value.code == "invalid_type" and refused.value.param == "messages[0].content[0].text"
    assert sdk.chat.completions.create(model=MODEL, messages=HI).choices  # type: ignore[arg-type]


CALL = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
FUNCTION = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}


@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [
        ({"stop": 3}, "stop", "invalid_value"),
        ({"tool_choice": 3}, "tool_choice", "invalid_value"),
        ({"tools": ["lookup"]}, "tools[0]", "invalid_value"),
        ({"logit_bias": {"42": "up"}}, "logit_bias", "invalid_value"),
        ({"logit_bias": {"42": 101}}, "logit_bias", "invalid_value"),
        ({"logit_bias": {"42": -101}}, "logit_bias", "invalid_value"),
        ({"tools": [FUNCTION, FUNCTION]}, "tools[1].function.name", "invalid_value"),
        ({"tools": [{"type": "function", "function": {"name": "f" * 65}}]}, "tools[0].function.name", "invalid_value"),
        ({"tools": [{"type": "function", "function": {"name": "look up"}}]}, "tools[0].function.name", "invalid_value"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": 3}}]},
            "tools[0].function.parameters",
            "invalid_value",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
            "response_format",
            "invalid_value",
        ),
        (
            {
                "messages": [
                    *HI,
                    {"role": "assistant", "tool_calls": [CALL, {**CALL, "function": {"name": 3, "arguments": "{}"}}]},
                ]
            },
            "messages[1].tool_calls[1].function.name",
            "invalid_type",
        ),
        (
            {"messages": [*HI, {"role": "tool", "tool_call_id": "nope", "content": "r"}]},
            "messages[1].tool_call_id",
            "tool_output_without_call",
        ),
    ],
)
def test_a_400_names_the_chat_parameter_not_the_responses_one(
    sdk: OpenAI, fields: dict[str, Any], param: str, code: str
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.post("/chat/completions", body={"model": MODEL, "messages": HI, **fields}, cast_to=dict)
    assert refused.value.param == param and refused.value.code == code
    assert "input[" not in refused.value.message and "'text'" not in refused.value.message
    assert sdk.chat.completions.create(model=MODEL, messages=HI).choices  # type: ignore[arg-type]


@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
async def test_a_turn_ended_at_a_stop_sequence_is_metered_as_completed_not_cancelled(
    metered_fast: Any,  # noqa: F811
    stream: bool,
) -> None:
    """Operators tell a choice that reached its stop sequence from a client that went away."""
    server, recorder = metered_fast
    async with openai.AsyncOpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0) as client:
        fields: dict[str, Any] = {"model": MODEL, "messages": HI, "max_tokens": 2000, "stop": "token"}
        if stream:
            async for _ in await client.chat.completions.create(stream=True, **fields):
                pass
        else:
            await client.chat.completions.create(**fields)
    for _ in range(300):
        if recorder.responses:
            break
        await asyncio.sleep(0.01)
    (record,) = recorder.responses
    assert record["status"] == "completed" and record["usage"]["output_tokens"] < 2000
    assert all(item.get("status") in (None, "completed") for item in record["output"])
