"""HTTP on the same app: `POST/GET/DELETE /v1/responses`, `/v1/models`, `/healthz`, with the official SDK."""

from __future__ import annotations

import json

import httpx2
import openai
import pytest
from support.wire import (
    API_KEY,
    LOOKUP_TOOL,
    MODEL,
    RESPONSE,
    completed_ok,
    recv_event,
    run_turn,
    sse_events,
    user,
)


def post(server, body, **kwargs) -> httpx2.Response:
    content = body if isinstance(body, (str, bytes)) else json.dumps(body)
    headers = {"authorization": f"Bearer {API_KEY}", "content-type": "application/json"}
    return httpx2.post(server.base_url + "/responses", content=content, headers=headers, timeout=10, **kwargs)


async def test_non_streaming_create_returns_the_response_object(client, server, recorder):
    response = await client.responses.create(model=MODEL, input="hello", store=False)
    assert response.status == "completed"
    assert response.object == "response" and response.id.startswith("resp_")
    assert "simulat" in response.output_text
    assert response.usage.output_tokens == 16
    assert recorder.last.items == [{"type": "message", "role": "user", "content": "hello"}]


def test_non_streaming_body_parses_strictly_as_a_response(server):
    reply = post(server, {"model": MODEL, "input": "hello", "store": False})
    assert reply.status_code == 200
    assert reply.headers["content-type"] == "application/json"
    RESPONSE.validate_python(reply.json())


async def test_streaming_create_yields_the_sdk_event_sequence(client, server):
    stream = await client.responses.create(model=MODEL, input="hello", stream=True, store=False)
    types = [event.type async for event in stream]
    assert types[0] == "response.created" and types[-1] == "response.completed"
    assert "response.output_text.delta" in types


def test_streaming_frames_name_their_type_and_parse_strictly(server):
    reply = post(server, {"model": MODEL, "input": 'call lookup {"n": 1}', "tools": [LOOKUP_TOOL], "stream": True})
    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("text/event-stream")
    events = sse_events(reply.content)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    types = [e["type"] for e in events]
    assert types[0] == "response.created" and types[-1] == "response.completed"
    assert "response.function_call_arguments.delta" in types
    RESPONSE.validate_python(events[-1]["response"])


def test_the_sync_client_works_too(sync_client):
    response = sync_client.responses.create(model=MODEL, input="hello", store=False)
    assert response.status == "completed"


async def test_http_chains_through_stored_responses_with_only_new_items(client, server, recorder):
    first = await client.responses.create(model=MODEL, input=[user("one")])
    second = await client.responses.create(model=MODEL, input=[user("two")], previous_response_id=first.id)
    assert second.previous_response_id == first.id
    assert recorder.last.items == [user("two")]
    assert recorder.last.previous_id == first.id


async def test_a_warm_up_over_http_can_be_chained_over_http_and_websocket(client, server, recorder):
    warm = await client.responses.create(
        model=MODEL, input=[user("context")], tools=[LOOKUP_TOOL], extra_body={"generate": False}
    )
    assert warm.status == "completed" and warm.output == [] and warm.usage is None
    over_http = await client.responses.create(model=MODEL, input=[user("next")], previous_response_id=warm.id)
    assert over_http.status == "completed"
    async with client.responses.connect() as conn:
        turn = await run_turn(conn, input=[user("over ws")], previous_response_id=warm.id, store=False)
    assert turn.response["status"] == "completed"
    assert recorder.last.items == [user("over ws")] and recorder.last.previous_id == warm.id


# --- stored responses ----------------------------------------------------------------------------


async def test_a_stored_response_can_be_retrieved_and_deleted(client, server):
    created = await client.responses.create(model=MODEL, input="keep this", store=True)
    fetched = await client.responses.retrieve(created.id)
    assert fetched.id == created.id and fetched.output_text == created.output_text
    RESPONSE.validate_python(
        httpx2.get(f"{server.base_url}/responses/{created.id}", headers={"authorization": f"Bearer {API_KEY}"}).json()
    )
    await client.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError) as missing:
        await client.responses.retrieve(created.id)
    assert missing.value.code == "response_not_found"
    with pytest.raises(openai.NotFoundError):
        await client.responses.delete(created.id)


