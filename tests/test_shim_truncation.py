"""`truncation: "auto"`: the oldest turns go first, standing instructions stay, no tool output loses its call."""

from __future__ import annotations

import openai
import pytest
from openai import AsyncOpenAI
from support.wire import API_KEY, MODEL, recv_event, run_turn

from server_shim.config import ShimConfig
from server_shim.truncation import BYTES_PER_TOKEN, fit


def msg(role: str, text: str) -> dict:
    return {"type": "message", "role": role, "content": text}


CALL = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
OUTPUT = {"type": "function_call_output", "call_id": "c1", "output": "x" * 400}
CONVERSATION = [
    msg("developer", "rules"),
    msg("user", "first " * 50),
    msg("assistant", "answer " * 50),
    msg("user", "second"),
    CALL,
    OUTPUT,
    msg("assistant", "done"),
    msg("user", "third"),
]


SIZES = [400 if item is OUTPUT else 100 for item in CONVERSATION]


def test_a_conversation_that_fits_is_kept_whole():
    assert fit(CONVERSATION, 10_000) == CONVERSATION


def test_the_oldest_turns_go_first_and_the_instructions_stay():
    kept = fit(CONVERSATION, budget_tokens=(100 * 5 + 400) // BYTES_PER_TOKEN, sizes=SIZES)
    assert kept == [msg("developer", "rules"), *CONVERSATION[3:]]


def test_a_tool_output_is_never_kept_without_its_call():
    kept = fit(CONVERSATION, budget_tokens=(100 * 3) // BYTES_PER_TOKEN, sizes=SIZES)
    assert kept == [msg("developer", "rules"), msg("user", "third")]


def test_when_even_the_newest_turn_does_not_fit_there_is_no_answer():
    assert fit(CONVERSATION, budget_tokens=100 // BYTES_PER_TOKEN, sizes=SIZES) is None


def _window_config(window: int) -> ShimConfig:
    deployment = {"name": "small", "kind": "simulated", "models": {MODEL: MODEL}, "context_window": window}
    return ShimConfig.model_validate({"deployments": [deployment]})


async def test_auto_truncation_keeps_a_long_chain_inside_the_context_window(make_server):
    server = make_server(config=_window_config(300))
    async with AsyncOpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0) as sdk:
        previous = None
        for turn in range(6):
            response = await sdk.responses.create(
                model=MODEL,
                input=f"turn {turn}: " + "words " * 60,
                previous_response_id=previous,
                truncation="auto",
                max_output_tokens=8,
            )
            assert response.status == "completed" and response.truncation == "auto"
            assert response.usage.input_tokens <= 300 - 8
            previous = response.id
        with pytest.raises(openai.BadRequestError) as refused:
            await sdk.responses.create(model=MODEL, input="more", previous_response_id=previous, max_output_tokens=8)
    assert refused.value.code == "context_length_exceeded", "truncation disabled (the default) refuses instead"
    assert "truncation" in refused.value.message


async def test_a_single_turn_larger_than_the_window_is_refused_even_with_auto(make_server):
    server = make_server(config=_window_config(50))
    async with AsyncOpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0) as sdk:
        with pytest.raises(openai.BadRequestError) as refused:
            await sdk.responses.create(model=MODEL, input="words " * 100, truncation="auto")
    assert refused.value.code == "context_length_exceeded"


async def test_over_websocket_a_refused_turn_leaves_the_chain_usable(make_server):
    server = make_server(config=_window_config(120))
    async with (
        AsyncOpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0) as sdk,
        sdk.responses.connect() as conn,
    ):
        first = await run_turn(conn, input="short", store=False, max_output_tokens=4)
        await conn.response.create(model=MODEL, input="words " * 200, previous_response_id=first.id)
        error = await recv_event(conn)
        assert error["type"] == "error" and error["error"]["code"] == "context_length_exceeded"
        second = await run_turn(conn, input="ok", previous_response_id=first.id, store=False, max_output_tokens=4)
        assert second.types[-1] == "response.completed"
