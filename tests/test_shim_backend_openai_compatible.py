"""The shim in front of a real OpenAI-compatible Chat Completions server on loopback.

The server (`tests/support/chat_server.py`) replays documented chunk shapes; the first tests
prove that against the `openai` package's own types and client.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx2
import openai
import pytest
from openai import AsyncOpenAI, OpenAI
from openai.types.chat import ChatCompletionChunk, ChatCompletionFunctionToolParam, ChatCompletionMessageParam
from pydantic import TypeAdapter
from support.chat_server import (
    MODEL as CHAT_MODEL,
)
from support.chat_server import (
    ChatServer,
    closed_port,
    fault_reply,
    text_reply,
    tool_call_reply,
)
from support.wire import (
    API_KEY,
    LOOKUP_TOOL,
    completed_ok,
    only_connection,
    run_turn,
    sse_events,
    user,
)

from server_shim.config import DeploymentConfig, RoutingConfig, ShimConfig

MESSAGE = TypeAdapter(ChatCompletionMessageParam)
CHAT_TOOL = TypeAdapter(ChatCompletionFunctionToolParam)


def chat_config(base_url: str) -> ShimConfig:
    """One OpenAI-compatible deployment; a short breaker cooldown so one failure doesn't bleed into the next test step."""
    return ShimConfig(
        deployments=[DeploymentConfig(name="chat", kind="openai_compatible", base_url=base_url, models={"*": "*"})],
        routing=RoutingConfig(cooldown_s=0.05),
    )


@pytest.fixture
def shim(make_server, chat_server, recorder):
    return make_server(config=chat_config(chat_server.base_url), validators=[recorder])


@pytest.fixture
async def sdk(shim):
    async with AsyncOpenAI(base_url=shim.base_url, api_key=API_KEY, max_retries=0) as client:
        yield client


# --- the test server speaks the documented shapes ------------------------------------------------


@pytest.mark.parametrize(
    "reply",
    [
        text_reply("Hel", "lo"),
        text_reply("cut", finish_reason="length"),
        tool_call_reply("lookup", ['{"n"', ": 7}"]),
        tool_call_reply("lookup", ["{}"], text="Let me look."),
    ],
    ids=["text", "length", "tool-call", "text-then-tool-call"],
)
@pytest.mark.parametrize("include_usage", [True, False])
def test_every_chunk_validates_as_the_sdks_chat_completion_chunk(reply, include_usage):
    chunks = reply.chunks(include_usage)
    for chunk in chunks:
        ChatCompletionChunk.model_validate(chunk)
        assert ("usage" in chunk) is include_usage
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finishes[-1] in ("stop", "length", "tool_calls") and not any(finishes[:-1])
    if include_usage:
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] == 18


