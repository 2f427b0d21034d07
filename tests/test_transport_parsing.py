"""`ws_transport.parsing`: the SDK's `Response` built by pydantic-core is the object the SDK's own parser builds.

The reference is the installed SDK's non-strict parser (`construct_type`, what
`client._process_response_data` runs for a JSON body). Compared field by field, with the fields
each model records as set and its extra fields (`tests/support/sdk_shapes.difference`), over:
random JSON of every shape the installed SDK's `Response` annotations allow, mutants of it
(fields dropped, added, retyped; unknown item types), the cases the fast path must leave to the
SDK (a field the SDK marks required missing, an integer a float cannot hold), and the responses
the shim itself sends for every kind of turn, which must take the fast path.
"""

from __future__ import annotations

import asyncio
import copy
import json
import random
import typing
import urllib.request
from collections.abc import Iterator
from typing import Any, Literal

import httpx2
import orjson
import pytest
from openai import AsyncOpenAI, OpenAI, Stream
from openai._models import BaseModel as SDKModel
from openai._models import add_request_id, construct_type
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter
from pydantic_core import SchemaError, SchemaValidator

import ws_transport
from server_shim import BackgroundServer, Settings, create_app
from tests.support.sdk_shapes import difference, shape
from ws_transport import _http, _sdk, parsing
from ws_transport.replies import SSE_HEADERS, AsyncEventBody, EventBody, sse_event, sse_frame

MODEL = "simulated-1"
WRONG_VALUES = (1, "1", 1.0, 2.5, "2.5", True, "true", None, [], {}, "x", 2**70, -1, 2**53 + 1, {"type": "zz"})


def sdk_parse(cls: type[Any], data: Any) -> Any:
    """What the SDK's parser makes of a JSON body for `cls` (a client without strict response validation)."""
    return construct_type(type_=cls, value=data)


def sdk_response(client: OpenAI, data: dict[str, Any]) -> Response:
    """The `Response` the SDK makes of a JSON body with no request id (what `_sdk.parse_response` replaces)."""
    parsed: Response = client._process_response_data(data=data, cast_to=Response, response=None)  # type: ignore[arg-type]
    add_request_id(parsed, None)
    return parsed


def fast_client(**options: Any) -> OpenAI:
    """A client whose parser `wrap()` made fast (no socket needed for parsing)."""
    client = OpenAI(api_key="k", base_url="http://127.0.0.1:9/v1", **options)
    _sdk.parse_faster(client)
    return client


def assert_same_as_sdk(cls: type[Any], data: Any) -> Any:
    """The fast parse, when it answers, is the SDK's object; returns it (None: the SDK's parser decides)."""
    reference = copy.deepcopy(data)
    fast = parsing.parse(cls, data)
    assert data == reference, "parsing must not change the JSON it reads"
    if fast is not None:
        assert difference(fast, sdk_parse(cls, data)) is None, difference(fast, sdk_parse(cls, data))
        assert fast == sdk_parse(cls, data)
    return fast


def test_the_installed_sdks_response_has_a_fast_path() -> None:
    assert parsing.Model.build(Response) is not None


@pytest.mark.parametrize("seed", range(300))
def test_every_valid_shape_of_the_sdks_response_parses_fast_to_the_sdks_object(seed: int) -> None:
    data = shape(Response, random.Random(seed))
    assert assert_same_as_sdk(Response, data) is not None, "valid JSON of every shape takes the fast path"


