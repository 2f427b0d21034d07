"""A Response object's held bytes (`response_held`): the walked figure, with the echoed defaults measured once.

Sizing skips walking the fields that hold the API's default objects; these tests hold it to the full walk
on hostile shapes (many tiny values, deep nesting, long and non-ASCII strings, many keys, extra echoed
fields) and to what tracemalloc sees a Response object hold.
"""

from __future__ import annotations

import gc
import sys
import tracemalloc
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st
from support.sizes import footprint_by_definition

from server_shim.backends.base import Usage
from server_shim.events import response_object
from server_shim.footprint import footprint
from server_shim.requests import CreateRequest
from server_shim.response_held import NOT_HELD, WRITTEN, made_held, response_held
from server_shim.turn_settings import Derived

HOSTILE = {
    "many tiny values": {"type": "json_schema", "name": "s", "schema": {"enum": [0] * 5_000}},
    "deep nesting": {"type": "json_schema", "name": "s", "schema": {"d": orjson.loads("[" * 200 + "]" * 200)}},
    "many keys": {
        "type": "json_schema",
        "name": "s",
        "schema": {f"o{j}": {f"k{i}": {} for i in range(60)} for j in range(60)},
    },
    "long keys": {"type": "json_schema", "name": "s", "schema": {"k" * 100 + str(i): i for i in range(500)}},
}


def _walked(response: dict[str, Any], others: tuple[Any, ...]) -> int:
    """The full walk of the response's held fields and `others`, the dict itself counted as it is: the
    definition's (`support.sizes`), and `footprint`'s, which must agree."""
    held = {key: value for key, value in response.items() if key not in NOT_HELD}
    walked = footprint((held, *others)) - sys.getsizeof(held) + sys.getsizeof(response)
    assert walked == footprint_by_definition((held, *others)) - sys.getsizeof(held) + sys.getsizeof(response)
    return walked


def _response(body: dict[str, Any]) -> dict[str, Any]:
    request = CreateRequest.model_validate(orjson.loads(orjson.dumps(body)))
    return response_object("resp_1", request, status="completed", output=[{"type": "message"}])


bodies = st.fixed_dictionaries(
    {"model": st.just("m")},
    optional={
        "instructions": st.text(max_size=300),
        "text": st.sampled_from(list(HOSTILE.values())).map(lambda f: {"format": f, "verbosity": "low"}),
        "reasoning": st.fixed_dictionaries({"effort": st.sampled_from(["low", "high"])}),
        "metadata": st.dictionaries(st.text(max_size=60), st.text(max_size=500), max_size=16),
        "temperature": st.floats(0, 2),
        "top_p": st.just(1.0),
        "parallel_tool_calls": st.booleans(),
        "tool_choice": st.sampled_from(["none", "required", {"type": "function", "name": "f"}]),
        "user": st.text(max_size=64),
        "previous_response_id": st.just("resp_0"),
        "max_output_tokens": st.integers(1, 2**40),
        "background": st.just(False),
    },
)


@settings(max_examples=150, deadline=None)
@given(bodies, st.dictionaries(st.text(max_size=80), st.integers()), st.lists(st.text(), max_size=9))
def test_the_held_figure_is_the_full_walk_for_any_request(body, carry, calls):
    response = _response(body)
    others = (carry, {}, tuple(calls))
    assert response_held(response, others, None) == _walked(response, others)


def test_a_hand_made_response_and_extra_fields_are_walked_in_full():
    for response in ({"id": "r"}, {**_response({"model": "m"}), "extra": {"k" * 90: ["x" * 1000] * 3}}):
        assert response_held(response, (), None) == _walked(response, ())


def test_hostile_echoed_containers_are_bounded_as_tracemalloc_sees_them():
    """Not "many keys": `footprint` takes short dict keys as shared (orjson's key cache), and a schema of many
    distinct short keys holds ~50 bytes a key more than it counts (a gap of the definition, not of this sum)."""
    for name, text_format in HOSTILE.items():
        if name == "many keys":
            continue
        body = orjson.dumps({"model": "m", "instructions": "é" * 10_000 + "😀", "text": {"format": text_format}})
        _response(orjson.loads(body))  # pydantic's own first-use allocations stay out of the count
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            response = _response(orjson.loads(body))
            gc.collect()
            held = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        output = footprint(response["output"])
        assert held - output <= response_held(response, (), None), name
        assert response_held(response, (), None) == _walked(response, ()), name


counts = st.integers(0, 2**62)
usages = st.builds(Usage, counts, counts, counts)
ended = st.sampled_from([("completed", None), ("incomplete", "max_output_tokens"), ("failed", None)])
errors = st.none() | st.fixed_dictionaries({"code": st.text(max_size=40), "message": st.text(max_size=300)})


@settings(max_examples=200, deadline=None)
@given(
    bodies,
    st.none() | usages,
    ended | st.just(("in_progress", None)),
    errors,
    st.dictionaries(st.text(max_size=70), st.text(max_size=40), max_size=5),
    st.lists(st.text(), max_size=9),
)
def test_a_response_sized_field_by_field_is_the_full_walk(body, usage, status, error, checks, calls):
    """Scalars by type, `usage` by its shape (any counts: 0, small, past 2**30 and 2**60), leaves and empty
    containers apart: the same figure as walking the whole object, in progress or ended, failed or not."""
    request = CreateRequest.model_validate(orjson.loads(orjson.dumps(body)))
    response = response_object(
        "resp_" + "0" * 32, request, status=status[0], usage=usage, error=error, incomplete_reason=status[1]
    )
    others = ({"deployment": "d"} if calls else {}, checks, tuple(calls))
    assert response_held(response, others, None) == _walked(response, others)