def test_the_official_client_reads_the_test_servers_stream(chat_server):
    chat_server.enqueue(tool_call_reply("lookup", ['{"n"', ": 7}"], call_id="call_x", text="Sure."))
    with OpenAI(base_url=chat_server.base_url, api_key="unused") as client:
        stream = client.chat.completions.create(
            model=CHAT_MODEL,
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    arguments = "".join(
        call.function.arguments or "" for c in chunks if c.choices for call in c.choices[0].delta.tool_calls or []
    )
    assert text == "Sure." and json.loads(arguments) == {"n": 7}
    assert chunks[-1].usage.prompt_tokens == 11 and chunks[-1].usage.prompt_tokens_details.cached_tokens == 3


# --- normal turns through the shim ---------------------------------------------------------------


async def test_a_text_stream_becomes_output_text_events_with_the_backends_usage(make_server, chat_server, recorder):
    shim = make_server(backend=chat_server.base_url, validators=[recorder])  # the `--backend URL` path
    chat_server.enqueue(text_reply("Hel", "lo", " world"))
    async with AsyncOpenAI(base_url=shim.base_url, api_key=API_KEY) as sdk, sdk.responses.connect() as conn:
        turn = await run_turn(conn, model=CHAT_MODEL, input="hi", store=False)
    completed_ok(turn)
    deltas = [e["delta"] for e in turn.events if e["type"] == "response.output_text.delta"]
    assert deltas == ["Hel", "lo", " world"]
    assert turn.text == "Hello world"
    usage = turn.response["usage"]
    assert (usage["input_tokens"], usage["output_tokens"], usage["input_tokens_details"]["cached_tokens"]) == (11, 7, 3)
    assert usage["total_tokens"] == 18


async def test_tool_call_deltas_split_across_chunks_become_one_function_call_item(sdk, chat_server):
    chat_server.enqueue(tool_call_reply("lookup", ['{"n"', ": ", "7}"], call_id="call_abc"))
    async with sdk.responses.connect() as conn:
        turn = await run_turn(conn, model=CHAT_MODEL, input="look up 7", tools=[LOOKUP_TOOL], store=False)
    completed_ok(turn)
    pieces = [e["delta"] for e in turn.events if e["type"] == "response.function_call_arguments.delta"]
    assert pieces == ['{"n"', ": ", "7}"]
    (item,) = turn.response["output"]
    assert item["type"] == "function_call"
    assert (item["call_id"], item["name"], item["arguments"]) == ("call_abc", "lookup", '{"n": 7}')
    added = next(e for e in turn.events if e["type"] == "response.output_item.added")
    assert added["item"]["name"] == "lookup" and added["item"]["status"] == "in_progress"


async def test_text_then_a_tool_call_gives_a_message_item_then_a_function_call_item(sdk, chat_server):
    chat_server.enqueue(tool_call_reply("lookup", ["{}"], call_id="call_t", text="Let me check."))
    async with sdk.responses.connect() as conn:
        turn = await run_turn(conn, model=CHAT_MODEL, input="hi", tools=[LOOKUP_TOOL], store=False)
    completed_ok(turn)
    assert [item["type"] for item in turn.response["output"]] == ["message", "function_call"]
    assert [e["output_index"] for e in turn.events if e["type"] == "response.output_item.done"] == [0, 1]


async def test_finish_reason_length_ends_with_response_incomplete(sdk, chat_server):
    chat_server.enqueue(text_reply("trunc", finish_reason="length"))
    async with sdk.responses.connect() as conn:
        turn = await run_turn(conn, model=CHAT_MODEL, input="hi", max_output_tokens=1, store=False)
        assert turn.types[-1] == "response.incomplete"
        assert turn.response["incomplete_details"] == {"reason": "max_output_tokens"}
        follow = await run_turn(
            conn, model=CHAT_MODEL, input=[user("go on")], previous_response_id=turn.id, store=False
        )
        completed_ok(follow)


async def test_every_turn_reuses_one_pooled_backend_connection(sdk, chat_server):
    """The stream is read to its last byte after `[DONE]`, so HTTP/1.1 keeps the connection for the next turn."""
    async with sdk.responses.connect() as conn:
        previous = None
        for n in range(3):
            turn = await run_turn(
                conn, model=CHAT_MODEL, input=[user(f"turn {n}")], previous_response_id=previous, store=False
            )
            completed_ok(turn)
            previous = turn.id
    for n in range(2):
        await sdk.responses.create(model=CHAT_MODEL, input=f"http {n}", store=False)
    peers = [received.peer for received in chat_server.received]
    assert len(peers) == 5 and len(set(peers)) == 1, peers


async def test_a_body_left_open_after_done_does_not_hold_the_turn(sdk, chat_server):
    """Reading past `[DONE]` is bounded: the turn ends at once, the connection is dropped, the next turn connects anew."""
    lingering = text_reply("slow", " end")
    lingering.linger_s = 5.0
    chat_server.enqueue(lingering)
    async with sdk.responses.connect() as conn:
        started = time.monotonic()
        turn = await run_turn(conn, model=CHAT_MODEL, input=[user("hi")], store=False)
        assert time.monotonic() - started < lingering.linger_s / 2
        completed_ok(turn)
        follow = await run_turn(
            conn, model=CHAT_MODEL, input=[user("again")], previous_response_id=turn.id, store=False
        )
        completed_ok(follow)
    first, second = (received.peer for received in chat_server.received)
    assert first != second


async def test_the_backend_gets_documented_chat_requests_and_the_history_grows_by_appending(sdk, chat_server, recorder):
    chat_server.enqueue(
        tool_call_reply("lookup", ['{"n": 1}'], call_id="call_1"), text_reply("Found it."), text_reply("Bye.")
    )
    async with sdk.responses.connect() as conn:
        first = await run_turn(
            conn,
            model=CHAT_MODEL,
            instructions="Be brief.",
            input=[user("find 1")],
            tools=[LOOKUP_TOOL],
            max_output_tokens=50,
            temperature=0.5,
            store=False,
        )
        second = await run_turn(
            conn,
            model=CHAT_MODEL,
            instructions="Be brief.",
            input=[{"type": "function_call_output", "call_id": "call_1", "output": "record 1"}],
            tools=[LOOKUP_TOOL],
            previous_response_id=first.id,
            store=False,
        )
        third = await run_turn(
            conn,
            model=CHAT_MODEL,
            instructions="Be brief.",
            input=[user("thanks")],
            tools=[LOOKUP_TOOL],
            previous_response_id=second.id,
            store=False,
        )
    completed_ok(third)
    assert recorder.last.items == [user("thanks")]
    bodies = chat_server.bodies
    assert len(bodies) == 3
    for body in bodies:
        assert body["model"] == CHAT_MODEL and body["stream"] is True
        assert body["stream_options"] == {"include_usage": True}
        for message in body["messages"]:
            MESSAGE.validate_python(message)
        for tool in body["tools"]:
            CHAT_TOOL.validate_python(tool)
    assert bodies[0]["max_tokens"] == 50 and bodies[0]["temperature"] == 0.5
    assert bodies[0]["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "lookup",
                "description": LOOKUP_TOOL["description"],
                "parameters": LOOKUP_TOOL["parameters"],
            },
        }
    ]
    assert [m["role"] for m in bodies[2]["messages"]] == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert bodies[2]["messages"][2]["tool_calls"][0]["id"] == "call_1"
    assert bodies[2]["messages"][3] == {"role": "tool", "tool_call_id": "call_1", "content": "record 1"}
    # append-only: each request's message array is a byte prefix of the next one's (prefix caches hit)
    arrays = [raw.raw[raw.raw.index(b'"messages":') :].rstrip(b"}") for raw in chat_server.received]
    assert arrays[1].startswith(arrays[0][:-1]) and arrays[2].startswith(arrays[1][:-1])