def test_delete_answers_with_a_deletion_object(server):
    created = post(server, {"model": MODEL, "input": "x"}).json()
    reply = httpx2.delete(
        f"{server.base_url}/responses/{created['id']}", headers={"authorization": f"Bearer {API_KEY}"}
    )
    assert reply.status_code == 200
    assert reply.json() == {"id": created["id"], "object": "response", "deleted": True}


async def test_an_unstored_response_cannot_be_retrieved(client, server):
    created = await client.responses.create(model=MODEL, input="forget this", store=False)
    with pytest.raises(openai.NotFoundError) as missing:
        await client.responses.retrieve(created.id)
    assert missing.value.param == "response_id"


async def test_a_response_stored_over_websocket_is_retrievable_over_http(client, server):
    async with client.responses.connect() as conn:
        turn = await run_turn(conn, input="over ws", store=True)
    fetched = await client.responses.retrieve(turn.id)
    assert fetched.output_text == turn.text


# --- models and health ---------------------------------------------------------------------------


async def test_models_lists_the_backend_models(client, server):
    models = await client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert all(m.object == "model" for m in models.data)


def test_healthz_reports_ok_without_auth(server):
    reply = httpx2.get(server.base_url.removesuffix("/v1") + "/healthz")
    assert reply.status_code == 200
    body = reply.json()
    assert body["status"] == "ok" and body["connections"] == 0


# --- bad input: status and error JSON ------------------------------------------------------------

BAD_BODIES = [
    pytest.param("{not json", 400, "invalid_json", None, id="malformed-json"),
    pytest.param("[1, 2]", 400, "invalid_type", None, id="array-body"),
    pytest.param({"input": "hi"}, 400, "missing_required_parameter", "model", id="missing-model"),
    pytest.param(
        {"model": MODEL, "input": "hi", "background": True}, 400, "unsupported_parameter", "background", id="background"
    ),
    pytest.param(
        {"model": MODEL, "input": "hi", "stream_id": "a"}, 400, "unsupported_parameter", "stream_id", id="stream-id"
    ),
    pytest.param(
        {"model": MODEL, "input": "hi", "previous_response_id": "resp_nope"},
        400,
        "previous_response_not_found",
        "previous_response_id",
        id="unknown-previous-response-id",
    ),
    pytest.param({"model": MODEL, "input": 5}, 400, "invalid_value", "input", id="input-not-list"),
    pytest.param({"model": MODEL, "input": [3]}, 400, "invalid_type", "input[0]", id="item-not-object"),
    pytest.param(
        {"model": MODEL, "input": [{"role": "robot", "content": "x"}]},
        400,
        "invalid_value",
        "input[0].role",
        id="bad-role",
    ),
    pytest.param(
        {"model": MODEL, "input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]},
        400,
        "tool_output_without_call",
        "input[0].call_id",
        id="tool-output-without-call",
    ),
    pytest.param(
        {"model": MODEL, "input": [{"type": "item_reference", "id": "msg_nope"}]},
        404,
        "item_not_found",
        "input[0].id",
        id="unknown-item-reference",
    ),
    pytest.param(
        {"model": MODEL, "input": "hi", "tools": [{"type": "function"}]},
        400,
        "missing_required_parameter",
        "tools[0].name",
        id="tool-without-name",
    ),
    pytest.param(
        {"model": MODEL, "input": "hi", "tools": [LOOKUP_TOOL], "tool_choice": {"type": "function", "name": "nope"}},
        400,
        "invalid_value",
        "tool_choice",
        id="tool-choice-unknown-function",
    ),
    pytest.param({"model": MODEL, "input": "hi", "top_p": 3}, 400, "invalid_value", "top_p", id="top-p-out-of-range"),
]


@pytest.mark.parametrize(("body", "status", "code", "param"), BAD_BODIES)
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_bad_input_gets_the_matching_status_and_error_json(server, recorder, body, status, code, param, stream):
    anchor = post(server, {"model": MODEL, "input": [user("anchor")]}).json()
    if isinstance(body, dict) and stream:
        body = {**body, "stream": True}
    reply = post(server, body)
    assert reply.status_code == status
    assert reply.headers["content-type"] == "application/json"
    error = reply.json()["error"]
    assert error["code"] == code
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"
    assert error["message"]
    # nothing was lost: the stored anchor still chains
    follow = post(server, {"model": MODEL, "input": [user("after")], "previous_response_id": anchor["id"]})
    assert follow.status_code == 200
    assert recorder.last.items == [user("after")] and recorder.last.previous_id == anchor["id"]


async def test_the_sdk_raises_bad_request_with_the_code_and_param(client, server):
    with pytest.raises(openai.BadRequestError) as refused:
        await client.responses.create(model=MODEL, input="hi", previous_response_id="resp_missing")
    assert refused.value.status_code == 400
    assert refused.value.code == "previous_response_not_found"
    assert refused.value.param == "previous_response_id"
    with pytest.raises(openai.BadRequestError) as background:
        await client.responses.create(model=MODEL, input="hi", background=True)
    assert background.value.code == "unsupported_parameter"
    with pytest.raises(openai.BadRequestError) as streaming:
        await client.responses.create(model=MODEL, input=[{"role": "robot", "content": "x"}], stream=True)
    assert streaming.value.param == "input[0].role"


async def test_an_unknown_model_is_refused_with_the_served_models_named(client):
    """An app left on `gpt-4o` learns from the error what to ask for instead (or to set `default_model`)."""
    with pytest.raises(openai.NotFoundError) as missing:
        await client.responses.create(model="gpt-4o", input="hello", store=False)
    assert missing.value.code == "model_not_found"
    assert missing.value.param == "model"
    assert "'gpt-4o' does not exist; this server serves: " + MODEL in missing.value.message
    served = [m.id async for m in client.models.list()]
    assert served == [MODEL]


# --- chaining from a response that is still streaming ---------------------------------------------


@pytest.fixture
async def slow(make_server):
    """A server whose simulated answers take about a second (16 tokens at 16/s)."""
    server = make_server(simulated_tokens_per_s=16.0)
    async with openai.AsyncOpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0) as sdk:
        yield sdk


