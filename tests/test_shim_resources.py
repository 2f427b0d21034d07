"""The HTTP resources beyond create, through the official SDK: input items, cancel, input tokens, compact, errors."""

from __future__ import annotations

import httpx
import openai
import pytest
from support.wire import API_KEY, LOOKUP_TOOL, MODEL, user


async def test_input_items_list_pages_through_the_sdk(client, server):
    items = [user(f"message {n}") for n in range(5)]
    response = await client.responses.create(model=MODEL, input=items)
    first = await client.responses.input_items.list(response.id, limit=2, order="asc")
    assert [item.content[0].text for item in first.data] == ["message 0", "message 1"]
    assert first.has_more
    everything = [item async for item in client.responses.input_items.list(response.id, limit=2, order="asc")]
    assert [item.content[0].text for item in everything] == [f"message {n}" for n in range(5)]


async def test_cancel_refuses_a_response_that_was_not_background_and_an_unknown_one(client, server):
    response = await client.responses.create(model=MODEL, input="hi")
    with pytest.raises(openai.BadRequestError) as refused:
        await client.responses.cancel(response.id)
    assert refused.value.code == "response_not_cancellable"
    with pytest.raises(openai.NotFoundError) as unknown:
        await client.responses.cancel("resp_nope")
    assert unknown.value.code == "response_not_found"


async def test_input_tokens_count_grows_with_the_conversation_and_its_tools(client, server):
    short = await client.responses.input_tokens.count(model=MODEL, input="hi")
    assert short.object == "response.input_tokens" and short.input_tokens >= 1
    longer = await client.responses.input_tokens.count(model=MODEL, input="hi " * 200, tools=[LOOKUP_TOOL])
    assert longer.input_tokens > short.input_tokens + 100
    first = await client.responses.create(model=MODEL, input="hi " * 200)
    chained = await client.responses.input_tokens.count(model=MODEL, input="more", previous_response_id=first.id)
    assert chained.input_tokens > longer.input_tokens - 20


async def test_input_tokens_count_refuses_bad_input_with_a_specific_code(client, server):
    with pytest.raises(openai.BadRequestError) as refused:
        await client.responses.input_tokens.count(model=MODEL, previous_response_id="resp_nope", input="x")
    assert refused.value.code == "previous_response_not_found"


async def test_compact_returns_user_messages_and_one_compaction_that_continues_the_conversation(client, server):
    first = await client.responses.create(model=MODEL, input="remember the word heron")
    compacted = await client.responses.compact(model=MODEL, previous_response_id=first.id, input="and then?")
    assert compacted.object == "response.compaction"
    kinds = [item.type for item in compacted.output]
    assert kinds == ["message", "message", "compaction"]
    assert compacted.output[0].content[0].text == "remember the word heron"
    assert compacted.usage.input_tokens > 0

    replay = [item.model_dump(exclude_none=True) for item in compacted.output]
    count_replayed = await client.responses.input_tokens.count(model=MODEL, input=replay)
    count_chained = await client.responses.input_tokens.count(
        model=MODEL, previous_response_id=first.id, input="and then?"
    )
    assert count_replayed.input_tokens == count_chained.input_tokens, "the compaction stands for the whole conversation"
    continued = await client.responses.create(model=MODEL, input=[*replay, user("go on")])
    assert continued.status == "completed"


async def test_a_damaged_compaction_item_is_refused(client, server):
    damaged = {"type": "compaction", "encrypted_content": "responses-ws.v1:%%%"}
    with pytest.raises(openai.BadRequestError) as refused:
        await client.responses.create(model=MODEL, input=[damaged])
    assert refused.value.code == "invalid_encrypted_content"


@pytest.mark.parametrize(
    ("method", "path", "status", "code"),
    [
        ("GET", "/v1/nothing-here", 404, "not_found"),
        ("PUT", "/v1/responses", 405, "method_not_allowed"),
        ("PATCH", "/v1/responses/resp_1", 405, "method_not_allowed"),
        ("GET", "/v1/responses/resp_1/cancel", 405, "method_not_allowed"),
    ],
)
def test_unknown_routes_and_methods_answer_with_a_json_error(server, method, path, status, code):
    answer = httpx.request(
        method, server.base_url.removesuffix("/v1") + path, headers={"authorization": f"Bearer {API_KEY}"}
    )
    assert answer.status_code == status
    assert answer.headers["content-type"] == "application/json"
    error = answer.json()["error"]
    assert error["code"] == code and error["type"] == "invalid_request_error" and path in error["message"]


async def test_input_items_after_an_unknown_item_is_item_not_found(client, server):
    response = await client.responses.create(model=MODEL, input=[user("a"), user("b")])
    with pytest.raises(openai.NotFoundError) as refused:
        await client.responses.input_items.list(response.id, after="nope")
    assert refused.value.code == "item_not_found" and refused.value.body["param"] == "after"
    last = (await client.responses.input_items.list(response.id, order="asc")).data[-1].id
    assert (await client.responses.input_items.list(response.id, after=last, order="asc")).data == []