def _paths(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield path
    children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in children:
        yield from _paths(child, (*path, key))


def mutant(data: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """`data` with one change somewhere: a field dropped or added, a value retyped, an unknown item type."""
    data = copy.deepcopy(data)
    path = rng.choice([p for p in _paths(data) if p])
    parent: Any = data
    for key in path[:-1]:
        parent = parent[key]
    key = path[-1]
    change = rng.choice(("drop", "extra", "retype", "retype", "unknown type"))
    if change == "drop" and isinstance(parent, dict):
        del parent[key]
    elif change == "extra" and isinstance(target := parent[key] if isinstance(parent[key], dict) else parent, dict):
        target["zz_extra"] = rng.choice((1, "s", {"type": "message"}, [1.5], None))
    elif change == "unknown type" and isinstance(parent[key], dict):
        parent[key]["type"] = "zz_unknown"
    else:
        parent[key] = rng.choice(WRONG_VALUES)
    return data


def test_mutants_parse_to_the_sdks_object_or_are_left_to_the_sdk() -> None:
    fast = 0
    for seed in range(1500):
        rng = random.Random(seed)
        data = mutant(shape(Response, rng), rng)
        try:
            sdk_parse(Response, data)
        except Exception:
            assert parsing.parse(Response, data) is None, "what the SDK cannot parse is the SDK's to raise on"
            continue
        fast += assert_same_as_sdk(Response, data) is not None
    assert 300 < fast < 1500, "both outcomes came up"


def _valid() -> dict[str, Any]:
    return shape(Response, random.Random(0))


def test_extra_fields_are_kept_and_not_counted_as_set_where_the_sdk_constructs() -> None:
    data = {**_valid(), "store": False, "zz_new_field": {"nested": [1, 2]}}
    parsed = assert_same_as_sdk(Response, data)
    assert parsed is not None
    assert parsed.zz_new_field == {"nested": [1, 2]}  # type: ignore[attr-defined]
    assert "zz_new_field" not in parsed.model_fields_set


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d.pop("parallel_tool_calls"),  # required by the SDK's model
        lambda d: d.update(created_at=2**53 + 1),  # the SDK keeps the int, a float cannot hold it
        lambda d: d.update(created_at="1700000000"),  # the SDK keeps the string
        lambda d: d.update(parallel_tool_calls=1),
        lambda d: d.update(output=[{"type": "zz_future_item", "id": "x"}]),
        lambda d: d.update(usage={"input_tokens": 1, "output_tokens": 1, "total_tokens": 2}),  # details missing
    ],
)
def test_what_validation_would_read_otherwise_is_left_to_the_sdk(change: Any) -> None:
    data = _valid()
    change(data)
    assert parsing.parse(Response, data) is None
    client = fast_client()
    assert difference(_sdk.parse_response(client, data), sdk_response(OpenAI(api_key="k"), data)) is None


def test_a_client_with_strict_response_validation_gets_the_sdks_own_validation() -> None:
    strict = fast_client(_strict_response_validation=True)
    data = {**_valid(), "zz_extra": 1}
    reference = OpenAI(api_key="k", _strict_response_validation=True)
    assert difference(_sdk.parse_response(strict, data), sdk_response(reference, data)) is None
    assert "zz_extra" in _sdk.parse_response(strict, data).model_fields_set, "the SDK validated: extras count as set"


class Inner(SDKModel):
    ratio: float
    name: str


class Outer(SDKModel):
    """A model with fields the SDK constructs below the top (Response has none in current releases)."""

    inner: Inner
    tags: list[str]
    maybe: Inner | None = None


class Unsupported(SDKModel):
    values: list[float]


@pytest.mark.parametrize(
    "data",
    [
        {"inner": {"ratio": 1, "name": "a"}, "tags": ["x"]},
        {"inner": {"ratio": 1, "name": "a", "zz": 1}, "tags": [], "zz_top": True},
        {"inner": {"ratio": 2**53 + 1, "name": "a"}, "tags": []},
        {"inner": {"ratio": 1.5, "name": "a"}, "tags": [], "maybe": {"ratio": 2**53 + 1, "name": "b", "zz": 2}},
        {"inner": {"ratio": "1.5", "name": "a"}, "tags": []},
    ],
)
def test_models_constructed_below_the_top_are_settled_the_same_way(data: dict[str, Any]) -> None:
    assert parsing.Model.build(Outer) is not None
    assert_same_as_sdk(Outer, data)


def test_a_model_whose_constructed_fields_cannot_be_settled_has_no_fast_path() -> None:
    assert parsing.Model.build(Unsupported) is None
    assert parsing.parse(Unsupported, {"values": [1, 2.5]}) is None


class Fresh(SDKModel):
    """A model no other test built a validator for."""

    name: str


