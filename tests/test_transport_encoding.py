"""`encode_items`, the encoder of input items: the JSON the SDK's own transform and encoder would send.

The reference is what the installed `openai` client itself puts in the body of `responses.create`
(read off the httpx request it builds, before anything is sent): equal JSON for every input the
SDK can send, the same exception where the SDK refuses one. Inputs that plain JSON cannot carry
faithfully take the SDK's transform (`is_plain` is False for them).
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import json
import math
import uuid
from collections.abc import Callable
from typing import Any

import openai
import orjson
import pytest
from openai._models import construct_type
from openai.types.responses import (
    EasyInputMessageParam,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseReasoningItem,
)

import ws_transport
from server_shim import BackgroundServer, Settings, create_app
from ws_transport.turn import encode_items, is_plain


class Captured(Exception):
    """Stops the SDK's request once its body is read: nothing goes on any wire."""

    def __init__(self, body: bytes) -> None:
        self.body = body


def _capture(request: Any) -> None:
    raise Captured(request.read())


def sdk_input(items: Any) -> Any:
    """The `input` the SDK's `responses.create` puts in its request body."""
    client = openai.OpenAI(
        base_url="http://127.0.0.1:9/v1",
        api_key="k",
        max_retries=0,
        http_client=openai.DefaultHttpxClient(event_hooks={"request": [_capture]}),
    )
    try:
        client.responses.create(model="m", input=items)
    except Exception as exc:  # openai 1.x/2.x wrap what a hook raises in APIConnectionError
        captured = exc if isinstance(exc, Captured) else exc.__cause__
        if not isinstance(captured, Captured):
            raise
        return json.loads(captured.body)["input"]
    raise AssertionError("the SDK sent nothing")


class Color(enum.StrEnum):
    RED = "red"


@dataclasses.dataclass
class Point:
    x: int


def call_item(**extra: Any) -> ResponseFunctionToolCall:
    fields = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"n": 1}', "id": "fc_1"}
    return construct_type(type_=ResponseFunctionToolCall, value={**fields, "status": "completed", **extra})  # type: ignore[no-any-return]


def message_item() -> ResponseOutputMessage:
    content = [{"type": "output_text", "text": "hi", "annotations": []}]
    value = {"type": "message", "id": "m1", "role": "assistant", "status": "completed", "content": content}
    return construct_type(type_=ResponseOutputMessage, value=value)  # type: ignore[no-any-return]


def output(value: Any) -> list[dict[str, Any]]:
    return [{"type": "function_call_output", "call_id": "c1", "output": value}]


PLAIN: dict[str, Callable[[], Any]] = {
    "string input": lambda: "hello",
    "messages": lambda: [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hey"}],
    "content parts, non-ASCII": lambda: [
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "é ✓ \u2028"},
                {"type": "input_image", "image_url": "data:x", "detail": "auto"},
            ],
        }
    ],
    "TypedDicts": lambda: [EasyInputMessageParam(role="user", content="hi", type="message")],
    "SDK output models": lambda: [
        call_item(),
        message_item(),
        ResponseReasoningItem(type="reasoning", id="rs_1", summary=[]),
    ],
    "tuples": lambda: [{"role": "user", "content": ({"type": "input_text", "text": "a"},)}],
    "str enum": lambda: [{"role": "user", "content": Color.RED}],
    "numbers": lambda: output([1, -(2**63), 2**64 - 1, 0.1, 1e16, 1.5e-7, True, None]),
    "nested as deep as orjson writes": lambda: output(nested(250, "x")),
}
NOT_PLAIN: dict[str, Callable[[], Any]] = {
    "an iterator of parts": lambda: [{"role": "user", "content": iter([{"type": "input_text", "text": "a"}])}],
    "an aware datetime": lambda: output(datetime.datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=datetime.UTC)),
    "a naive datetime": lambda: output(datetime.datetime(2024, 1, 2, 3, 4, 5)),
    "integer keys": lambda: output({1: "a"}),
    "an integer over 64 bits": lambda: output(2**70),
    "NaN": lambda: output([0.5, math.nan]),
    "infinity": lambda: output(math.inf),
    "a date": lambda: output(datetime.date(2024, 1, 2)),
    "a UUID": lambda: output(uuid.UUID(int=1)),
    "a dataclass": lambda: output(Point(1)),
    "a Decimal": lambda: output(decimal.Decimal("1.5")),
    "a set": lambda: output({"a"}),
}


def nested(depth: int, value: Any) -> Any:
    for _ in range(depth):
        value = [value]
    return value


def outcome(encode: Callable[[], Any]) -> Any:
    """The JSON sent, or the exception raised instead (type and message)."""
    try:
        return encode()
    except Exception as exc:
        return type(exc), str(exc)


@pytest.mark.parametrize("name", [*PLAIN, *NOT_PLAIN])
def test_encoded_items_equal_what_the_sdk_sends_or_fail_as_it_fails(name: str) -> None:
    make = {**PLAIN, **NOT_PLAIN}[name]
    ours = outcome(lambda: orjson.loads(encode_items(make())))
    assert ours == outcome(lambda: sdk_input(make()))


def test_json_nested_deeper_than_orjson_writes_is_encoded_or_refused_as_the_sdk_does() -> None:
    items = output(nested(300, "x"))
    assert outcome(lambda: orjson.loads(encode_items(items))) == outcome(lambda: sdk_input(items))


@pytest.mark.parametrize("name", list(PLAIN))
def test_plain_json_and_sdk_models_take_the_fast_path(name: str) -> None:
    assert is_plain(PLAIN[name]())


@pytest.mark.parametrize("name", list(NOT_PLAIN))
def test_what_plain_json_cannot_carry_faithfully_takes_the_sdk_transform(name: str) -> None:
    assert not is_plain(NOT_PLAIN[name]())


def test_an_aliased_model_field_goes_out_once_under_its_api_name() -> None:
    """Where the SDK's transform is not what the API expects, the API wins: openai 3.x sends a
    `ResponseFunctionToolCall`'s `async` both as `async_` (its Python name) and as `async`."""
    item = call_item(**{"async": True})
    ours = orjson.loads(encode_items([item]))[0]
    assert ours["async"] is True and "async_" not in ours
    assert {k: v for k, v in sdk_input([item])[0].items() if k != "async_"} == ours


def test_a_chained_frame_carries_the_new_items_as_the_sdk_encodes_them() -> None:
    """A datetime in a new item: openai 3.x sends it in ISO format, 1.x/2.x refuse it; the wrapped client does the same."""
    stamp = datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
    new: list[Any] = [{"role": "user", "content": [{"type": "input_text", "text": stamp}]}]
    expected = outcome(lambda: sdk_input(new))
    settings = Settings(usage_ledger="off")
    frames: list[dict[str, Any]] = []
    with BackgroundServer(create_app(settings), settings) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0)
        with ws_transport.wrap(client, on_request=frames.append) as wrapped:
            history: list[Any] = [{"role": "user", "content": "hello"}]
            first = wrapped.responses.create(model="simulated-1", input=history)
            got = outcome(lambda: wrapped.responses.create(model="simulated-1", input=[*history, *first.output, *new]))
            after = wrapped.responses.create(
                model="simulated-1", input=[*history, *first.output, {"role": "user", "content": "ok"}]
            )
    assert after.status == "completed", "the session is sound after the turn"
    if isinstance(expected, tuple):
        assert got == expected
    else:
        assert frames[1]["previous_response_id"] == first.id
        assert frames[1]["input"] == expected
