"""Compaction items are input: signed by the server (a forged one is refused), bound to the caller's tenant,
and what they expand to is held to the request limits; the other POST routes read bodies bounded and answer JSON."""

from __future__ import annotations

import base64
from typing import Any

import httpx2
import orjson
import pytest
from openai import AsyncOpenAI
from support.wire import API_KEY, MODEL, completed_ok, run_turn, user

from server_shim.compaction import COMPACTION_PREFIX, pack
from server_shim.state import MemoryResponseStore

AUTH = {"Authorization": f"Bearer {API_KEY}"}
SECRET = "compaction-test-secret"
ROUTES = ["/responses", "/responses/input_tokens", "/responses/compact"]


def nested(depth: int) -> Any:
    value: Any = "deep"
    for _ in range(depth):
        value = [value]
    return value


def forged(items: list[dict[str, Any]]) -> dict[str, Any]:
    """What the server signed before: base64 JSON and nothing else."""
    return {
        "type": "compaction",
        "encrypted_content": COMPACTION_PREFIX + base64.b64encode(orjson.dumps(items)).decode(),
    }


def signed(items: list[dict[str, Any]], secret: str = SECRET, tenant: str | None = None) -> dict[str, Any]:
    return {"type": "compaction", "encrypted_content": pack(items, secret.encode(), tenant)}


async def post_all(server: Any, body: dict[str, Any], headers: dict[str, str] = AUTH) -> list[httpx2.Response]:
    async with httpx2.AsyncClient(base_url=server.base_url) as http:
        return [await http.post(route, json={"model": MODEL, **body}, headers=headers) for route in ROUTES]


def assert_refused(answers: list[httpx2.Response], code: str, param: str, status: int = 400) -> None:
    for answer in answers:
        assert answer.status_code == status, answer.text
        error = answer.json()["error"]
        assert (error["code"], error["param"]) == (code, param), error


@pytest.mark.parametrize(
    "item",
    [
        forged([user("hi")]),
        {"type": "compaction", "encrypted_content": signed([user("hi")])["encrypted_content"] + "0"},
        signed([user("hi")], secret="another-secret"),
    ],
    ids=["unsigned", "bad-signature", "other-key"],
)
async def test_a_compaction_item_the_server_did_not_sign_is_refused_on_every_route(make_server, item):
    server = make_server(compaction_secret=SECRET)
    assert_refused(await post_all(server, {"input": [item]}), "invalid_encrypted_content", "input[0].encrypted_content")


async def test_a_compaction_item_expanding_past_the_depth_limit_is_400_and_the_connection_chains_on(make_server):
    server = make_server(compaction_secret=SECRET)
    deep = signed([{"type": "message", "role": "user", "content": [{"type": "input_text", "text": nested(200)}]}])
    assert_refused(await post_all(server, {"input": [deep]}), "invalid_value", "input[0]")
    async with AsyncOpenAI(base_url=server.base_url, api_key=API_KEY) as sdk, sdk.responses.connect() as conn:
        first = await run_turn(conn, input="hi")
        completed_ok(first)
        turn = await run_turn(conn, input=[deep], previous_response_id=first.id)
        assert turn.error is not None and turn.error["error"]["code"] == "invalid_value"
        completed_ok(await run_turn(conn, input="again", previous_response_id=first.id))


async def test_a_compaction_item_expanding_past_the_item_limits_is_refused(make_server):
    server = make_server(compaction_secret=SECRET, max_input_items=10, max_item_references=2)
    many = signed([user(f"m{n}") for n in range(11)])
    assert_refused(await post_all(server, {"input": [many]}), "too_many_input_items", "input")
    references = signed([{"type": "item_reference", "id": f"msg_{n}"} for n in range(3)])
    assert_refused(await post_all(server, {"input": [references]}), "too_many_item_references", "input")


async def test_a_compaction_made_for_one_tenant_does_not_expand_for_another(make_server):
    server = make_server(compaction_secret=SECRET, api_keys=["alice sk-a", "bob sk-b"])
    async with AsyncOpenAI(base_url=server.base_url, api_key="sk-a", max_retries=0) as alice:
        compacted = await alice.responses.compact(model=MODEL, input="remember the word heron")
        replay = [item.model_dump(exclude_none=True) for item in compacted.output]
        assert (await alice.responses.create(model=MODEL, input=replay)).status == "completed"
    answers = await post_all(server, {"input": replay}, headers={"Authorization": "Bearer sk-b"})
    assert_refused(answers, "invalid_encrypted_content", "input[1].encrypted_content")


async def test_a_compaction_survives_a_restart_when_the_secret_is_set(make_server):
    first, second = make_server(compaction_secret=SECRET), make_server(compaction_secret=SECRET)
    async with AsyncOpenAI(base_url=first.base_url, api_key=API_KEY, max_retries=0) as sdk:
        compacted = await sdk.responses.compact(model=MODEL, input="remember the word heron")
    replay = [item.model_dump(exclude_none=True) for item in compacted.output]
    async with AsyncOpenAI(base_url=second.base_url, api_key=API_KEY, max_retries=0) as sdk:
        assert (await sdk.responses.create(model=MODEL, input=[*replay, user("go on")])).status == "completed"


async def test_input_tokens_and_compact_bound_the_body_and_its_depth(make_server):
    server = make_server(max_body_bytes=10_000, max_json_depth=8)
    async with httpx2.AsyncClient(base_url=server.base_url) as http:
        for route in ROUTES[1:]:
            big = await http.post(route, json={"model": MODEL, "input": "x" * 20_000}, headers=AUTH)
            assert big.status_code == 413 and big.json()["error"]["code"] == "request_too_large"
            deep = await http.post(route, json={"model": MODEL, "input": "x", "metadata": nested(20)}, headers=AUTH)
            assert deep.status_code == 400 and deep.json()["error"]["param"] == "metadata"
            ok = await http.post(route, json={"model": MODEL, "input": "small"}, headers=AUTH)
            assert ok.status_code == 200


class BrokenStore(MemoryResponseStore):
    """A store with a bug: every load raises something that is not an `APIError`."""

    async def load(self, response_id: str, tenant: str | None = None) -> Any:
        raise RuntimeError("store bug")


async def test_an_unexpected_error_on_any_route_is_a_json_server_error(make_server):
    server = make_server(store_impl=BrokenStore(16, 1 << 20))
    async with httpx2.AsyncClient(base_url=server.base_url) as http:
        for answer in [
            await http.post("/responses/resp_1/cancel", headers=AUTH),
            await http.post(
                "/responses/input_tokens", json={"model": MODEL, "previous_response_id": "resp_1"}, headers=AUTH
            ),
        ]:
            assert answer.status_code == 500
            assert answer.json()["error"]["code"] == "server_error"