async def test_a_warm_up_calls_no_backend_and_its_items_lead_the_next_prompt(sdk, chat_server):
    async with sdk.responses.connect() as conn:
        warm = await run_turn(
            conn,
            model=CHAT_MODEL,
            input=[{"type": "message", "role": "developer", "content": "Context."}],
            generate=False,
            store=False,
        )
        assert chat_server.received == []
        turn = await run_turn(conn, model=CHAT_MODEL, input=[user("go")], previous_response_id=warm.id, store=False)
    completed_ok(turn)
    assert chat_server.bodies[0]["messages"] == [
        {"role": "system", "content": "Context."},
        {"role": "user", "content": "go"},
    ]


async def test_models_come_from_the_backend(sdk, chat_server):
    models = await sdk.models.list()
    assert [m.id for m in models.data] == [CHAT_MODEL]


async def test_the_backend_api_key_is_sent_to_the_backend(make_server, chat_server):
    shim = make_server(backend=chat_server.base_url, backend_api_key="sk-backend")
    async with AsyncOpenAI(base_url=shim.base_url, api_key=API_KEY) as sdk:
        await sdk.responses.create(model=CHAT_MODEL, input="hi", store=False)
    assert chat_server.received[0].headers["authorization"] == "Bearer sk-backend"


# --- backend failures over WebSocket -------------------------------------------------------------

FAULTS = [
    pytest.param("http_500", 502, "backend_error", id="http-500"),
    pytest.param("http_429", 429, "rate_limit_exceeded", id="http-429"),
    pytest.param("cut", 502, "backend_error", id="stream-cut"),
    pytest.param("abort", 502, "backend_error", id="connection-dropped"),
    pytest.param("malformed", 502, "backend_error", id="malformed-chunk"),
]


@pytest.mark.parametrize(("fault", "status", "code"), FAULTS)
async def test_a_backend_failure_gives_response_failed_then_error_and_evicts_the_parent(
    sdk, shim, chat_server, recorder, fault, status, code
):
    async with sdk.responses.connect() as conn:
        parent = await run_turn(conn, model=CHAT_MODEL, input=[user("first")], store=False)
        completed_ok(parent)
        cache = only_connection(shim).cache
        assert parent.id in cache

        chat_server.enqueue(fault_reply(fault, cut_after=3, retry_after="0.05"))
        failed = await run_turn(
            conn, model=CHAT_MODEL, input=[user("second")], previous_response_id=parent.id, store=False
        )
        assert failed.types[-2:] == ["response.failed", "error"]
        assert failed.types[0] == "response.created"
        response = failed.response
        error = failed.error
        assert error["status"] == status and error["error"]["code"] == code
        assert response["status"] == "failed" and response["error"]["code"] == code, "the same code in both"
        if fault in ("cut", "abort", "malformed"):
            # what streamed before the cut is reported, closed as incomplete
            (item,) = response["output"]
            assert item["status"] == "incomplete" and item["content"][0]["text"].startswith("partial")
        assert parent.id not in cache, "a failed turn evicts the previous_response_id it referenced"
        assert failed.id not in cache

        gone = await run_turn(
            conn, model=CHAT_MODEL, input=[user("retry")], previous_response_id=parent.id, store=False
        )
        assert gone.error["error"]["code"] == "previous_response_not_found"

        await _wait_for_breaker()
        fresh = await run_turn(conn, model=CHAT_MODEL, input=[user("first"), user("retry")], store=False)
        completed_ok(fresh)
        chained = await run_turn(
            conn, model=CHAT_MODEL, input=[user("more")], previous_response_id=fresh.id, store=False
        )
        completed_ok(chained)
        assert recorder.last.items == [user("more")]


