"""WebSocket mode over a real uvicorn server, driven by the official SDK's `responses.connect()`."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from typing import Any

import pytest
import websockets
from openai import AsyncOpenAI
from support.wire import (
    API_KEY,
    LOOKUP_TOOL,
    MODEL,
    check_sequence,
    completed_ok,
    only_connection,
    read_turn,
    recv_event,
    run_turn,
    send_raw,
    strict_ws_event,
    user,
    ws_url,
)
from websockets.asyncio.client import connect as ws_connect

from server_shim.backends import SimulatedBackend
from server_shim.backends.chat_convert import chat_prompt

# --- the normal stream ---------------------------------------------------------------------------


async def test_text_turn_streams_every_event_in_order_and_each_parses_strictly(client, server):
    async with client.responses.connect() as conn:
        turn = await run_turn(conn, input="hello", store=False)
    completed_ok(turn)
    assert turn.types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert set(turn.types[4:-4]) == {"response.output_text.delta"}
    assert turn.types[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    deltas = "".join(e["delta"] for e in turn.events if e["type"] == "response.output_text.delta")
    assert deltas == turn.text
    assert "simulat" in turn.text
    assert turn.response["usage"]["output_tokens"] == 16


async def test_function_call_turn_streams_argument_deltas_then_done(client, server):
    async with client.responses.connect() as conn:
        turn = await run_turn(conn, input='call lookup {"n": 7}', tools=[LOOKUP_TOOL], store=False)
    completed_ok(turn)
    assert "response.function_call_arguments.delta" in turn.types
    done = next(e for e in turn.events if e["type"] == "response.function_call_arguments.done")
    assert json.loads(done["arguments"]) == {"n": 7}
    (item,) = turn.response["output"]
    assert item["type"] == "function_call" and item["name"] == "lookup" and item["status"] == "completed"
    assert item["arguments"] == done["arguments"]


async def test_sdk_typed_iteration_sees_the_same_stream(client, server):
    async with client.responses.connect() as conn:
        await conn.response.create(model=MODEL, input="hi", store=False)
        types = []
        async for event in conn:
            types.append(event.type)
            if event.type == "response.completed":
                assert event.response.output_text
                break
    assert types[0] == "response.created"


async def test_stream_field_and_beta_header_are_tolerated(server):
    async with (
        AsyncOpenAI(
            base_url=server.base_url,
            api_key=API_KEY,
            max_retries=0,
            default_headers={"OpenAI-Beta": "responses_websockets=2026-02-06"},
        ) as sdk,
        sdk.responses.connect() as conn,
    ):
        turn = await run_turn(conn, input="hi", stream=True, store=False)
    completed_ok(turn)


async def test_twenty_chained_turns_deliver_only_the_new_items_each_turn(client, server, recorder):
    tools = [LOOKUP_TOOL]
    async with client.responses.connect() as conn:
        previous_id = None
        new_items: list[dict[str, Any]] = [user('Step 0.\ncall lookup {"n": 0}')]
        sent_total = 0
        for step in range(20):
            turn = await run_turn(
                conn, input=new_items, tools=tools, previous_response_id=previous_id, store=False, max_output_tokens=4
            )
            completed_ok(turn)
            call = recorder.last
            assert call.items == new_items, f"turn {step}: the server got more than the new items"
            assert call.previous_id == previous_id
            sent_total += len(new_items)
            previous_id = turn.id
            output = turn.response["output"]
            calls = [item for item in output if item["type"] == "function_call"]
            if calls:
                assert "Tool" not in turn.text
                new_items = [
                    {"type": "function_call_output", "call_id": c["call_id"], "output": f"record {step}"} for c in calls
                ]
            else:
                assert f"record {step - 1}" in turn.text  # the simulator quotes the tool output it got
                new_items = [user(f"Step {step}.\ncall lookup {json.dumps({'n': step})}")]
        connection = only_connection(server)
        assert len(connection.cache) == 20
        last = connection.cache.get(previous_id)
        # the cached history holds the whole conversation: 20 turns of one new item plus one output item each
        assert len(last.history) == 40
        assert len(chat_prompt(last.history).messages) == 40
    assert len(recorder.calls) == 20
    assert server.shim.stats.input_items_received == sent_total == 20
    assert server.shim.stats.turns == 20


async def test_warm_up_with_generate_false_runs_no_inference_and_can_be_chained(client, server, recorder):
    async with client.responses.connect() as conn:
        warm = await run_turn(
            conn,
            input=[{"type": "message", "role": "developer", "content": "You are terse."}],
            tools=[LOOKUP_TOOL],
            generate=False,
            store=False,
        )
        assert warm.types == ["response.created", "response.in_progress", "response.completed"]
        assert warm.response["output"] == [] and warm.response["usage"] is None
        turn = await run_turn(
            conn, input=[user("hello")], tools=[LOOKUP_TOOL], previous_response_id=warm.id, store=False
        )
        completed_ok(turn)
        assert recorder.last.items == [user("hello")]
        assert recorder.last.previous_id == warm.id
        state = only_connection(server).cache.get(turn.id)
        assert [m["role"] for m in chat_prompt(state.history).messages] == ["system", "user", "assistant"]
        assert state.history.items[0]["role"] == "developer", "the items keep their role; chat renders it"


# --- stream_id lanes -----------------------------------------------------------------------------


async def _read_lanes(conn: Any, terminals: int) -> list[dict[str, Any]]:
    """Read events until `terminals` responses have completed (or errored)."""
    events = []
    done = 0
    while done < terminals:
        event = await recv_event(conn)
        events.append(event)
        done += event["type"] in ("response.completed", "error")
    return events


async def test_one_lane_runs_its_requests_fifo_and_echoes_stream_id_on_every_event(make_server):
    server = make_server(simulated_ttft_s=0.05)
    async with AsyncOpenAI(base_url=server.base_url, api_key=API_KEY) as sdk, sdk.responses.connect() as conn:
        for n in range(3):
            await conn.response.create(
                model=MODEL, input=f"request {n}", stream_id="lane-a", metadata={"n": str(n)}, store=False
            )
        events = await _read_lanes(conn, 3)
    assert all(e["stream_id"] == "lane-a" for e in events)
    order = [e["response"]["metadata"]["n"] for e in events if e["type"] in ("response.created", "response.completed")]
    assert order == ["0", "0", "1", "1", "2", "2"]  # each response finishes before the next starts
    starts = [i for i, e in enumerate(events) if e["type"] == "response.created"] + [len(events)]
    for begin, end in itertools.pairwise(starts):
        check_sequence(events[begin:end], stream_id="lane-a")


async def test_lanes_run_concurrently_up_to_the_in_flight_limit(make_server):
    server = make_server(simulated_ttft_s=0.3, max_in_flight=4)
    async with AsyncOpenAI(base_url=server.base_url, api_key=API_KEY) as sdk, sdk.responses.connect() as conn:
        start = time.perf_counter()
        for n in range(6):
            await conn.response.create(model=MODEL, input="go", stream_id=f"lane-{n}", store=False)
        events = await _read_lanes(conn, 6)
        elapsed = time.perf_counter() - start
    first_done = next(i for i, e in enumerate(events) if e["type"] == "response.completed")
    started_before = {e["stream_id"] for e in events[:first_done] if e["type"] == "response.created"}
    assert len(started_before) == 4, "four lanes in flight at once, the other two queued"
    assert {e["stream_id"] for e in events} == {f"lane-{n}" for n in range(6)}
    assert elapsed < 6 * 0.3, "lanes did not overlap"
    for lane in range(6):
        check_sequence([e for e in events if e["stream_id"] == f"lane-{lane}"], stream_id=f"lane-{lane}")


async def test_a_33rd_concurrent_lane_gets_websocket_stream_limit_reached(make_server):
    server = make_server(simulated_ttft_s=0.6, max_in_flight=32)
    async with AsyncOpenAI(base_url=server.base_url, api_key=API_KEY) as sdk, sdk.responses.connect() as conn:
        for n in range(32):
            await conn.response.create(model=MODEL, input="go", stream_id=f"lane-{n}", store=False, max_output_tokens=1)
        await conn.response.create(model=MODEL, input="one too many", stream_id="lane-32", store=False)
        events = await _read_lanes(conn, 33)
        refusal = next(e for e in events if e["type"] == "error")
        assert refusal["error"]["code"] == "websocket_stream_limit_reached"
        assert refusal["error"]["param"] == "stream_id"
        assert refusal["stream_id"] == "lane-32"
        assert sum(e["type"] == "response.completed" for e in events) == 32
        # the lanes are free again once their requests finished
        again = await run_turn(conn, input="now there is room", stream_id="lane-32", store=False)
        completed_ok(again)
        check_sequence(again.events, stream_id="lane-32")


@pytest.mark.parametrize("stream_id", ["has space", "x" * 257, "", "slash/no", 12])
async def test_a_bad_stream_id_gets_invalid_stream_id_and_the_connection_stays_usable(client, server, stream_id):
    async with client.responses.connect() as conn:
        await send_raw(conn, {"type": "response.create", "model": MODEL, "input": "hi", "stream_id": stream_id})
        error = await recv_event(conn)
        assert error["type"] == "error" and error["status"] == 400
        assert error["error"]["code"] == "invalid_stream_id"
        assert error["error"]["param"] == "stream_id"
        assert "stream_id" not in error
        completed_ok(await run_turn(conn, input="hi", stream_id="ok_lane.1-A", store=False))


async def test_lane_and_lineage_are_independent(client, server, recorder):
    async with client.responses.connect() as conn:
        first = await run_turn(conn, input=[user("a")], stream_id="one", store=False)
        second = await run_turn(conn, input=[user("b")], stream_id="two", previous_response_id=first.id, store=False)
        completed_ok(second)
        assert recorder.last.previous_id == first.id
        check_sequence(second.events, stream_id="two")


# --- state across connections --------------------------------------------------------------------


async def test_a_stored_response_is_loaded_by_a_second_connection(client, server, recorder):
    async with client.responses.connect() as first_conn:
        first = await run_turn(first_conn, input=[user("remember me")], store=True)
    async with client.responses.connect() as second_conn:
        turn = await run_turn(second_conn, input=[user("and now?")], previous_response_id=first.id, store=False)
        completed_ok(turn)
        assert recorder.last.previous_id == first.id
        state = only_connection(server).cache.get(turn.id)
        assert [m["content"] for m in chat_prompt(state.history).messages if m["role"] == "user"] == [
            "remember me",
            "and now?",
        ]


async def test_an_unstored_response_is_not_visible_from_another_connection(client, server):
    async with client.responses.connect() as first_conn:
        first = await run_turn(first_conn, input="private", store=False)
    async with client.responses.connect() as second_conn:
        turn = await run_turn(second_conn, input="hi", previous_response_id=first.id)
        assert turn.error["error"]["code"] == "previous_response_not_found"
        assert turn.error["error"]["param"] == "previous_response_id"


# --- bad input: a specific error, the connection survives, nothing lost --------------------------

BAD_FRAMES = [
    pytest.param("{not json", "invalid_json", None, id="malformed-json"),
    pytest.param("[1, 2]", "invalid_type", None, id="array-frame"),
    pytest.param('"text"', "invalid_type", None, id="string-frame"),
    pytest.param("42", "invalid_type", None, id="number-frame"),
    pytest.param({"type": "response.cancel"}, "unknown_event_type", "type", id="unknown-event-type"),
    pytest.param({"model": MODEL, "input": "hi"}, "missing_required_parameter", "type", id="missing-type"),
    pytest.param({"type": "response.create", "input": "hi"}, "missing_required_parameter", "model", id="missing-model"),
    pytest.param({"type": "response.create", "model": "", "input": "hi"}, "invalid_value", "model", id="empty-model"),
    pytest.param(
        {"type": "response.create", "model": "no-such-model", "input": "hi"},
        "model_not_found",
        "model",
        id="unknown-model",
    ),
    pytest.param(
        {"type": "response.create", "model": MODEL, "input": "hi", "background": True},
        "unsupported_parameter",
        "background",
        id="background",
    ),
    pytest.param(
        {"type": "response.create", "model": MODEL, "input": "hi", "previous_response_id": "resp_nope"},
        "previous_response_not_found",
        "previous_response_id",
        id="unknown-previous-response-id",
    ),
    pytest.param(
        {"type": "response.create", "model": MODEL, "input": 5}, "invalid_value", "input", id="input-not-list"
    ),
    pytest.param(
        {"type": "response.create", "model": MODEL, "input": ["just a string"]},
        "invalid_type",
        "input[0]",
        id="item-not-object",
    ),
    pytest.param(
        {"type": "response.create", "model": MODEL, "input": [{"type": "message", "role": "robot", "content": "x"}]},
        "invalid_value",
        "input[0].role",
        id="bad-role",
    ),
    pytest.param(
        {"type": "response.create", "model": MODEL, "input": [{"type": "message", "role": "user", "content": 5}]},
        "invalid_type",
        "input[0].content",
        id="bad-content",
    ),
    pytest.param(
        {
            "type": "response.create",
            "model": MODEL,
            "input": [{"role": "user", "content": [{"type": "input_text", "text": 1}]}],
        },
        "invalid_type",
        "input[0].content[0].text",
        id="bad-text-part",
    ),
    pytest.param(
        {
            "type": "response.create",
            "model": MODEL,
            "input": [{"role": "user", "content": [{"type": "input_audio"}]}],
        },
        "invalid_value",
        "input[0].content[0].type",
        id="unknown-part-type",
    ),
    pytest.param(
        {"type": "response.create", "model": MODEL, "input": [{"type": "teleport"}]},
        "invalid_value",
        "input[0]",
        id="unknown-item-type",
    ),
    pytest.param(
        {"type": "response.create", "model": MODEL, "input": [{"content": "no type, no role"}]},
        "missing_required_parameter",
        "input[0]",
        id="item-without-type",
    ),
    pytest.param(
        {"type": "response.create", "model": MODEL, "input": [{"type": "function_call", "call_id": "c1", "name": "f"}]},
        "missing_required_parameter",
        "input[0].arguments",
        id="function-call-missing-arguments",
    ),
    pytest.param(
        {
            "type": "response.create",
            "model": MODEL,
            "input": [{"type": "function_call_output", "call_id": "call_unknown", "output": "x"}],
        },
        "tool_output_without_call",
        "input[0].call_id",
        id="tool-output-without-call",
    ),
    pytest.param(
        {"type": "response.create", "model": MODEL, "input": [{"type": "item_reference", "id": "msg_nope"}]},
        "item_not_found",
        "input[0].id",
        id="unknown-item-reference",
    ),
    pytest.param(
        {"type": "response.create", "model": MODEL, "input": "hi", "tools": [{"type": "teleport"}]},
        "unsupported_tool",
        "tools[0].type",
        id="unsupported-tool",
    ),
    pytest.param(
        {"type": "response.create", "model": MODEL, "input": "hi", "temperature": 9},
        "invalid_value",
        "temperature",
        id="temperature-out-of-range",
    ),
    pytest.param(
        {"type": "response.create", "model": MODEL, "input": "hi", "max_output_tokens": 0},
        "invalid_value",
        "max_output_tokens",
        id="max-output-tokens-zero",
    ),
]


@pytest.mark.parametrize(("frame", "code", "param"), BAD_FRAMES)
async def test_bad_input_gets_a_specific_error_and_the_connection_continues_its_chain(
    client, server, recorder, frame, code, param
):
    async with client.responses.connect() as conn:
        first = await run_turn(conn, input=[user("before")], store=False)
        connection = only_connection(server)
        cached_before = connection.cache.ids()
        history_before = connection.cache.get(first.id).history
        calls_before = len(recorder.calls)

        await send_raw(conn, frame)
        error = await recv_event(conn)
        assert error["type"] == "error", error
        assert error["status"] == (404 if code in ("item_not_found", "model_not_found") else 400)
        assert error["error"]["code"] == code
        assert error["error"]["param"] == param
        assert error["error"]["type"] == "invalid_request_error"
        assert error["error"]["message"]

        assert connection.cache.ids() == cached_before, "a refused request changed the cache"
        assert connection.cache.get(first.id).history is history_before
        assert len(recorder.calls) <= calls_before + 1

        after = await run_turn(conn, input=[user("after")], previous_response_id=first.id, store=False)
        completed_ok(after)
        assert recorder.last.items == [user("after")]
        assert recorder.last.previous_id == first.id
        assert connection.cache.ids() == [*cached_before, after.id]


async def test_a_binary_frame_is_read_like_a_text_frame(server):
    async with ws_connect(ws_url(server)) as ws:
        await ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": "hi", "store": False}).encode())
        types = []
        while not types or types[-1] != "response.completed":
            event = json.loads(await asyncio.wait_for(ws.recv(), 5))
            strict_ws_event(event)
            types.append(event["type"])


async def test_a_frame_over_the_size_limit_gets_message_too_large_then_close_1009(make_server):
    server = make_server(max_frame_bytes=4096)
    async with ws_connect(ws_url(server)) as ws:
        await ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": "x" * 5000}))
        error = json.loads(await asyncio.wait_for(ws.recv(), 5))
        strict_ws_event(error)
        assert error["type"] == "error"
        assert error["error"]["code"] == "message_too_large"
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), 5)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
    # the server is fine; a frame just under the limit is served
    async with ws_connect(ws_url(server)) as ws:
        await ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": "y" * 3000, "store": False}))
        while json.loads(await asyncio.wait_for(ws.recv(), 5))["type"] != "response.completed":
            pass


async def test_an_oversize_frame_through_the_sdk_ends_the_connection_with_1009(make_server):
    server = make_server(max_frame_bytes=2048)
    async with AsyncOpenAI(base_url=server.base_url, api_key=API_KEY) as sdk, sdk.responses.connect() as conn:
        await conn.response.create(model=MODEL, input="z" * 4000)
        error = await recv_event(conn)
        assert error["error"]["code"] == "message_too_large"
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await recv_event(conn)
        assert closed.value.rcvd.code == 1009


async def test_a_response_in_flight_finishes_before_the_oversize_close(make_server):
    server = make_server(max_frame_bytes=2048, simulated_ttft_s=0.2)
    async with ws_connect(ws_url(server)) as ws:
        await ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": "hi", "store": False}))
        await ws.send("x" * 3000)
        received = []
        with pytest.raises(websockets.ConnectionClosed) as closed:
            while True:
                received.append(json.loads(await asyncio.wait_for(ws.recv(), 5)))
        types = [e["type"] for e in received]
        assert "response.completed" in types
        assert received[-1]["error"]["code"] == "message_too_large"
        assert closed.value.rcvd.code == 1009


# --- connection lifetime -------------------------------------------------------------------------


async def test_the_connection_age_limit_sends_websocket_connection_limit_reached_then_closes(make_server):
    server = make_server(connection_max_age_s=0.3)
    async with ws_connect(ws_url(server)) as ws:
        started = time.perf_counter()
        error = json.loads(await asyncio.wait_for(ws.recv(), 5))
        strict_ws_event(error)
        assert error["type"] == "error"
        assert error["error"]["code"] == "websocket_connection_limit_reached"
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), 5)
        assert closed.value.rcvd.code == 1001
        assert time.perf_counter() - started >= 0.25
    deadline = time.perf_counter() + 2  # the server forgets the connection once its task has wound down
    while server.shim.connections:
        assert time.perf_counter() < deadline, "the closed connection was never released"
        await asyncio.sleep(0.01)


async def test_the_age_limit_lets_a_response_in_flight_finish_first(make_server):
    server = make_server(connection_max_age_s=0.3, simulated_ttft_s=0.5)
    async with AsyncOpenAI(base_url=server.base_url, api_key=API_KEY) as sdk, sdk.responses.connect() as conn:
        turn = await run_turn(conn, input="slow", store=False)
        completed_ok(turn)
        error = await recv_event(conn)
        assert error["error"]["code"] == "websocket_connection_limit_reached"


async def test_requests_after_the_age_limit_are_refused_while_draining(make_server):
    server = make_server(connection_max_age_s=0.1, simulated_ttft_s=0.9)
    async with ws_connect(ws_url(server)) as ws:
        await ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": "slow", "store": False}))
        await asyncio.sleep(0.4)
        await ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": "late", "store": False}))
        received = []
        with pytest.raises(websockets.ConnectionClosed):
            while True:
                received.append(json.loads(await asyncio.wait_for(ws.recv(), 5)))
    errors = [e["error"]["code"] for e in received if e["type"] == "error"]
    assert errors == ["websocket_connection_limit_reached", "websocket_connection_limit_reached"]
    assert sum(e["type"] == "response.completed" for e in received) == 1


async def test_a_refusal_while_draining_names_the_lane_of_the_refused_request(make_server):
    server = make_server(connection_max_age_s=0.1, simulated_ttft_s=0.9)
    async with ws_connect(ws_url(server)) as ws:
        await ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": "slow", "stream_id": "a"}))
        await asyncio.sleep(0.4)
        await ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": "late", "stream_id": "b"}))
        received = []
        with pytest.raises(websockets.ConnectionClosed):
            while True:
                received.append(json.loads(await asyncio.wait_for(ws.recv(), 5)))
    refusals = [e for e in received if e["type"] == "error"]
    assert refusals[0]["stream_id"] == "b"
    assert refusals[0]["error"]["code"] == "websocket_connection_limit_reached"
    assert all(e["stream_id"] == "a" for e in received if e["type"] != "error")


async def test_a_client_that_disconnects_mid_response_leaves_the_server_serving(make_server):
    server = make_server(simulated_ttft_s=0.01, simulated_tokens_per_s=200)
    async with ws_connect(ws_url(server)) as ws:
        await ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": "hi", "max_output_tokens": 200}))
        await asyncio.wait_for(ws.recv(), 5)
    for _ in range(100):
        if not server.shim.connections:
            break
        await asyncio.sleep(0.02)
    assert not server.shim.connections
    async with AsyncOpenAI(base_url=server.base_url, api_key=API_KEY) as sdk, sdk.responses.connect() as conn:
        completed_ok(await run_turn(conn, input="still here", store=False))


async def test_a_second_request_on_the_default_lane_waits_for_the_first(client, server):
    async with client.responses.connect() as conn:
        await conn.response.create(model=MODEL, input="one", store=False, metadata={"n": "1"})
        await conn.response.create(model=MODEL, input="two", store=False, metadata={"n": "2"})
        first = await read_turn(conn)
        second = await read_turn(conn)
    assert first.response["metadata"] == {"n": "1"} and second.response["metadata"] == {"n": "2"}
    completed_ok(first)
    completed_ok(second)


@pytest.mark.parametrize("stream_id", [None, "lane-a"])
async def test_an_invalid_request_queued_behind_a_response_is_answered_in_lane_order(make_server, stream_id):
    server = make_server(simulated_ttft_s=0.2)
    lane = {"stream_id": stream_id} if stream_id else {}
    async with AsyncOpenAI(base_url=server.base_url, api_key=API_KEY) as sdk, sdk.responses.connect() as conn:
        await conn.response.create(model=MODEL, input="slow", store=False, **lane)
        await send_raw(conn, {"type": "response.create", "input": "no model", **lane})
        first = await read_turn(conn, stream_id)
        completed_ok(first)  # the refusal of the second request did not land inside the first response
        error = await recv_event(conn)
        assert error["error"]["code"] == "missing_required_parameter"
        assert error.get("stream_id") == stream_id


async def test_the_byte_counter_and_the_size_limit_count_utf8_bytes_not_characters(make_server):
    server = make_server(max_frame_bytes=1000)
    frame = json.dumps(
        {"type": "response.create", "model": MODEL, "input": "é" * 500, "store": False}, ensure_ascii=False
    )
    assert len(frame) < 1000 < len(frame.encode())
    async with ws_connect(ws_url(server)) as ws:
        await ws.send(frame)
        error = json.loads(await asyncio.wait_for(ws.recv(), 5))
        assert error["error"]["code"] == "message_too_large"
    assert server.shim.stats.bytes_received == len(frame.encode())


class ReleasingBackend(SimulatedBackend):
    """The simulator, keeping state per connection (`ConnectionScoped`): each closed connection's id is released."""

    def __init__(self) -> None:
        super().__init__()
        self.released: list[str] = []

    async def release(self, connection_id: str) -> None:
        self.released.append(connection_id)


async def test_a_backend_that_keeps_state_per_connection_is_told_when_each_one_closes(make_server):
    backend = ReleasingBackend()
    server = make_server(backend_impl=backend)
    async with ws_connect(ws_url(server)) as ws:
        await ws.send(json.dumps({"type": "response.create", "model": "simulated-1", "input": "hi", "store": False}))
        while json.loads(await asyncio.wait_for(ws.recv(), 5))["type"] != "response.completed":
            pass
        (connection,) = server.shim.connections
    deadline = time.perf_counter() + 2
    while not backend.released:
        assert time.perf_counter() < deadline, "the backend was never told the connection closed"
        await asyncio.sleep(0.01)
    assert backend.released == [connection.id]