def test_a_validator_pydantic_core_refuses_to_build_leaves_parsing_to_the_sdk(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise SchemaError("a schema this pydantic-core does not know")

    monkeypatch.setattr(parsing, "SchemaValidator", refuse)
    assert parsing.parse(Fresh, {"name": "x"}) is None
    assert "the fast validator failed to build" in caplog.text


class KindA(SDKModel):
    type: Literal["a"]
    n: int


class KindB(SDKModel):
    type: Literal["b", "bb"]


class AlsoA(SDKModel):
    type: Literal["a"]
    m: int


class DefaultD(SDKModel):
    type: Literal["d"] = "d"


def _union_kinds(annotation: Any) -> list[str]:
    schema = parsing.tagged_schema(TypeAdapter(annotation).core_schema)
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("type") in ("union", "tagged-union"):
                found.append(node["type"])
            for value in node.values():
                walk(value)
        elif isinstance(node, (list, tuple)):
            for value in node:
                walk(value)

    walk(schema)
    return found


def test_only_unions_whose_variants_each_require_their_own_type_become_tagged_unions() -> None:
    assert _union_kinds(list[KindA | KindB]) == ["tagged-union"]
    assert _union_kinds(list[KindA | AlsoA]) == ["union"], "two variants for one tag: pydantic picks, not the tag"
    assert _union_kinds(list[KindA | DefaultD]) == ["union"], "a type with a default is not required"
    assert _union_kinds(list[KindA | str]) == ["union"]
    tagged = SchemaValidator(parsing.tagged_schema(TypeAdapter(list[KindA | KindB]).core_schema))
    values = [{"type": "bb"}, {"type": "a", "n": 1}]
    assert tagged.validate_python(values, strict=True) == TypeAdapter(list[KindA | KindB]).validate_python(values)


# Stream events: the SDK validates each against the union of all event types.


def assert_event_same_as_sdk(data: dict[str, Any]) -> Any:
    fast = parsing.parse_union(ResponseStreamEvent, data)
    if fast is not None:
        reference = sdk_parse(ResponseStreamEvent, data)
        assert difference(fast, reference) is None, difference(fast, reference)
    return fast


@pytest.mark.parametrize("seed", range(300))
def test_every_valid_stream_event_parses_fast_to_the_sdks_object(seed: int) -> None:
    data = shape(ResponseStreamEvent, random.Random(seed))
    assert assert_event_same_as_sdk(data) is not None


def test_stream_event_mutants_parse_to_the_sdks_object_or_are_left_to_the_sdk() -> None:
    fast = 0
    for seed in range(1500):
        rng = random.Random(seed)
        data = mutant(shape(ResponseStreamEvent, rng), rng)
        try:
            sdk_parse(ResponseStreamEvent, data)
        except Exception:
            assert parsing.parse_union(ResponseStreamEvent, data) is None
            continue
        fast += assert_event_same_as_sdk(data) is not None
    assert 300 < fast < 1500, "both outcomes came up"


def test_a_wrapped_clients_stream_events_are_parsed_fast_and_read_as_the_sdk_reads_them(
    server: BackgroundServer,
) -> None:
    sdk_parses: list[Any] = []
    raw: list[dict[str, Any]] = []
    client = OpenAI(base_url=server.base_url, api_key="k", max_retries=0)
    sdk_parser = client._process_response_data

    def counted(**kwargs: Any) -> Any:
        sdk_parses.append(kwargs["cast_to"])
        return sdk_parser(**kwargs)

    client._process_response_data = counted  # type: ignore[method-assign]
    with ws_transport.wrap(client, on_event=raw.append) as wrapped:
        history: list[Any] = [{"role": "user", "content": 'call lookup {"n": 1}'}]
        typed: list[Any] = []
        for turn in range(3):
            with wrapped.responses.create(model=MODEL, input=history, tools=[FUNCTION], stream=True) as stream:
                events = list(stream)
            typed += events
            final = events[-1].response  # type: ignore[union-attr]
            history += [*final.output, {"role": "user", "content": f"and then {turn}"}]
    assert sdk_parses == [], "no event went to the SDK's parser"
    assert {e.type for e in typed} >= {"response.function_call_arguments.delta", "response.output_text.delta"}
    for event, data in zip(typed, raw, strict=True):
        assert "stream_id" not in data  # the SSE framing took the lane id out, as the SDK reads the event
        assert difference(event, sdk_parse(ResponseStreamEvent, data)) is None


# A direct stream's events: read as parsed JSON, never as SSE bytes, they are the SDK's objects of those bytes.


def wire(data: Any) -> Any:
    """`data` as the transport reads it off the socket (orjson: an integer over 64 bits comes as a float)."""
    return orjson.loads(json.dumps(data))


def sdk_stream_of_sse(events: list[dict[str, Any]]) -> list[Any]:
    """What the SDK's own `Stream` makes of `events` as the HTTP stream carries them (its SSE decoder, its parser)."""
    body = b"".join(sse_frame(copy.deepcopy(event)) for event in events)
    request = httpx2.Request("POST", "http://127.0.0.1:9/v1/responses")
    response = httpx2.Response(200, headers=SSE_HEADERS, content=body, request=request)
    client = OpenAI(api_key="k", base_url="http://127.0.0.1:9/v1")
    return list(Stream(cast_to=ResponseStreamEvent, response=response, client=client))  # type: ignore[arg-type]


def direct_stream(client: OpenAI, events: list[dict[str, Any]]) -> list[Any]:
    """What the direct path's `Stream` makes of the same events, handed on parsed (`_sdk.event_stream`)."""
    settled = [sse_event(copy.deepcopy(event)) for event in events]
    request = httpx2.Request("POST", "http://127.0.0.1:9/v1/responses")
    response = httpx2.Response(200, headers=SSE_HEADERS, content=b"", request=request)
    return list(_sdk.event_stream(client, response, lambda: iter(settled)))


def assert_same_events(got: list[Any], expected: list[Any]) -> None:
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        assert type(a) is type(b)
        assert a.model_dump(warnings=False) == b.model_dump(warnings=False)
        assert a.model_fields_set == b.model_fields_set
        assert a.to_dict(warnings=False) == b.to_dict(warnings=False)
        assert difference(a, b) is None, difference(a, b)


def test_every_stream_event_read_parsed_is_the_sdks_object_of_its_sse() -> None:
    rng = random.Random(7)
    valid = [wire(shape(kind, rng)) for kind in typing.get_args(parsing._unwrap(ResponseStreamEvent)) for _ in range(2)]
    mutants = [wire(mutant(shape(ResponseStreamEvent, rng), rng)) for _ in range(150)]
    errors = [wire({"type": "error", "sequence_number": 3, "error": {"code": "server_error", "message": "m"}})]
    assert {event["type"] for event in valid} >= {"response.reasoning_text.delta", "response.refusal.delta", "error"}
    assert any(data.get("zz_extra") is not None for data in mutants), "unknown fields, as well as dropped ones"
    for events in (valid, mutants, errors):
        expected = sdk_stream_of_sse(events)
        assert_same_events(direct_stream(fast_client(), events), expected)
        assert_same_events(direct_stream(OpenAI(api_key="k", base_url="http://127.0.0.1:9/v1"), events), expected)


def sdk_outcome_of_sse(events: list[dict[str, Any]]) -> tuple[list[Any], Exception | None]:
    """The events the SDK's own `Stream` yields from `events`' SSE before it raises, and what it raises."""
    body = b"".join(sse_frame(copy.deepcopy(event)) for event in events)
    request = httpx2.Request("POST", "http://127.0.0.1:9/v1/responses")
    response = httpx2.Response(200, headers=SSE_HEADERS, content=body, request=request)
    client = OpenAI(api_key="k", base_url="http://127.0.0.1:9/v1")
    return _outcome(iter(Stream(cast_to=ResponseStreamEvent, response=response, client=client)))  # type: ignore[arg-type]


def direct_outcome(client: OpenAI, events: list[dict[str, Any]]) -> tuple[list[Any], Exception | None]:
    settled = [sse_event(copy.deepcopy(event)) for event in events]
    request = httpx2.Request("POST", "http://127.0.0.1:9/v1/responses")
    response = httpx2.Response(200, headers=SSE_HEADERS, content=b"", request=request)
    return _outcome(iter(_sdk.event_stream(client, response, lambda: iter(settled))))


def _outcome(stream: Iterator[Any]) -> tuple[list[Any], Exception | None]:
    got: list[Any] = []
    try:
        got.extend(stream)
    except Exception as exc:
        return got, exc
    return got, None


DELTA = {"type": "response.output_text.delta", "item_id": "i", "output_index": 0, "content_index": 0, "delta": "d"}
ODD_EVENTS = {
    "a truthy error with a message": {**DELTA, "sequence_number": 1, "error": {"message": "boom", "code": "c"}},
    "an error with no message": {**DELTA, "sequence_number": 1, "error": {"code": "c"}},
    "an error with a message that is no string": {**DELTA, "sequence_number": 1, "error": {"message": 5}},
    "an error that is a string": {**DELTA, "sequence_number": 1, "error": "boom"},
    "a null error": {**DELTA, "sequence_number": 1, "error": None},
    "an empty error": {**DELTA, "sequence_number": 1, "error": {}},
    "an Assistants thread event": {"type": "thread.run.created", "sequence_number": 1, "id": "run_1"},
    "an event with no type": {"sequence_number": 1, "delta": "d"},
}


@pytest.mark.parametrize("case", list(ODD_EVENTS))
def test_a_direct_stream_raises_and_hands_on_odd_events_as_the_sdks_stream_does(case: str) -> None:
    events = [{**DELTA, "sequence_number": 0}, ODD_EVENTS[case], {**DELTA, "sequence_number": 2}]
    expected, raised = sdk_outcome_of_sse(events)
    for client in (fast_client(), OpenAI(api_key="k", base_url="http://127.0.0.1:9/v1")):
        got, got_raised = direct_outcome(client, events)
        assert [type(e) for e in got] == [type(e) for e in expected]
        assert [difference(a, b) for a, b in zip(got, expected, strict=True)] == [None] * len(got)
        assert type(got_raised) is type(raised)
        if raised is not None:
            assert str(got_raised) == str(raised)
            assert got_raised.body == raised.body  # type: ignore[attr-defined]
            assert str(got_raised.request.url) == str(raised.request.url)  # type: ignore[attr-defined]
    assert (raised is None) == (
        case in ("a null error", "an empty error", "an Assistants thread event", "an event with no type")
    )


@pytest.mark.parametrize("lost", ["RemoteProtocolError", "ReadTimeout"])
def test_a_direct_stream_cut_mid_way_raises_what_the_sdks_stream_raises_over_a_cut_body(lost: str) -> None:
    client = OpenAI(api_key="k", base_url="http://127.0.0.1:9/v1")
    http = _http.module_of(_sdk.endpoint_url(client, "/responses"))
    request = http.Request("POST", "http://127.0.0.1:9/v1/responses")
    first = {**DELTA, "sequence_number": 0}

    def cut() -> Iterator[Any]:
        yield first
        raise getattr(http, lost)("cut", request=request)

    class CutBody(http.SyncByteStream):  # type: ignore[name-defined,misc]
        def __iter__(self) -> Iterator[bytes]:
            yield sse_frame(copy.deepcopy(first))
            raise getattr(http, lost)("cut", request=request)

    over_http = http.Response(200, headers=SSE_HEADERS, stream=CutBody(), request=request)
    expected = _outcome(iter(Stream(cast_to=ResponseStreamEvent, response=over_http, client=client)))  # type: ignore[arg-type]
    direct = http.Response(200, headers=SSE_HEADERS, content=b"", request=request)
    got = _outcome(iter(_sdk.event_stream(client, direct, cut)))
    assert [e.type for e in got[0]] == [e.type for e in expected[0]] == [first["type"]]
    assert type(got[1]) is type(expected[1]) and expected[1] is not None


# The shim's own responses: every kind of turn takes the fast path and reads as over HTTP.

FUNCTION = {"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {}}}
CUSTOM = {"type": "custom", "name": "patch", "description": "a patch"}
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"], "additionalProperties": False}
LONG = {
    "type": "object",
    "properties": {f"field_{i}": {"type": "string"} for i in range(20)},
    "required": [f"field_{i}" for i in range(20)],
    "additionalProperties": False,
}
"""Structured output longer than 16 tokens: the simulator cuts it, `incomplete`."""
TURNS: dict[str, dict[str, Any]] = {
    "text": {"input": "hello"},
    "function call": {"input": 'call lookup {"n": 1}', "tools": [FUNCTION]},
    "custom tool call": {"input": "call patch {}", "tools": [CUSTOM], "tool_choice": "required"},
    "structured output": {"input": "n?", "text": {"format": {"type": "json_schema", "name": "n", "schema": SCHEMA}}},
    "incomplete": {
        "input": "x",
        "max_output_tokens": 16,
        "text": {"format": {"type": "json_schema", "name": "n", "schema": LONG}},
    },
    "every request field": {
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
        "instructions": "be brief",
        "metadata": {"k": "v"},
        "temperature": 0.5,
        "top_p": 0.9,
        "reasoning": {"effort": "low"},
        "tool_choice": {"type": "function", "name": "lookup"},
        "tools": [FUNCTION, {"type": "web_search"}],
        "parallel_tool_calls": False,
        "prompt_cache_key": "key",
        "safety_identifier": "user-1",
        "truncation": "auto",
        "max_tool_calls": 3,
        "top_logprobs": 2,
    },
}


@pytest.fixture(scope="module")
def server() -> Iterator[BackgroundServer]:
    settings = Settings(usage_ledger="off")
    with BackgroundServer(create_app(settings), settings) as running:
        yield running


def stored_json(server: BackgroundServer, response_id: str) -> dict[str, Any]:
    """The response as the shim serves it (the same JSON as its terminal event)."""
    request = urllib.request.Request(
        f"{server.base_url}/responses/{response_id}", headers={"authorization": "Bearer k"}
    )
    with urllib.request.urlopen(request, timeout=10) as reply:
        return json.loads(reply.read())  # type: ignore[no-any-return]


@pytest.mark.parametrize("kind", list(TURNS))
def test_the_shims_responses_take_the_fast_path_and_read_as_over_http(server: BackgroundServer, kind: str) -> None:
    sdk_parses: list[Any] = []
    client = OpenAI(base_url=server.base_url, api_key="k", max_retries=0)
    sdk_parser = client._process_response_data

    def counted(**kwargs: Any) -> Any:
        sdk_parses.append(kwargs["cast_to"])
        return sdk_parser(**kwargs)

    client._process_response_data = counted  # type: ignore[method-assign]
    with ws_transport.wrap(client) as wrapped:
        wrapped.responses.create(model=MODEL, input="first turn: the SDK's pipeline, which teaches the direct path")
        before = len(sdk_parses)
        response = wrapped.responses.create(model=MODEL, store=True, **TURNS[kind])
        assert sdk_parses[before:] == [], "the direct turn's Response was built without the SDK's parser"
    assert response.output and (response.status == "incomplete") == (kind == "incomplete")
    raw = stored_json(server, response.id)
    assert parsing.parse(Response, raw) is not None, "the shim sends every field the installed SDK requires"
    over_http = OpenAI(base_url=server.base_url, api_key="k", max_retries=0).responses.retrieve(response.id)
    assert difference(response, over_http) is None, (kind, difference(response, over_http))


@pytest.mark.parametrize("kind", list(TURNS))
def test_a_direct_streams_events_are_the_sdks_objects_of_the_shims_sse(server: BackgroundServer, kind: str) -> None:
    raw: list[dict[str, Any]] = []
    client = OpenAI(base_url=server.base_url, api_key="k", max_retries=0)
    with ws_transport.wrap(client, on_event=raw.append) as wrapped:
        wrapped.responses.create(model=MODEL, input="first turn: the SDK's pipeline, which teaches the direct path")
        raw.clear()
        with wrapped.responses.create(model=MODEL, stream=True, **TURNS[kind]) as stream:
            typed = list(stream)
    assert isinstance(stream.response.stream, EventBody), "the direct path"
    assert typed[-1].type in ("response.completed", "response.incomplete")
    assert_same_events(typed, sdk_stream_of_sse(raw))


def test_an_async_direct_streams_events_are_the_sdks_objects_of_the_shims_sse(server: BackgroundServer) -> None:
    raw: list[dict[str, Any]] = []

    async def main() -> tuple[list[Any], Any]:
        client = AsyncOpenAI(base_url=server.base_url, api_key="k", max_retries=0)
        async with ws_transport.wrap(client, on_event=raw.append) as wrapped:
            await wrapped.responses.create(model=MODEL, input="first turn: the SDK's pipeline")
            raw.clear()
            stream = await wrapped.responses.create(model=MODEL, stream=True, **TURNS["function call"])
            async with stream:
                return [event async for event in stream], stream.response.stream

    typed, body = asyncio.run(main())
    assert isinstance(body, AsyncEventBody), "the direct path"
    assert "response.function_call_arguments.delta" in {event.type for event in typed}
    assert_same_events(typed, sdk_stream_of_sse(raw))


def test_a_direct_streams_body_read_as_bytes_is_the_sse_of_its_events(server: BackgroundServer) -> None:
    raw: list[dict[str, Any]] = []
    client = OpenAI(base_url=server.base_url, api_key="k", max_retries=0)
    with ws_transport.wrap(client, on_event=raw.append) as wrapped:
        wrapped.responses.create(model=MODEL, input="first turn: the SDK's pipeline, which teaches the direct path")
        raw.clear()
        with wrapped.responses.create(model=MODEL, input="hello", stream=True) as stream:
            assert isinstance(stream.response.stream, EventBody), "the direct path"
            body = stream.response.read()
    assert len(raw) > 2 and body == b"".join(sse_frame(event) for event in raw)