async def _wait_for_breaker() -> None:
    await asyncio.sleep(0.06)  # the routing cooldown of `chat_config`, and the 429's retry-after


async def test_an_unreachable_backend_fails_the_turn_and_the_connection_stays_usable(make_server, recorder):
    shim = make_server(config=chat_config(f"http://127.0.0.1:{closed_port()}/v1"), validators=[recorder])
    async with AsyncOpenAI(base_url=shim.base_url, api_key=API_KEY) as sdk, sdk.responses.connect() as conn:
        warm = await run_turn(conn, model=CHAT_MODEL, input=[user("context")], generate=False, store=False)
        completed_ok(warm)
        failed = await run_turn(conn, model=CHAT_MODEL, input=[user("go")], previous_response_id=warm.id, store=False)
        assert failed.types[-2:] == ["response.failed", "error"]
        assert failed.error["status"] == 502 and failed.error["error"]["code"] == "backend_error"
        assert failed.error["error"]["type"] == "server_error"
        assert warm.id not in only_connection(shim).cache
        again = await run_turn(conn, model=CHAT_MODEL, input=[user("go")], previous_response_id=warm.id, store=False)
        assert again.error["error"]["code"] == "previous_response_not_found"
        still = await run_turn(conn, model=CHAT_MODEL, input=[user("context")], generate=False, store=False)
        completed_ok(still)


async def test_a_failure_on_a_lane_is_reported_on_that_lane(sdk, chat_server):
    chat_server.enqueue(fault_reply("http_500"))
    async with sdk.responses.connect() as conn:
        failed = await run_turn(conn, model=CHAT_MODEL, input="hi", stream_id="lane-x", store=False)
    assert failed.types[-2:] == ["response.failed", "error"]
    assert all(e["stream_id"] == "lane-x" for e in failed.events)


# --- backend failures over HTTP ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "exception", "status", "code"),
    [
        ("http_500", openai.InternalServerError, 502, "backend_error"),
        ("http_429", openai.RateLimitError, 429, "rate_limit_exceeded"),
        ("cut", openai.InternalServerError, 502, "backend_error"),
        ("abort", openai.InternalServerError, 502, "backend_error"),
    ],
)
async def test_a_backend_failure_over_http_is_an_error_status_for_the_sdk(
    sdk, chat_server, fault, exception, status, code
):
    chat_server.enqueue(fault_reply(fault))
    with pytest.raises(exception) as raised:
        await sdk.responses.create(model=CHAT_MODEL, input="hi", store=False)
    assert raised.value.status_code == status
    assert raised.value.code == code


@pytest.mark.parametrize("fault", ["http_500", "cut"])
def test_a_backend_failure_mid_sse_ends_with_response_failed_then_a_flat_error_event(shim, chat_server, fault):
    chat_server.enqueue(fault_reply(fault))
    reply = httpx2.post(
        shim.base_url + "/responses",
        json={"model": CHAT_MODEL, "input": "hi", "stream": True, "store": False},
        headers={"authorization": f"Bearer {API_KEY}"},
        timeout=10,
    )
    assert reply.status_code == 200
    events = sse_events(reply.content)  # each validated as the SDK's ResponseStreamEvent
    assert [e["type"] for e in events][-2:] == ["response.failed", "error"]
    assert events[-1]["code"] == "backend_error" and events[-1]["message"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))


async def test_the_sdk_stream_yields_the_failure_events(sdk, chat_server):
    chat_server.enqueue(fault_reply("cut"))
    stream = await sdk.responses.create(model=CHAT_MODEL, input="hi", stream=True, store=False)
    types = [event.type async for event in stream]
    assert types[-2:] == ["response.failed", "error"]


