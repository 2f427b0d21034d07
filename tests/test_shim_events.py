"""Building events from deltas: each event and the Response object validate as the SDK's own types."""

from __future__ import annotations

import pytest
from openai.types.responses import ResponseOutputItem
from pydantic import TypeAdapter
from support.wire import RESPONSE, strict_sse_event, strict_ws_event

from server_shim.backends.base import Finish, TextDelta, ToolCallDelta, Usage
from server_shim.events import EventSequence, OutputAssembler, response_object
from server_shim.requests import CreateRequest

OUTPUT_ITEM = TypeAdapter(ResponseOutputItem)


def assemble(deltas, stream_id=None, status="completed"):
    seq = EventSequence(stream_id)
    assembler = OutputAssembler(seq)
    events = [event for delta in deltas for event in assembler.feed(delta)]
    events += assembler.close(status)
    for event in events:
        strict_ws_event(event)
        strict_sse_event(event)
    for item in assembler.output:
        OUTPUT_ITEM.validate_python(item)
    return assembler, events


def test_sequence_numbers_count_from_zero_and_the_lane_is_echoed():
    seq = EventSequence("lane-1")
    events = [seq("response.created"), seq("response.in_progress")]
    assert [e["sequence_number"] for e in events] == [0, 1]
    assert all(e["stream_id"] == "lane-1" for e in events)
    assert "stream_id" not in EventSequence()("response.created")


def test_text_deltas_open_one_message_and_close_it_with_the_full_text():
    assembler, events = assemble([TextDelta("Hel"), TextDelta("lo")])
    assert [e["type"] for e in events] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    (item,) = assembler.output
    assert item["content"][0]["text"] == "Hello" and item["status"] == "completed"
    assert events[0]["item"]["content"] == [] and events[0]["item"]["status"] == "in_progress"


def test_tool_call_pieces_become_argument_deltas_of_one_item():
    assembler, events = assemble([ToolCallDelta(0, '{"a"', call_id="call_1", name="f"), ToolCallDelta(0, ": 1}")])
    assert [e["type"] for e in events] == [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
    ]
    (item,) = assembler.output
    assert (item["call_id"], item["name"], item["arguments"]) == ("call_1", "f", '{"a": 1}')


def test_parallel_calls_by_index_and_text_around_them_keep_their_output_indexes():
    assembler, events = assemble(
        [
            TextDelta("Let me look."),
            ToolCallDelta(0, "{}", call_id="c0", name="f"),
            ToolCallDelta(1, "{}", call_id="c1", name="g"),
            TextDelta("Meanwhile..."),
        ]
    )
    assert [i["type"] for i in assembler.output] == ["message", "function_call", "function_call", "message"]
    done = [e["output_index"] for e in events if e["type"] == "response.output_item.done"]
    assert sorted(done) == [0, 1, 2, 3]
    for event in events:
        if "item_id" in event:
            assert assembler.output[event["output_index"]]["id"] == event["item_id"]


def test_a_call_without_an_id_gets_one_and_a_late_name_is_kept():
    assembler, _ = assemble([ToolCallDelta(0, "{"), ToolCallDelta(0, "}", name="late")])
    (item,) = assembler.output
    assert item["call_id"].startswith("call_") and item["name"] == "late"


def test_closing_a_failed_stream_marks_open_items_incomplete():
    assembler, events = assemble([TextDelta("partial")], status="incomplete")
    assert assembler.output[0]["status"] == "incomplete"
    assert events[-1]["item"]["status"] == "incomplete"


def test_usage_and_finish_are_recorded_not_emitted():
    assembler, events = assemble([Usage(10, 2, 4), Finish("length")])
    assert events == [] and assembler.output == []
    assert assembler.usage == Usage(10, 2, 4) and assembler.finish == "length"


@pytest.mark.parametrize("status", ["in_progress", "completed", "incomplete", "failed"])
def test_the_response_object_validates_as_the_sdks_response(status):
    request = CreateRequest(
        model="m", instructions="be brief", metadata={"k": "v"}, tools=[{"type": "function", "name": "f"}], store=False
    )
    body = response_object(
        "resp_1",
        request,
        status=status,
        usage=Usage(10, 5, 3),
        error={"code": "server_error", "message": "x"} if status == "failed" else None,
        incomplete_reason="max_output_tokens" if status == "incomplete" else None,
    )
    response = RESPONSE.validate_python(body)
    assert response.status == status and response.store is False
    assert response.usage.total_tokens == 15 and response.usage.input_tokens_details.cached_tokens == 3
    assert (body["completed_at"] is None) is (status == "in_progress")


def test_classifier_labels_are_merged_into_the_metadata():
    body = response_object(
        "resp_1", CreateRequest(model="m", metadata={"a": "1"}), status="completed", labels={"b": "2"}
    )
    assert body["metadata"] == {"a": "1", "b": "2"}


def test_ids_are_128_random_bits_never_repeated_and_a_forked_worker_draws_its_own():
    import os
    import re

    from server_shim.events import new_id

    ids = [new_id("resp") for _ in range(5000)]  # several batches
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"resp_[0-9a-f]{32}", i) for i in ids)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child's next id must not be the one the parent draws next
        os.write(write, new_id("resp").encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    child = os.read(read, 100).decode()
    os.close(read)
    assert child != new_id("resp") and re.fullmatch(r"resp_[0-9a-f]{32}", child)


def test_echoed_fields_are_what_model_dump_gives_for_any_request_shape():
    """The echo reads attributes and extras (no `model_dump` per turn): the same Response fields, in the same order."""
    import orjson
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from server_shim.events import ECHO_DEFAULTS, ECHOED_FIELDS, echoed_fields

    def by_model_dump(request: CreateRequest) -> dict:
        given_fields = request.model_dump(include=set(ECHOED_FIELDS), exclude_none=True)
        fields = {**ECHO_DEFAULTS, **given_fields, "model": request.model, "store": request.stores}
        for nested in ("reasoning", "text"):
            if nested in given_fields:
                fields[nested] = {**ECHO_DEFAULTS[nested], **given_fields[nested]}
        if fields["service_tier"] == "auto":
            fields["service_tier"] = "default"
        return fields

    json = st.recursive(
        st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.text(max_size=5)),
        lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)),
        max_leaves=6,
    )
    optional = {
        "instructions": st.one_of(st.none(), st.text(max_size=5)),
        "previous_response_id": st.one_of(st.none(), st.text(min_size=1, max_size=5)),
        "tools": st.one_of(st.none(), st.lists(st.dictionaries(st.text(max_size=4), json, max_size=2), max_size=2)),
        "store": st.one_of(st.none(), st.booleans()),
        "temperature": st.one_of(st.none(), st.floats(0, 2)),
        "metadata": st.one_of(st.none(), st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2)),
        "text": st.one_of(st.none(), st.fixed_dictionaries({}, optional={"verbosity": json})),
        "reasoning": st.one_of(st.none(), st.dictionaries(st.sampled_from(["effort", "summary", "x"]), json)),
        "service_tier": st.one_of(st.none(), st.sampled_from(["auto", "default", "flex"])),
        "prompt": json,
        "conversation": json,
        "unknown_field": json,
    }

    @settings(max_examples=200, deadline=None)
    @given(st.fixed_dictionaries({"model": st.text(min_size=1, max_size=5)}, optional=optional))
    def check(body):
        request = CreateRequest.model_validate(body)
        assert orjson.dumps(echoed_fields(request)) == orjson.dumps(by_model_dump(request))

    check()
