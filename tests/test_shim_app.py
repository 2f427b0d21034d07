"""The app's routes and bearer auth: 401 at the WebSocket upgrade and on HTTP when keys are set."""

from __future__ import annotations

import json

import httpx2
import openai
import pytest
from openai import AsyncOpenAI
from support.wire import MODEL, completed_ok, run_turn, ws_url
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import InvalidStatus

KEYS = ["key-one", "key-two"]


@pytest.fixture
def guarded(make_server):
    return make_server(api_keys=KEYS)


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic key-one"}])
async def test_the_upgrade_without_a_valid_key_is_refused_with_http_401(guarded, headers):
    with pytest.raises(InvalidStatus) as refused:
        async with ws_connect(ws_url(guarded), additional_headers=headers):
            pass
    response = refused.value.response
    assert response.status_code == 401
    body = json.loads(response.body)
    assert body["error"]["code"] == "invalid_api_key" and body["error"]["type"] == "authentication_error"
    assert not guarded.shim.connections


async def test_the_sdk_with_a_wrong_key_cannot_connect(guarded):
    async with AsyncOpenAI(base_url=guarded.base_url, api_key="wrong", max_retries=0) as sdk:
        with pytest.raises(InvalidStatus) as refused:
            async with sdk.responses.connect():
                pass
    assert refused.value.response.status_code == 401


@pytest.mark.parametrize("key", KEYS)
async def test_the_sdk_with_a_configured_key_works_over_both_transports(guarded, key):
    async with AsyncOpenAI(base_url=guarded.base_url, api_key=key, max_retries=0) as sdk:
        async with sdk.responses.connect() as conn:
            completed_ok(await run_turn(conn, input="hi", store=False))
        response = await sdk.responses.create(model=MODEL, input="hi", store=False)
        assert response.status == "completed"
        assert [m.id for m in (await sdk.models.list()).data] == [MODEL]


async def test_every_http_route_but_the_probes_needs_the_key(guarded):
    async with AsyncOpenAI(base_url=guarded.base_url, api_key="wrong", max_retries=0) as sdk:
        with pytest.raises(openai.AuthenticationError) as refused:
            await sdk.responses.create(model=MODEL, input="hi")
        assert refused.value.status_code == 401 and refused.value.code == "invalid_api_key"
        with pytest.raises(openai.AuthenticationError):
            await sdk.models.list()
        with pytest.raises(openai.AuthenticationError):
            await sdk.responses.retrieve("resp_x")
        with pytest.raises(openai.AuthenticationError):
            await sdk.responses.delete("resp_x")
    root = guarded.base_url.removesuffix("/v1")
    assert httpx2.get(root + "/healthz").status_code == 200
    assert httpx2.get(root + "/readyz").status_code == 200


async def test_without_configured_keys_no_auth_is_needed(server):
    async with ws_connect(ws_url(server)) as ws:
        assert ws.response.status_code == 101
    assert httpx2.get(server.base_url + "/models").status_code == 200


async def test_unknown_routes_are_404_and_wrong_methods_405(server):
    assert httpx2.get(server.base_url + "/nothing").status_code == 404
    assert httpx2.put(server.base_url + "/responses").status_code == 405