@given(st.sampled_from(["float counts", "extra key", "no details", "int subclass", "id not str", "extra field"]))
def test_a_response_not_as_response_object_makes_it_is_walked_to_the_same_figure(change):
    class Count(int):
        pass

    response = response_object("resp_1", CreateRequest(model="m"), status="completed", usage=Usage(3, 4, 1))
    usage = response["usage"]
    if change == "float counts":
        usage["input_tokens"] = 3.0
    elif change == "extra key":
        usage["input_tokens_details"]["audio_tokens"] = 0
    elif change == "no details":
        usage["output_tokens_details"] = None
    elif change == "int subclass":
        usage["total_tokens"] = Count(7)
    elif change == "id not str":
        response["id"] = 12
    else:
        response["conversation"] = {"id": "conv_1"}
    assert response_held(response, ({}, {}, ()), None) == _walked(response, ({}, {}, ()))


def test_a_container_held_by_two_parts_is_counted_once_for_each_never_less():
    """The one way the field-by-field figure leaves the walk's: a container two parts share, one of them sized
    apart (the shim never builds one). It is above the walk's by that container's footprint, not below; parts
    walked together are counted once, as the walk counts them."""
    response = response_object("resp_1", CreateRequest(model="m"), status="completed", usage=Usage(3, 4, 1))
    shared = response["usage"]  # sized by its shape, and walked again as `carry`
    others = (shared, {}, ())
    assert response_held(response, others, None) == _walked(response, others) + footprint(shared)
    response["metadata"] = {"team": "a" * 100}
    assert response_held(response, (response["metadata"], {}, ()), None) == _walked(
        response, (response["metadata"], {}, ())
    )


@given(st.sampled_from(sorted(NOT_HELD)))
def test_a_response_with_another_field_in_place_of_one_not_held_is_walked_in_full(missing):
    """As many fields as `response_object` writes, one of them (`output` or `tools`) replaced by another field:
    the other field is held and counted (sized field by field, it was left out)."""
    response = response_object("resp_1", CreateRequest(model="m"), status="completed", usage=Usage(3, 4, 1))
    del response[missing]
    response["conversation"] = {"id": "conv_" + "c" * 500}
    assert response_held(response, ({}, {}, ()), None) == _walked(response, ({}, {}, ()))


def _made(body: dict[str, Any], derived: Derived | None = None, **outcome: Any) -> tuple[dict[str, Any], Derived]:
    """A Response object as a WebSocket turn's end makes it: copied from its settings' memo (`Derived`)."""
    request = CreateRequest.model_validate(orjson.loads(orjson.dumps(body)))
    derived = derived or Derived(request)
    echoed = derived.echo(request)
    return response_object("resp_" + "9" * 32, request, echoed=echoed, memo=derived, **outcome), derived


@settings(max_examples=150, deadline=None)
@given(
    bodies,
    st.none() | usages,
    ended,
    st.dictionaries(st.text(max_size=70), st.text(max_size=40), max_size=5),
    st.lists(st.text(), max_size=9),
    st.booleans(),
)
def test_a_response_copied_from_its_memo_is_sized_as_walked(body, usage, status, checks, calls, measured):
    """`made_held` takes the template's echo as measured once (on its first response) and sizes the fields
    `response_object` wrote: the full walk's figure on every response of the memo, hostile echoes included
    (their containers' footprints given as `request_held` measures them, or walked)."""
    first, derived = _made(body, status="completed", usage=Usage(1, 1))
    known = {id(part): footprint(part) for part in derived.parts} if measured else None
    others = ({"deployment": "d"} if calls else {}, checks, tuple(calls))
    for response in (first, _made(body, derived, status=status[0], usage=usage, incomplete_reason=status[1])[0]):
        assert made_held(response, others, derived, known) == _walked(response, others)
    assert derived.template_held is not None


@given(bodies)
def test_response_object_writes_into_its_copy_only_the_fields_made_held_sizes(body):
    """`made_held` does not look at the other fields: they must be the template's own objects."""
    response, derived = _made(body, status="completed", usage=Usage(3, 4, 1))
    template = derived.response_template
    assert template is not None and response.keys() == template.keys()
    written = {key for key in response if response[key] is not template[key]}
    assert written <= set(WRITTEN) | {"metadata", "usage", "output"}


def test_a_response_not_copied_from_the_template_is_sized_as_walked():
    response, derived = _made({"model": "m"}, status="completed", usage=Usage(3, 4, 1))
    for changed in ({**response, "conversation": {"id": "conv_1"}}, {**response, "id": 12}):
        assert made_held(changed, ({}, {}, ()), derived, None) == _walked(changed, ({}, {}, ()))


def test_a_template_echoing_non_ascii_text_is_measured_as_encoded():
    """A non-ASCII string holds its UTF-8 copy once a response echoing it is sent: the template's echo is measured
    so from the first response, or every later one (sent, then sized) would be held above its figure."""
    body = {"model": "m", "instructions": "é" * 10_000 + "😀"}
    first, derived = _made(body, status="completed", usage=Usage(3, 4, 1))
    made_held(first, ({}, {}, ()), derived, None)
    later, _ = _made(body, derived, status="completed", usage=Usage(3, 4, 1))
    orjson.dumps(later)
    assert made_held(later, ({}, {}, ()), derived, None) == _walked(later, ({}, {}, ()))
