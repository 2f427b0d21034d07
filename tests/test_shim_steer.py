"""`response.steer` over WebSocket, driven by the SDK's `conn.response.steer()`: accepted at once,
a steered stop at a safe boundary with an automatic successor, pending after tool calls, and failures."""

from __future__ import annotations

import json

import pytest
from openai import AsyncOpenAI
from support.wire import API_KEY, LOOKUP_TOOL, MODEL, recv_event, run_turn, send_raw, user

from server_shim.steer import MAX_QUEUED, Steering


@pytest.fixture
def slow_server(make_server, recorder):
    """Tokens paced at 200/s, so a 100-token answer runs half a second: time to steer it."""
    return make_server(validators=[recorder], simulated_tokens_per_s=200.0, simulated_ttft_s=0.05)


@pytest.fixture
async def slow_client(slow_server):
    async with AsyncOpenAI(base_url=slow_server.base_url, api_key=API_KEY, max_retries=0) as sdk:
        yield sdk


async def read_until(conn, kinds, seen):
    while True:
        event = await recv_event(conn)
        seen.append(event)
        if event["type"] in kinds:
            return event


async def test_a_steer_is_accepted_at_once_stops_at_a_safe_boundary_and_the_successor_continues(
    slow_client, slow_server, recorder
):
    async with slow_client.responses.connect() as conn:
        await conn.response.create(model=MODEL, input="write a long story", max_output_tokens=100, store=False)
        seen: list[dict] = []
        created = await read_until(conn, {"response.created"}, seen)
        parent = created["response"]["id"]
        await read_until(conn, {"response.output_text.delta"}, seen)
        await conn.response.steer(previous_response_id=parent, input="actually, stop and say hi")

        accepted = await read_until(conn, {"response.steer.accepted"}, seen)
        assert accepted["steer"]["previous_response_id"] == parent and accepted["steer"]["id"]
        assert not any(e["type"] in ("response.incomplete", "response.completed") for e in seen), "acked at once"

        stopped = await read_until(conn, {"response.incomplete", "response.completed"}, seen)
        assert stopped["type"] == "response.incomplete"
        assert stopped["response"]["incomplete_details"] == {"reason": "steered"}
        (message,) = stopped["response"]["output"]
        assert message["status"] == "completed" and 0 < len(message["content"][0]["text"].split()) < 100

        successor = await read_until(conn, {"response.created"}, seen)
        assert successor["response"]["previous_response_id"] == parent
        assert successor["response"]["max_output_tokens"] == 100, "the successor inherits the settings"
        done = await read_until(conn, {"response.completed"}, seen)
        assert done["response"]["id"] == successor["response"]["id"]
    assert recorder.last.items == [user("actually, stop and say hi")]
    assert recorder.last.previous_id == parent


async def test_a_steer_whose_items_a_create_would_refuse_fails_at_once_and_the_response_runs_on(slow_client):
    async with slow_client.responses.connect() as conn:
        await conn.response.create(model=MODEL, input="write a long story", max_output_tokens=100, store=False)
        seen: list[dict] = []
        parent = (await read_until(conn, {"response.created"}, seen))["response"]["id"]
        await read_until(conn, {"response.output_text.delta"}, seen)
        bad = [{"role": "user", "content": [{"type": "input_text", "text": 5}]}]
        await send_raw(conn, {"type": "response.steer", "previous_response_id": parent, "input": bad})
        while True:  # the failure carries the input as sent, which the SDK cannot parse: read raw
            event = json.loads(await conn.recv_bytes())
            if event["type"].startswith("response.steer."):
                break
        assert event["type"] == "response.steer.failed" and event["error"]["code"] == "invalid_input"
        assert "text" in event["error"]["message"]
        done = await read_until(conn, {"response.completed", "response.incomplete"}, seen)
        assert done["type"] == "response.completed" and done["response"]["id"] == parent
        assert len(done["response"]["output"][0]["content"][0]["text"].split()) == 100


async def test_chaining_from_a_response_still_running_on_another_lane_says_so_and_works_once_it_ends(slow_client):
    async with slow_client.responses.connect() as conn:
        await conn.response.create(model=MODEL, input="write a long story", max_output_tokens=100, stream_id="a")
        seen: list[dict] = []
        parent = (await read_until(conn, {"response.created"}, seen))["response"]["id"]
        await conn.response.create(model=MODEL, input="and then?", previous_response_id=parent, stream_id="b")
        refused = await read_until(conn, {"error"}, seen)
        assert refused["stream_id"] == "b" and refused["status"] == 409
        assert refused["error"]["code"] == "previous_response_in_progress"
        assert refused["error"]["param"] == "previous_response_id"
        done = await read_until(conn, {"response.completed"}, seen)
        assert done["response"]["id"] == parent and not any(e["type"] == "response.created" for e in seen[1:])
        await conn.response.create(model=MODEL, input="and then?", previous_response_id=parent, stream_id="b")
        chained = await read_until(conn, {"response.completed"}, seen)
        assert chained["response"]["previous_response_id"] == parent


