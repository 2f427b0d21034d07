"""A client that goes away mid-response: the turn stops, nothing is logged as a server error, the close
is answered at once, and the tokens produced so far are metered (`cancelled`) exactly once."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from support.wire import MODEL, ws_url
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from plugins import create_plugin_manager, hookimpl
from server_shim import BackgroundServer, Settings, create_app, metrics
from server_shim.ledger_sinks import SqliteSink

TOKENS = 2000
LANES = ("a", "b", "c")


class Metered:
    """Every response the post-inference path (the usage ledger's path) is handed."""

    def __init__(self) -> None:
        self.responses: list[dict[str, Any]] = []

    @hookimpl
    def responses_ws_response_finished(self, response: dict[str, Any], info: Any) -> None:
        self.responses.append(response)

    async def only(self, response_id: str) -> dict[str, Any]:
        for _ in range(200):  # the turn is stopped on the server's side of the disconnect: wait for it
            if any(r["id"] == response_id for r in self.responses):
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)  # and nothing more comes for it
        (record,) = [r for r in self.responses if r["id"] == response_id]
        return record


@pytest.fixture
def metered(tmp_path) -> Iterator[tuple[BackgroundServer, Metered]]:
    """2000 tokens at 2000 tokens/s on each of three lanes: the socket is busy when the client walks away."""
    yield from metered_server(tmp_path, float(TOKENS))


@pytest.fixture
def metered_fast(tmp_path) -> Iterator[tuple[BackgroundServer, Metered]]:
    """A backend that never waits between tokens (100,000 a second): the loop must still notice the client leave."""
    yield from metered_server(tmp_path, 100_000.0)


def metered_server(tmp_path: Any, tokens_per_s: float) -> Iterator[tuple[BackgroundServer, Metered]]:
    recorder = Metered()
    manager = create_plugin_manager(load_entry_points=False)
    manager.register(recorder)
    settings = Settings(
        usage_path=str(tmp_path / "usage.db"),
        simulated_tokens_per_s=tokens_per_s,
        max_frame_bytes=1024,
        drain_timeout_s=2.0,
    )
    with BackgroundServer(create_app(settings, plugin_manager=manager), settings) as server:
        yield server, recorder


def server_errors() -> float:
    return metrics.ERRORS.labels("server_error")._value.get()


async def started(ws: Any) -> list[str]:
    """Start a long response on each lane; their ids once each has streamed a few deltas."""
    for lane in LANES:
        create = {"type": "response.create", "model": MODEL, "input": "write a long story", "stream_id": lane}
        await ws.send(json.dumps({**create, "max_output_tokens": TOKENS}))
    ids: dict[str, str] = {}
    deltas = dict.fromkeys(LANES, 0)
    while min(deltas.values()) < 3:
        event = json.loads(await ws.recv())
        if event["type"] == "response.created":
            ids[event["stream_id"]] = event["response"]["id"]
        elif event["type"] == "response.output_text.delta":
            deltas[event["stream_id"]] += 1
    return list(ids.values())


async def assert_each_cancelled(recorder: Metered, ids: list[str]) -> None:
    for response_id in ids:
        assert_cancelled_with_partial_output(await recorder.only(response_id))


def assert_cancelled_with_partial_output(record: dict[str, Any]) -> None:
    assert record["status"] == "cancelled"
    assert 3 <= record["usage"]["output_tokens"] < TOKENS and record["usage"]["input_tokens"] > 0


def assert_quiet(caplog: pytest.LogCaptureFixture, errors_before: float) -> None:
    gc.collect()  # a task whose exception nobody retrieved says so when it is collected
    assert server_errors() == errors_before
    loud = [r for r in caplog.records if r.levelno >= logging.ERROR or "socket.send() raised" in r.getMessage()]
    assert not loud, [r.getMessage() for r in loud]


async def test_an_aborted_connection_stops_the_turn_quietly_and_meters_it(metered, caplog):
    server, recorder = metered
    errors = server_errors()
    async with ws_connect(ws_url(server)) as ws:
        ids = await started(ws)
        ws.transport.abort()
    await assert_each_cancelled(recorder, ids)
    assert_quiet(caplog, errors)


async def test_a_cancelled_response_is_in_the_usage_ledger_marked_as_estimated(metered, tmp_path):
    server, recorder = metered
    async with ws_connect(ws_url(server)) as ws:
        ids = await started(ws)
        ws.transport.abort()
    await assert_each_cancelled(recorder, ids)
    for _ in range(200):  # written in the background every usage_flush_interval_s
        records = {r.id: r for r in SqliteSink(tmp_path / "usage.db").read()}
        if set(ids) <= set(records):
            break
        await asyncio.sleep(0.02)
    assert all(records[i].status == "cancelled" and records[i].estimated for i in ids)
    assert {records[i].deployment for i in ids} == {"simulated"}, "billed to the deployment that streamed"


async def test_a_client_close_mid_response_is_answered_at_once_and_the_turn_is_metered(metered, caplog):
    server, recorder = metered
    errors = server_errors()
    # max_queue=None: with its default, `websockets` stops reading while 16 frames wait unread, so it
    # would not see the server's (immediate) answer to its close until its own close_timeout
    async with ws_connect(ws_url(server), close_timeout=10, max_queue=None) as ws:
        ids = await started(ws)
        began = time.monotonic()
        await ws.close()
        assert time.monotonic() - began < 1.0
        assert ws.close_code == 1000
    await assert_each_cancelled(recorder, ids)
    assert not any(r["status"] == "completed" for r in recorder.responses)
    assert_quiet(caplog, errors)


async def test_a_frame_over_the_protocol_bound_mid_response_is_no_server_error(metered, caplog):
    server, recorder = metered
    errors = server_errors()
    async with ws_connect(ws_url(server), max_size=None) as ws:
        ids = await started(ws)
        with pytest.raises(
            ConnectionClosed
        ) as closed:  # the server closes with 1009 as soon as the frame's header arrives
            await ws.send("x" * (17 * 1024 * 1024))
            while True:
                await ws.recv()
    assert closed.value.rcvd is None or closed.value.rcvd.code == 1009  # a client still writing may miss the frame
    await assert_each_cancelled(recorder, ids)
    assert_quiet(caplog, errors)


@pytest.mark.parametrize(("speed", "tokens"), [("metered", TOKENS), ("metered_fast", 30_000)])
async def test_an_http_stream_dropped_after_its_first_event_stops_and_is_metered(speed, tokens, request, caplog):
    server, recorder = request.getfixturevalue(speed)
    errors = server_errors()
    body = {"model": MODEL, "input": "write a long story", "max_output_tokens": tokens, "stream": True}
    async with httpx.AsyncClient() as http, http.stream("POST", server.base_url + "/responses", json=body) as reply:
        lines = reply.aiter_lines()
        async for line in lines:
            if line.startswith("data:") and '"response.output_text.delta"' in line:
                item_id = json.loads(line[5:])["item_id"]
                break
    for _ in range(200):
        if recorder.responses:
            break
        await asyncio.sleep(0.01)
    (record,) = recorder.responses
    assert record["output"][0]["id"] == item_id
    assert record["status"] == "cancelled" and 1 <= record["usage"]["output_tokens"] < tokens
    assert_quiet(caplog, errors)
