"""The plain checks (`request_shapes`) against the model they stand in for, on generated request bodies.

`parse_create` builds a request of the common shapes without `CreateRequest.model_validate`; every other
body, and every refusal, goes through the model. Generated bodies (each field absent, or a plausible or
wrong value for it; unknown keys among them) must come out the same both ways: the same instance (values,
their types, fields set, extras in order, private attributes), or the same error code, message and
parameter. The reference is `parse_create` with the plain checks taken out, i.e. the model alone.
"""

from __future__ import annotations

from typing import Any
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server_shim import requests
from server_shim.errors import APIError
from server_shim.requests import CreateRequest, parse_create, plainly_valid

EXAMPLES = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])

_JSONISH = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**65), 2**65)
    | st.sampled_from([0, 1, 2, 20, 21, -1, 2**63 - 1, 2**63, 2**64])
    | st.floats(allow_nan=False)
    | st.sampled_from([0.0, -0.0, 0.5, 1.0, 2.0, 2.0000001, -0.1, float("nan")])
    | st.text(max_size=6)
    | st.sampled_from(["", "x", "auto", "flex", "disabled", "medium", "text", "json_schema"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)
_FORMATS = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(["text", "json_object", "json_schema", "other", None]),
        "name": st.sampled_from(["n", 3, None]),
        "schema": st.sampled_from([{"type": "object"}, [], None]),
    },
)
_OBJECT = st.dictionaries(st.text(max_size=4), _JSONISH, max_size=3)
_ITEMS = [{"type": "function_call_output", "call_id": "c", "output": "x"}, {"role": "user", "content": "hi"}]
_STR = st.text(max_size=5)
_STRING_FIELDS = ("instructions", "previous_response_id", "user", "prompt_cache_key", "safety_identifier", "stream_id")
_BOOL_FIELDS = ("parallel_tool_calls", "store", "stream", "background", "generate")
_VALID: dict[str, st.SearchStrategy[Any]] = {
    "model": st.sampled_from(["m", "sim-model"]),
    "input": st.sampled_from(["Next step?", [], _ITEMS]),
    "tools": st.lists(_OBJECT, max_size=2),
    "tool_choice": _JSONISH,
    "max_output_tokens": st.integers(1, 2**63 - 1),
    "max_tool_calls": st.integers(1, 2**63 - 1),
    "top_logprobs": st.integers(0, 20),
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0, 1),
    "metadata": st.dictionaries(_STR, _STR, max_size=3),
    "text": st.fixed_dictionaries({}, optional={"format": _FORMATS | st.none(), "verbosity": _JSONISH}),
    "reasoning": st.fixed_dictionaries({}, optional={"effort": st.sampled_from(["low", "huge", None])}) | _OBJECT,
    "include": st.lists(_STR, max_size=3),
    "service_tier": st.sampled_from(["auto", "default", "flex", "scale", "priority", "fast", "ultrafast"]),
    "truncation": st.sampled_from(["auto", "disabled"]),
    "stream_id": st.sampled_from(["lane-1", "bad lane"]),
    **{name: st.booleans() for name in _BOOL_FIELDS},
}
"""Values the model accepts (or, for a few, that a check after it refuses); any other field: a string."""
_EDGES: dict[str, list[Any]] = {
    "model": ["", "m", None, 1],
    "input": [{}, None, "", [], 1],
    "tools": [[{1: "x"}], ["t"], [None], [], [{}], {}],
    "metadata": [{"k": 1}, {"k": None}, {}, {"k": "v"}],
    "text": [
        {"format": "x"},
        {"format": {"type": "json_schema", "name": "n"}},
        {"format": {"type": "json_schema", "name": "n", "schema": {}}},
        {"format": {"type": "other"}},
        {"format": None},
        {},
        {1: 2},
    ],
    "reasoning": [{"effort": "huge"}, {"effort": None}, {"effort": "low"}, [], {1: 1}],
    "include": [[1], [], ["x"], "x"],
    "service_tier": ["slow", "auto", "AUTO"],
    "truncation": ["none", "auto", "disabled"],
    "max_output_tokens": [0, 1, -1, 2**63 - 1, 2**63, 2**70, True, 1.0],
    "max_tool_calls": [0, 1, 2**64, False, 3.0],
    "top_logprobs": [-1, 0, 20, 21, True, 2.0],
    "temperature": [0.0, 2.0, 2.0000001, -0.1, -0.0, -1e-300, 1, 0, True, float("nan"), float("inf")],
    "top_p": [0.0, 1.0, 1.0000001, -0.0, 1, 0, float("-inf")],
    **{name: [0, 1, "true", None, True, False] for name in _BOOL_FIELDS},
    **{name: [1, b"x", ["x"], "", "x"] for name in _STRING_FIELDS},
}
"""Values on both sides of each field's bounds and types."""
_EXTRA_KEYS = ["type", "conversation", "zzz", "_chat_only", "model_config", "__dict__", "stream_options", "prompt"]
_KEYS = [name for name in [*CreateRequest.model_fields, *_EXTRA_KEYS] if name != "model"]