async def test_a_steer_during_a_tool_call_stays_pending_and_is_prepended_to_the_next_request(make_server, recorder):
    server = make_server(validators=[recorder], simulated_tokens_per_s=4.0)  # a call's two pieces, 250 ms apart
    async with (
        AsyncOpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0) as sdk,
        sdk.responses.connect() as conn,
    ):
        await conn.response.create(
            model=MODEL, input='call lookup {"n": 7}', tools=[LOOKUP_TOOL], store=False, stream_id="agent-1"
        )
        seen: list[dict] = []
        created = await read_until(conn, {"response.created"}, seen)
        parent = created["response"]["id"]
        await read_until(conn, {"response.function_call_arguments.delta"}, seen)
        await conn.response.steer(
            previous_response_id=parent, input=[{"type": "message", "role": "user", "content": "use metric units"}]
        )
        accepted = await read_until(conn, {"response.steer.accepted"}, seen)
        assert accepted["stream_id"] == "agent-1", "the target response decides the lane"

        completed = await read_until(conn, {"response.completed", "response.incomplete"}, seen)
        assert completed["type"] == "response.completed"
        (call,) = completed["response"]["output"]
        pending = await recv_event(conn)
        assert pending["type"] == "response.steer.pending" and pending["reason"] == "waiting_for_required_input"
        assert pending["required_input"] == [
            {"type": "function_call_output", "call_id": call["call_id"], "name": "lookup"}
        ]
        assert pending["steer"]["id"] == accepted["steer"]["id"]

        output = {"type": "function_call_output", "call_id": call["call_id"], "output": "seven"}
        turn = await run_turn(
            conn, input=[output], previous_response_id=parent, tools=[LOOKUP_TOOL], store=False, stream_id="agent-1"
        )
        assert turn.types[-1] == "response.completed"
    assert recorder.last.items == [{"type": "message", "role": "user", "content": "use metric units"}, output]


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        ({"previous_response_id": "resp_nope", "input": "hi"}, "response_not_found"),
        ({"previous_response_id": "PARENT", "input": "hi"}, "response_already_completed"),
        ({"previous_response_id": "PARENT", "input": [{"role": "assistant", "content": "x"}]}, "invalid_input"),
        ({"previous_response_id": "PARENT", "input": []}, "invalid_input"),
        ({"previous_response_id": "PARENT", "input": "hi", "stream_id": "a"}, "invalid_input"),
        (
            {
                "previous_response_id": "PARENT",
                "input": [{"type": "function_call_output", "call_id": "c", "output": "x"}],
            },
            "invalid_input",
        ),
    ],
)
async def test_a_refused_steer_returns_its_input_with_a_documented_code_and_the_chain_continues(
    client, server, frame, code
):
    async with client.responses.connect() as conn:
        first = await run_turn(conn, input="hi", store=False)
        frame = {"type": "response.steer", **frame}
        if frame["previous_response_id"] == "PARENT":
            frame["previous_response_id"] = first.id
        await send_raw(conn, frame)
        # an invalid input is returned as sent, so it cannot parse as the SDK's input type: read it raw
        failed = json.loads(await conn.recv_bytes()) if code == "invalid_input" else await recv_event(conn)
        assert failed["type"] == "response.steer.failed"
        assert failed["error"]["code"] == code and failed["error"]["type"] == "invalid_request_error"
        assert failed["steer"]["input"] == frame["input"] and "id" not in failed["steer"]
        assert failed["steer"]["previous_response_id"] == frame["previous_response_id"]
        second = await run_turn(conn, input="more", previous_response_id=first.id, store=False)
        assert second.types[-1] == "response.completed"


# --- the decisions alone (server_shim/steer.py, no socket) ---------------------------------------


def test_a_steer_on_a_response_that_then_completes_normally_goes_to_the_successor():
    steering = Steering()
    slot = steering.begin("resp_1", "lane")
    accepted = steering.submit({"type": "response.steer", "previous_response_id": "resp_1", "input": "more"})
    assert accepted["type"] == "response.steer.accepted" and accepted["stream_id"] == "lane"
    events, successor = steering.end(slot, {"status": "completed", "output": [{"type": "message"}]})
    assert events == [] and [s.items for s in successor] == [[user("more")]]
    late = steering.submit({"type": "response.steer", "previous_response_id": "resp_1", "input": "late"})
    assert late["error"]["code"] == "response_already_completed"


def test_custom_tool_calls_give_their_own_required_input_stubs_and_steers_wait_in_order():
    steering = Steering()
    slot = steering.begin("resp_1", None)
    for text in ("one", "two"):
        steering.submit({"type": "response.steer", "previous_response_id": "resp_1", "input": text})
    output = [{"type": "custom_tool_call", "call_id": "ct_1", "name": "apply_patch", "input": "x"}]
    events, successor = steering.end(slot, {"status": "completed", "output": output})
    assert successor == [] and [e["type"] for e in events] == ["response.steer.pending"] * 2
    assert events[0]["required_input"] == [{"type": "custom_tool_call_output", "call_id": "ct_1"}]
    assert [item["content"] for s in steering.take_pending("resp_1") for item in s.items] == ["one", "two"]
    assert steering.take_pending("resp_1") == []


def test_steers_on_a_failed_response_are_returned_and_a_full_queue_refuses_more():
    steering = Steering()
    slot = steering.begin("resp_1", None)
    for _ in range(MAX_QUEUED):
        steering.submit({"type": "response.steer", "previous_response_id": "resp_1", "input": "x"})
    refused = steering.submit({"type": "response.steer", "previous_response_id": "resp_1", "input": "y"})
    assert refused["error"]["code"] == "too_many_pending_steers"
    events, successor = steering.end(slot, {"status": "failed", "output": []})
    assert successor == [] and {e["error"]["code"] for e in events} == {"response_not_active"}
    assert all(e["steer"]["id"] for e in events), "failures after acceptance carry the steering id"
