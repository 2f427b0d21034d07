"""The simulator's schema-driven JSON (`server_shim/backends/json_instance.py`), fuzzed with hypothesis.

Two properties: any JSON value as a schema (keywords with values of the wrong type, negative,
huge, NaN or infinite bounds) gives a JSON text and never an exception; a well-formed schema
gives an instance that a JSON Schema validator accepts.
"""

from __future__ import annotations

import json
import math
from typing import Any

import jsonschema
from hypothesis import example, given, settings
from hypothesis import strategies as st

from server_shim.backends.json_instance import json_text

BUDGET = 200_000
"""Characters read, as the simulator stops at its output budget (a schema may ask for far more)."""

KEYWORDS = [
    "type", "properties", "items", "minItems", "maxItems", "minLength", "maxLength", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "enum", "const", "anyOf", "oneOf", "allOf", "$ref",
    "$defs", "format", "required",
]  # fmt: skip
ODD_NUMBERS = st.sampled_from([math.nan, math.inf, -math.inf, 10**400, -(10**400), 1e308, -1e308, -1, -0.5, 2**64])
LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    ODD_NUMBERS,
    st.text(max_size=8),
    st.sampled_from(["object", "array", "string", "number", "integer", "boolean", "null", "#/$defs/a", "#", "date"]),
)
GARBAGE = st.recursive(
    LEAVES,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.sampled_from([*KEYWORDS, "a"]), inner, max_size=6)
    ),
    max_leaves=30,
)


def read(schema: Any) -> tuple[str, bool]:
    """The text within the budget, and whether it is whole."""
    parts, size = [], 0
    for chunk in json_text(schema):
        parts.append(chunk)
        size += len(chunk)
        if size > BUDGET:
            return "".join(parts), False
    return "".join(parts), True


def strict_json(text: str) -> Any:
    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


@settings(max_examples=300, deadline=None)
@given(GARBAGE)
@example({"allOf": [1, {"$ref": 2}, {"properties": []}]})
@example({"type": "object", "properties": {"a": {"$ref": "#"}}})
@example({"anyOf": {"type": "string"}, "enum": "ab", "format": ["date"], "items": [1]})
def test_any_json_value_as_a_schema_gives_json_text_and_never_raises(schema: Any) -> None:
    text, whole = read(schema)
    if whole:
        strict_json(text)


BOUND = st.one_of(st.integers(-(10**6), 10**6), st.floats(-1e6, 1e6, allow_nan=False))


@st.composite
def numeric_schemas(draw: st.DrawFn) -> dict[str, Any]:
    """A number or integer schema whose bounds some value satisfies."""
    integer = draw(st.booleans())
    schema: dict[str, Any] = {"type": "integer" if integer else "number"}
    low, high = draw(BOUND), draw(BOUND)
    low, high = min(low, high), max(low, high)
    if integer:
        high = max(high, math.ceil(low) + 2)
    elif high - low < 1e-3:
        high = low + 1
    for side, value in (("min", low), ("max", high)):
        if draw(st.booleans()):
            schema[f"exclusive{side.title()}imum" if draw(st.booleans()) else f"{side}imum"] = value
    if integer and draw(st.booleans()):
        schema["multipleOf"] = draw(st.integers(1, 3))
        schema.pop("maximum", None), schema.pop("exclusiveMaximum", None)
    return schema


WELL_FORMED = st.recursive(
    st.one_of(
        numeric_schemas(),
        st.builds(
            lambda n, m: {"type": "string", "minLength": n, "maxLength": n + m}, st.integers(0, 40), st.integers(0, 5)
        ),
        st.just({"type": "string", "format": "date-time"}),
        st.lists(st.integers() | st.text(max_size=4), min_size=1, max_size=3).map(lambda e: {"enum": e}),
        st.just({"type": "boolean"}),
        st.just({"type": ["null", "integer"], "minimum": 3}),
    ),
    lambda inner: st.one_of(
        st.builds(
            lambda i, n: {"type": "array", "items": i, "minItems": n, "maxItems": n + 1}, inner, st.integers(0, 3)
        ),
        st.dictionaries(st.text(min_size=1, max_size=5), inner, max_size=4).map(
            lambda p: {"type": "object", "properties": p, "required": sorted(p)}
        ),
        st.lists(inner, min_size=1, max_size=2).map(lambda b: {"anyOf": b}),
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(WELL_FORMED)
def test_a_well_formed_schema_gives_an_instance_a_validator_accepts(schema: dict[str, Any]) -> None:
    text, whole = read(schema)
    assert whole
    jsonschema.Draft202012Validator(schema).validate(strict_json(text))


def test_bounds_that_are_not_usable_numbers_are_ignored_as_if_absent() -> None:
    for bad in ("abc", None, True, [], {}, math.nan, math.inf, 10**400):
        schema = {"type": "object", "properties": {"n": {"type": "number", "minimum": bad, "maximum": bad}}}
        assert strict_json(read(schema)[0]) == {"n": 1.0}


def test_huge_and_negative_bounds_that_are_numbers_are_kept() -> None:
    assert strict_json(read({"type": "integer", "minimum": 1e308})[0]) == int(1e308)
    assert strict_json(read({"type": "number", "exclusiveMinimum": 1e308})[0]) > 1e308
    assert strict_json(read({"type": "integer", "maximum": -7})[0]) == -7
    assert strict_json(read({"type": "integer", "exclusiveMaximum": -7.5})[0]) == -8
    assert strict_json(read({"type": "integer", "minimum": 0.5, "maximum": 2})[0]) == 1


ODD_BOUNDS = {
    "type": "object",
    "properties": {
        "n": {"type": "number", "minimum": "abc", "maximum": -1e308},
        "k": {"type": "integer", "exclusiveMinimum": 1e308, "maximum": "x", "multipleOf": "y"},
        "tags": {"type": "array", "items": {"enum": {"a": 1}}, "minItems": -3},
        "when": {"type": "string", "format": ["date"]},
        "both": {"allOf": [1, {"$ref": 2}]},
    },
}


async def test_odd_schema_values_over_the_wire_complete_and_the_connection_chains_on(client) -> None:
    text = {"format": {"type": "json_schema", "name": "odd", "schema": ODD_BOUNDS}}
    over_http = await client.responses.create(model="simulated-1", input="hi", text=text)
    assert over_http.status == "completed"
    assert strict_json(over_http.output_text)["n"] == -1e308
    tool = {"type": "function", "name": "odd", "parameters": ODD_BOUNDS, "strict": False}
    async with client.responses.connect() as conn:
        await conn.response.create(model="simulated-1", input="hi", tools=[tool], tool_choice="required")
        done = await until_done(conn)
        assert done["response"]["status"] == "completed"
        call = done["response"]["output"][0]
        assert call["type"] == "function_call" and strict_json(call["arguments"])["k"] > 1e308
        await conn.response.create(model="simulated-1", input="and on", previous_response_id=done["response"]["id"])
        assert (await until_done(conn))["response"]["status"] == "completed"


async def until_done(conn: Any) -> dict[str, Any]:
    while True:
        event = (await conn.recv()).model_dump(mode="json")
        if event["type"] in ("response.completed", "response.failed", "error"):
            return event