async def test_an_unreachable_backend_over_http_is_a_502(make_server):
    shim = make_server(config=chat_config(f"http://127.0.0.1:{closed_port()}/v1"))
    async with AsyncOpenAI(base_url=shim.base_url, api_key=API_KEY, max_retries=0) as sdk:
        with pytest.raises(openai.InternalServerError) as raised:
            await sdk.responses.create(model=CHAT_MODEL, input="hi", store=False)
    assert raised.value.status_code == 502 and raised.value.code == "backend_error"


def test_the_chat_server_records_what_it_got():
    with ChatServer() as chat:
        httpx2.post(chat.base_url + "/chat/completions", json={"model": "m", "messages": [], "stream": False})
    assert chat.bodies == [{"model": "m", "messages": [], "stream": False}]


# --- logprobs ---------------------------------------------------------------------------------------


def test_the_test_servers_logprobs_validate_as_the_sdks_chunks():
    for chunk in text_reply("Hel", "lo").chunks(include_usage=True, top_logprobs=2):
        ChatCompletionChunk.model_validate(chunk)


LOGPROBS = {"include": ["message.output_text.logprobs"], "top_logprobs": 2}


def expected_logprobs(*tokens: str) -> list[dict]:
    return [
        {
            "token": token,
            "bytes": list(token.encode()),
            "logprob": -0.25,
            "top_logprobs": [
                {"token": token, "bytes": list(token.encode()), "logprob": -0.25},
                {"token": "else", "bytes": list(b"else"), "logprob": -2.5},
            ],
        }
        for token in tokens
    ]


async def test_logprobs_asked_for_reach_the_deltas_the_done_event_and_the_output_text(sdk, chat_server):
    chat_server.enqueue(text_reply("Hel", "lo"))
    async with sdk.responses.connect() as conn:
        turn = await run_turn(conn, model=CHAT_MODEL, input="hi", store=False, **LOGPROBS)
    completed_ok(turn)
    assert chat_server.bodies[-1]["logprobs"] is True and chat_server.bodies[-1]["top_logprobs"] == 2
    deltas = [e for e in turn.events if e["type"] == "response.output_text.delta"]
    assert [d["logprobs"] for d in deltas] == [expected_logprobs("Hel"), expected_logprobs("lo")]
    (done,) = [e for e in turn.events if e["type"] == "response.output_text.done"]
    assert done["logprobs"] == expected_logprobs("Hel", "lo")
    assert turn.response["output"][0]["content"][0]["logprobs"] == expected_logprobs("Hel", "lo")


async def test_logprobs_over_http_parse_as_the_sdks_types(sdk, chat_server):
    chat_server.enqueue(text_reply("Hel", "lo"), text_reply("Hel", "lo"))
    response = await sdk.responses.create(model=CHAT_MODEL, input="hi", **LOGPROBS)
    logprobs = response.output[0].content[0].logprobs
    assert [(p.token, p.logprob, [t.token for t in p.top_logprobs]) for p in logprobs] == [
        ("Hel", -0.25, ["Hel", "else"]),
        ("lo", -0.25, ["lo", "else"]),
    ]
    stream = await sdk.responses.create(model=CHAT_MODEL, input="hi", stream=True, **LOGPROBS)
    deltas = [event async for event in stream if event.type == "response.output_text.delta"]
    assert [d.logprobs[0].top_logprobs[1].token for d in deltas] == ["else", "else"]


async def test_without_logprobs_asked_for_none_are_asked_and_the_lists_stay_empty(sdk, chat_server):
    chat_server.enqueue(text_reply("Hel", "lo"))
    response = await sdk.responses.create(model=CHAT_MODEL, input="hi")
    assert "logprobs" not in chat_server.bodies[-1]
    assert response.output[0].content[0].logprobs == []


@pytest.mark.parametrize("base", ["http://h:1/v1", "http://h:1/v1/", "http://user:pw@h:1/a/b", "http://h:1"])
async def test_the_endpoints_made_once_are_the_urls_the_client_would_merge_each_request(base):
    """The chat and responses backends pass their endpoint as an absolute URL made at start-up (`endpoint`): the
    same URL the client makes from the relative path on every request, for any base URL."""
    from server_shim.backends.openai_compatible import OpenAICompatibleBackend
    from server_shim.backends.responses_passthrough import ResponsesPassthroughBackend

    chat, responses = OpenAICompatibleBackend(base), ResponsesPassthroughBackend(base)
    for backend, url, path in (
        (chat, chat._completions, "/chat/completions"),
        (responses, responses._responses, "/responses"),
    ):
        assert url == backend._client.build_request("POST", path).url
        assert str(url) == base.rstrip("/") + path
        await backend.aclose()
