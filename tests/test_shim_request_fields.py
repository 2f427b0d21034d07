"""The request fields a turn reads from the model's `__dict__` (the echo, the backend's fields), held to what
reading every declared attribute gives: for bodies validated by plain checks, by the model, and copied with updates."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from server_shim.events import ECHO_DEFAULTS, ECHOED_FIELDS, echoed_fields
from server_shim.request_fields import _CHAT_AS_IS, SHIM_FIELDS, chat_options, responses_fields
from server_shim.requests import CreateRequest, parse_create

JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.text(max_size=4)),
    lambda inner: st.one_of(st.lists(inner, max_size=2), st.dictionaries(st.text(max_size=3), inner, max_size=2)),
    max_leaves=4,
)
OPTIONAL = {
    "instructions": st.one_of(st.none(), st.text(max_size=4)),
    "previous_response_id": st.one_of(st.none(), st.text(min_size=1, max_size=4)),
    "tools": st.one_of(st.none(), st.just([{"type": "function", "name": "f"}])),
    "tool_choice": st.one_of(st.none(), st.just("auto"), st.just({"type": "function", "name": "f"})),
    "parallel_tool_calls": st.one_of(st.none(), st.booleans()),
    "store": st.one_of(st.none(), st.booleans()),
    "max_output_tokens": st.one_of(st.none(), st.integers(1, 9)),
    "temperature": st.one_of(st.none(), st.floats(0, 2)),
    "top_p": st.one_of(st.none(), st.floats(0, 1)),
    "metadata": st.one_of(st.none(), st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2)),
    "text": st.one_of(st.none(), st.just({"format": {"type": "json_object"}}), st.just({"verbosity": "low"})),
    "user": st.one_of(st.none(), st.text(max_size=3)),
    "reasoning": st.one_of(st.none(), st.just({"effort": "low"}), st.just({"summary": "auto"})),
    "top_logprobs": st.one_of(st.none(), st.integers(0, 20)),
    "max_tool_calls": st.one_of(st.none(), st.integers(1, 3)),
    "prompt_cache_key": st.one_of(st.none(), st.text(max_size=3)),
    "safety_identifier": st.one_of(st.none(), st.text(max_size=3)),
    "service_tier": st.one_of(st.none(), st.sampled_from(["auto", "default", "flex"])),
    "truncation": st.one_of(st.none(), st.sampled_from(["auto", "disabled"])),
    "include": st.one_of(st.none(), st.just(["message.output_text.logprobs"]), st.just([])),
    "prompt": st.one_of(st.none(), st.just({"id": "p"})),
    "unknown_field": JSON,
}
BODIES = st.fixed_dictionaries({"model": st.text(min_size=1, max_size=4), "input": st.just("hi")}, optional=OPTIONAL)
UPDATES = st.fixed_dictionaries({}, optional={k: OPTIONAL[k] for k in ("instructions", "temperature", "user", "text")})


def every_field(request: CreateRequest) -> dict[str, Any]:
    """What `responses_fields` gave by reading every declared field."""
    fields = {
        name: getattr(request, name)
        for name in CreateRequest.model_fields
        if name not in SHIM_FIELDS and getattr(request, name) is not None
    }
    fields.update((k, v) for k, v in (request.model_extra or {}).items() if k not in SHIM_FIELDS and v is not None)
    return fields


def every_echo(request: CreateRequest) -> dict[str, Any]:
    given_fields = request.model_dump(include=set(ECHOED_FIELDS), exclude_none=True)
    fields = {**ECHO_DEFAULTS, **given_fields, "model": request.model, "store": request.stores}
    for nested in ("reasoning", "text"):
        if nested in given_fields:
            fields[nested] = {**ECHO_DEFAULTS[nested], **given_fields[nested]}
    if fields["service_tier"] == "auto":
        fields["service_tier"] = "default"
    return fields


@settings(max_examples=300, deadline=None)
@given(BODIES, st.sampled_from(["plain", "websocket", "model"]), st.one_of(st.none(), UPDATES))
def test_the_fields_read_from_what_was_set_are_those_of_every_field(body, built, update):
    if built == "model":
        request = CreateRequest.model_validate(body)
    else:
        request = parse_create(
            {**body, "type": "response.create"} if built == "websocket" else body, websocket=built == "websocket"
        )
    if update is not None:
        request = request.model_copy(update=update)
    assert responses_fields(request) == every_field(request)
    assert list(responses_fields(request)) == list(every_field(request))
    assert orjson.dumps(echoed_fields(request)) == orjson.dumps(every_echo(request))
    as_is = {name: getattr(request, name) for name in _CHAT_AS_IS if getattr(request, name) is not None}
    assert {k: v for k, v in chat_options(request).items() if k in _CHAT_AS_IS} == as_is
    assert [k for k in chat_options(request) if k in _CHAT_AS_IS] == list(as_is)
