"""Validators and classifiers cannot be bypassed: sync or async, always awaited, fail closed.

Each case runs on a real shim through the real `openai` SDK, over WebSocket and HTTP, and the same
connection then completes a chained turn from the response before the refused one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI

from server_shim import APIError, BackgroundServer, Settings, create_app

MODEL = "simulated-1"


async def async_refuses(new_items: list[dict[str, Any]], previous: Any, request: Any) -> None:
    await asyncio.sleep(0.01)
    if any("forbidden" in str(item.get("content", "")) for item in new_items):
        raise APIError(400, "content_policy_violation", "This input is not allowed.", "input")


async def async_crashes(new_items: list[dict[str, Any]], previous: Any, request: Any) -> None:
    await asyncio.sleep(0)
    if any("crash-async" in str(item.get("content", "")) for item in new_items):
        raise RuntimeError("the policy service is down")


def sync_crashes(new_items: list[dict[str, Any]], previous: Any, request: Any) -> None:
    if any("crash-sync" in str(item.get("content", "")) for item in new_items):
        raise ValueError("bug in a validator")


async def async_labels(new_items: list[dict[str, Any]]) -> dict[str, str]:
    await asyncio.sleep(0)
    text = " ".join(str(item.get("content", "")) for item in new_items)
    if "bad-labels" in text:
        return {"topic": 3}  # type: ignore[dict-item]
    if "classifier-crash" in text:
        raise KeyError("topic")
    return {"topic": "billing" if "invoice" in text else "other"}


@pytest.fixture(scope="module")
def server() -> Iterator[BackgroundServer]:
    settings = Settings(usage_ledger="off")  # the usage ledger is not under test here
    app = create_app(settings, validators=[async_refuses, async_crashes, sync_crashes], classifiers=[async_labels])
    with BackgroundServer(app, settings) as running:
        yield running


async def _turn(conn: Any, text: str, previous: str | None) -> Any:
    await conn.response.create(
        model=MODEL, input=[{"role": "user", "content": text}], previous_response_id=previous, store=False
    )
    async for event in conn:
        if event.type in ("response.completed", "response.failed", "error"):
            return event
    raise AssertionError("no terminal event")


REFUSALS = [
    ("forbidden words", "content_policy_violation"),
    ("crash-async", "server_error"),
    ("crash-sync", "server_error"),
    ("classifier-crash", "server_error"),
    ("bad-labels", "server_error"),
]


@pytest.mark.parametrize(("text", "code"), REFUSALS)
async def test_websocket_refusal_or_crash_fails_closed_and_the_chain_continues(server, text, code):
    async with AsyncOpenAI(base_url=server.base_url, api_key="x") as client, client.responses.connect() as conn:
        first = await _turn(conn, "about my invoice", None)
        assert first.type == "response.completed"
        assert first.response.metadata == {"classifier.topic": "billing"}, "an async classifier is awaited"
        refused = await _turn(conn, text, first.response.id)
        assert refused.type == "error" and refused.error.code == code
        after = await _turn(conn, "and the weather", first.response.id)
        assert after.type == "response.completed" and after.response.metadata == {"classifier.topic": "other"}


@pytest.mark.parametrize(("text", "code"), REFUSALS)
async def test_http_refusal_or_crash_fails_closed(server, text, code):
    async with AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0) as client:
        expected = openai.BadRequestError if code != "server_error" else openai.InternalServerError
        with pytest.raises(expected) as caught:
            await client.responses.create(model=MODEL, input=text, store=False)
        assert caught.value.code == code
        ok = await client.responses.create(model=MODEL, input="an invoice", store=False)
        assert ok.status == "completed" and ok.metadata == {"classifier.topic": "billing"}