def _value(name: str) -> st.SearchStrategy[Any]:
    """Mostly a valid value (so that many bodies are valid throughout), else an edge, or any JSON value."""
    valid = _VALID.get(name, _STR | st.none()) | st.none()
    wrong = st.sampled_from(_EDGES[name]) if name in _EDGES else _JSONISH
    return st.sampled_from(range(20)).flatmap(lambda pick: valid if pick < 14 else wrong if pick < 18 else _JSONISH)


_BODIES = st.tuples(st.lists(st.sampled_from(_KEYS), max_size=6, unique=True), st.sampled_from(range(6))).flatmap(
    lambda drawn: st.fixed_dictionaries(
        {name: _value(name) for name in [*drawn[0], "model"][: len(drawn[0]) + (drawn[1] > 0)]}
    )
)
"""Bodies of a few fields: most name a model (last: it is required), many are valid throughout."""


def _outcome(body: dict[str, Any], websocket: bool) -> CreateRequest | tuple[Any, ...]:
    try:
        return parse_create(body, websocket=websocket)
    except APIError as error:
        return (error.status, error.code, error.message, error.param)


def _state(request: CreateRequest) -> tuple[Any, ...]:
    """Everything an instance holds, types and orders included."""
    values = [(name, type(value), value) for name, value in request.__dict__.items()]
    extra = [(name, type(value), value) for name, value in (request.model_extra or {}).items()]
    return values, extra, request.model_fields_set, request.__pydantic_private__, request.model_dump()


@EXAMPLES
@given(_BODIES, st.booleans())
def test_the_plain_checks_accept_and_refuse_exactly_as_the_model_does(body, websocket):
    _assert_same(body, websocket)


def _assert_same(body: dict[str, Any], websocket: bool) -> None:
    plain = _outcome(body, websocket)
    with mock.patch.object(requests, "plainly_valid", lambda body, skip=None: None):
        reference = _outcome(body, websocket)
    if isinstance(reference, CreateRequest):
        assert isinstance(plain, CreateRequest) and _state(plain) == _state(reference), body
    else:
        assert plain == reference, body


def test_each_fields_edges_are_accepted_and_refused_as_the_model_does():
    """Every edge value of every field, alone beside a model: where a generated body may miss one."""
    for name, values in _EDGES.items():
        for value in values:
            body = {"type": "response.create", "model": "m", name: value}
            for websocket in (True, False):
                _assert_same(body, websocket)


@EXAMPLES
@given(_BODIES)
def test_what_the_plain_checks_build_the_model_builds_the_same(body):
    """The fast path's own instances (where it takes the body), compared with the model's on the same fields."""
    built = plainly_valid(body, skip="type")
    if built is None:
        return
    fields = {key: value for key, value in body.items() if key != "type"}
    assert _state(built)[:4] == _state(CreateRequest.model_validate(fields))[:4]


def test_a_chained_turn_and_a_tool_turn_take_the_plain_path():
    """The benchmark's chained 1-token turn and a tool-output turn with tools: no model build (the shapes
    this exists for), and a few unusual bodies that go to the model."""
    chained = {"type": "response.create", "model": "m", "input": "Next step?", "store": False, "max_output_tokens": 1}
    tools = {
        **chained,
        "previous_response_id": "resp_1",
        "input": [{"type": "function_call_output", "call_id": "c", "output": "x"}],
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}],
        "metadata": {"k": "v"},
        "text": {"format": {"type": "json_schema", "name": "n", "schema": {}}},
    }
    for body in (chained, tools):
        assert plainly_valid(body, skip="type") is not None
    for unusual in ({"temperature": 1}, {"model": None}, {"store": 0}, {"metadata": {"k": 1}}, {"include": [1]}):
        assert plainly_valid({**chained, **unusual}, skip="type") is None
    assert plainly_valid({"input": "x"}) is None  # no model: the model's error
