"""The chaining rule and frame building on their own: no sockets, no server."""

from __future__ import annotations

import orjson
import pytest
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage

from ws_transport.chaining import ChainBook, same_item, starts_with
from ws_transport.turn import TurnRequest, _splice

TOOLS = [{"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {}}}]
PARAMS = {"model": "m", "tools": TOOLS, "store": False}


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def output_message(text: str, item_id: str = "msg_1") -> dict:
    return {
        "type": "message",
        "id": item_id,
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def book_after_one_turn() -> tuple[ChainBook, list, dict]:
    book = ChainBook()
    history = [user("hi")]
    plan = book.plan(dict(PARAMS), history)
    output = output_message("hello")
    book.record(plan, "resp_1", [output], nbytes=100, generation=1)
    return book, history, output


def test_first_turn_has_no_chain_and_sends_everything() -> None:
    plan = ChainBook().plan(dict(PARAMS), [user("hi")])
    assert plan.chain is None
    assert plan.new_items == [user("hi")]


def test_history_plus_output_plus_new_item_chains_with_only_the_new_item() -> None:
    book, history, output = book_after_one_turn()
    plan = book.plan(dict(PARAMS), [*history, output, user("next")])
    assert plan.chain is not None and plan.chain.response_id == "resp_1"
    assert plan.new_items == [user("next")]


def test_rebuilt_equal_dicts_chain_as_well_as_the_same_objects() -> None:
    book, _, _ = book_after_one_turn()
    rebuilt = [user("hi"), output_message("hello"), user("next")]
    assert book.plan(dict(PARAMS), rebuilt).new_items == [user("next")]


def test_output_dumped_by_the_sdk_with_nulls_still_matches() -> None:
    book = ChainBook()
    plan = book.plan(dict(PARAMS), [user("hi")])
    call = {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "lookup", "arguments": "{}", "status": None}
    book.record(plan, "resp_1", [call], nbytes=10, generation=1)
    model = ResponseFunctionToolCall.model_validate({k: v for k, v in call.items() if v is not None})
    dumped = model.model_dump()  # every optional field present, as None
    follow = {"type": "function_call_output", "call_id": "c1", "output": "42"}
    assert book.plan(dict(PARAMS), [user("hi"), dumped, follow]).new_items == [follow]


def test_changed_non_input_field_sends_the_full_input() -> None:
    book, history, output = book_after_one_turn()
    plan = book.plan({**PARAMS, "instructions": "be brief"}, [*history, output, user("next")])
    assert plan.chain is None
    assert len(plan.new_items) == 3


def test_a_field_changed_in_place_between_calls_ends_the_chain() -> None:
    """Review finding: a `tools` list or `metadata` dict mutated in place compared equal to itself, and the
    chain's fields (encoded on the first call) went out stale. The chain keeps a copy to compare with."""
    tools = [{"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}]
    metadata = {"step": "1"}
    book = ChainBook()
    history = [user("hi")]
    plan = book.plan({"model": "m", "tools": tools, "metadata": metadata}, history)
    book.record(plan, "resp_1", [output_message("hello")], nbytes=100, generation=1)
    later = [*history, output_message("hello"), user("next")]
    assert book.plan({"model": "m", "tools": tools, "metadata": metadata}, later).chain is not None
    metadata["step"] = "2"
    assert book.plan({"model": "m", "tools": tools, "metadata": metadata}, later).chain is None
    metadata["step"] = "1"
    tools[0]["parameters"]["properties"]["x"] = {"type": "string"}
    assert book.plan({"model": "m", "tools": tools, "metadata": metadata}, later).chain is None


def test_edited_history_sends_the_full_input() -> None:
    book, _, output = book_after_one_turn()
    plan = book.plan(dict(PARAMS), [user("hi, edited"), output, user("next")])
    assert plan.chain is None


def test_caller_previous_response_id_passes_through_and_is_not_recorded() -> None:
    book = ChainBook()
    plan = book.plan({**PARAMS, "previous_response_id": "resp_x"}, [user("hi")])
    assert plan.chain is None and not plan.recordable
    assert book.record(plan, "resp_2", [], nbytes=0, generation=1) is None
    assert len(book) == 0


def test_a_previous_response_id_of_none_chooses_nothing_and_the_turn_chains() -> None:
    """LlamaIndex's OpenAIResponses sends `previous_response_id=None` on every call."""
    params = {**PARAMS, "previous_response_id": None}
    book = ChainBook()
    first = book.plan(params, [user("hi")])
    assert first.recordable
    book.record(first, "resp_1", [output_message("hello")], nbytes=10, generation=1)
    second = book.plan(params, [user("hi"), output_message("hello"), user("next")])
    assert second.chain is not None and second.new_items == [user("next")]


def test_string_input_is_one_user_message_and_the_next_list_turn_chains() -> None:
    book = ChainBook()
    plan = book.plan(dict(PARAMS), "hi")
    output = output_message("hello")
    book.record(plan, "resp_1", [output], nbytes=10, generation=1)
    assert book.plan(dict(PARAMS), [user("hi"), output, user("more")]).new_items == [user("more")]


def test_a_recorded_chain_replaces_the_one_it_extended() -> None:
    book, history, output = book_after_one_turn()
    plan = book.plan(dict(PARAMS), [*history, output, user("next")])
    book.record(plan, "resp_2", [output_message("again", "msg_2")], nbytes=10, generation=1)
    assert len(book) == 1


def test_two_conversations_find_their_own_chain() -> None:
    book = ChainBook()
    a, b = [user("a")], [user("b")]
    book.record(book.plan(dict(PARAMS), a), "resp_a", [output_message("A", "msg_a")], nbytes=1, generation=1)
    book.record(book.plan(dict(PARAMS), b), "resp_b", [output_message("B", "msg_b")], nbytes=1, generation=1)
    plan = book.plan(dict(PARAMS), [user("a"), output_message("A", "msg_a"), user("a2")])
    assert plan.chain is not None and plan.chain.response_id == "resp_a"


def test_book_is_bounded() -> None:
    book = ChainBook(capacity=2)
    for n in range(5):
        book.record(book.plan(dict(PARAMS), [user(str(n))]), f"resp_{n}", [], nbytes=0, generation=1)
    assert len(book) == 2


def test_adopted_sdk_objects_match_by_identity() -> None:
    book = ChainBook()
    plan = book.plan(dict(PARAMS), [user("hi")])
    chain = book.record(plan, "resp_1", [output_message("hello")], nbytes=1, generation=1)
    assert chain is not None
    sdk_item = ResponseOutputMessage.model_validate(output_message("hello"))
    book.adopt_output(chain, [sdk_item])
    assert chain.prefix[-1] is sdk_item
    assert book.plan(dict(PARAMS), [plan.items[0], sdk_item, user("x")]).new_items == [user("x")]


def test_same_item_rejects_different_ids_without_a_deep_compare() -> None:
    assert not same_item(output_message("same", "msg_1"), output_message("same", "msg_2"))
    assert same_item(user("x"), {"type": "message", "role": "user", "content": "x"})


def test_output_replayed_in_a_frameworks_own_shape_is_the_same_item() -> None:
    """pydantic-ai and others replay a call without id/status and with re-serialized arguments,
    and an answer as a plain string: the same items as the server's output."""
    server_call = {
        "id": "fc_1",
        "type": "function_call",
        "status": "completed",
        "call_id": "c1",
        "name": "lookup",
        "arguments": '{"n": 3, "x": [1]}',
    }
    replayed_call = {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": '{"x":[1],"n":3}'}
    assert same_item(replayed_call, server_call)
    assert same_item({"role": "assistant", "content": "It is 3."}, output_message("It is 3."))
    assert not same_item({**replayed_call, "arguments": '{"n":4,"x":[1]}'}, server_call)
    assert not same_item({"role": "assistant", "content": "It is 4."}, output_message("It is 3."))
    assert not same_item({"role": "user", "content": "It is 3."}, output_message("It is 3."))


def test_starts_with_needs_a_non_empty_matching_prefix() -> None:
    items = [user("a"), user("b")]
    assert starts_with(items, [user("a")])
    assert not starts_with(items, [])
    assert not starts_with(items, [user("b")])


class Uncomparable(dict):  # type: ignore[type-arg]
    """An item whose `==` raises (as a numpy array's truth value does)."""

    def __eq__(self, other: object) -> bool:
        raise ValueError("cannot compare")

    __hash__ = None  # type: ignore[assignment]


def test_starts_with_compares_the_older_items_as_a_list_first_then_item_by_item() -> None:
    older = [user("a"), output_message("b"), user("c")]
    newest = output_message("d", "msg_2")
    assert starts_with([*older, newest, user("e")], [*older, newest]), "the same objects"
    rebuilt = [dict(item) for item in older]
    assert starts_with([*rebuilt, newest, user("e")], [*older, newest]), "equal dicts"
    replayed = [user("a"), {"role": "assistant", "content": "b"}, user("c")]  # a framework's own shape of `b`
    assert starts_with([*replayed, newest], [*older, newest]), "not equal as lists, the same items one by one"
    assert not starts_with([user("a"), output_message("x"), user("c"), newest], [*older, newest])
    odd = Uncomparable(user("a"))
    assert starts_with([odd, newest, user("e")], [odd, newest]), "identity, without calling its =="
    assert not starts_with([Uncomparable(user("a")), newest], [user("z"), newest])


def test_chained_frame_carries_only_new_items_and_the_lane() -> None:
    book, history, output = book_after_one_turn()
    full = [*history, output, user("next")]
    turn = TurnRequest(dict(PARAMS), book.plan(dict(PARAMS), full), full, stream=False)
    frame, http_equivalent = turn.frame("t1", chained=True)
    event = orjson.loads(frame)
    assert event["type"] == "response.create"
    assert event["previous_response_id"] == "resp_1"
    assert event["stream_id"] == "t1"
    assert event["input"] == [user("next")]
    assert http_equivalent == len(frame) + 100


def test_full_frame_is_the_http_body_with_type_and_lane() -> None:
    body = orjson.dumps({"model": "m", "input": [user("hi")], "stream": True})
    turn = TurnRequest(
        {"model": "m"}, ChainBook().plan({"model": "m"}, [user("hi")]), [user("hi")], True, http_body_bytes=body
    )
    frame, http_equivalent = turn.frame("t9", chained=False)
    assert orjson.loads(frame) == {"type": "response.create", "stream_id": "t9", **orjson.loads(body)}
    assert http_equivalent == len(body)


@pytest.mark.parametrize("body", [b"{}", b" { } ", b'{"model":"m"}'])
@pytest.mark.parametrize("stream_id", [None, "t1"])
def test_an_http_body_becomes_a_valid_frame(body: bytes, stream_id: str | None) -> None:
    frame = orjson.loads(_splice(body, stream_id))
    assert frame["type"] == "response.create"
    assert frame.get("stream_id") == stream_id
    assert {k: v for k, v in frame.items() if k not in ("type", "stream_id")} == orjson.loads(body)