async def test_chaining_over_http_from_a_stored_response_still_streaming_is_a_409_then_works(slow):
    stream = await slow.responses.create(model=MODEL, input="hello", stream=True)
    parent = (await anext(stream)).response.id
    with pytest.raises(openai.ConflictError) as early:
        await slow.responses.create(model=MODEL, input="and then?", previous_response_id=parent)
    assert (early.value.code, early.value.param) == ("previous_response_in_progress", "previous_response_id")
    assert [event.type async for event in stream][-1] == "response.completed"
    follow = await slow.responses.create(model=MODEL, input="and then?", previous_response_id=parent)
    assert follow.previous_response_id == parent and follow.status == "completed"


async def test_chaining_from_a_response_streaming_on_another_websocket_is_a_409_on_both_paths(slow):
    async with slow.responses.connect() as streaming, slow.responses.connect() as other:
        await streaming.response.create(model=MODEL, input="hello")
        parent = (await recv_event(streaming))["response"]["id"]
        refused = await run_turn(other, input=[user("and then?")], previous_response_id=parent)
        assert refused.error is not None and refused.error["status"] == 409
        assert refused.error["error"]["code"] == "previous_response_in_progress"
        with pytest.raises(openai.ConflictError):
            await slow.responses.create(model=MODEL, input="and then?", previous_response_id=parent)
        while (await recv_event(streaming))["type"] != "response.completed":
            pass
        completed_ok(await run_turn(other, input=[user("and then?")], previous_response_id=parent))


async def test_a_response_streaming_with_store_false_elsewhere_is_not_found_not_in_progress(slow):
    async with slow.responses.connect() as streaming:
        await streaming.response.create(model=MODEL, input="hello", store=False)
        parent = (await recv_event(streaming))["response"]["id"]
        with pytest.raises(openai.BadRequestError) as missing:  # it will never be found here: 409 would say "wait"
            await slow.responses.create(model=MODEL, input="and then?", previous_response_id=parent)
        assert missing.value.code == "previous_response_not_found"


async def test_logprobs_asked_of_the_simulator_come_back_as_empty_lists(client):
    stream = await client.responses.create(
        model=MODEL, input="hello", stream=True, include=["message.output_text.logprobs"], top_logprobs=3
    )
    events = [event async for event in stream]
    assert all(e.logprobs == [] for e in events if e.type == "response.output_text.delta")
    assert events[-1].response.output[0].content[0].logprobs == []
