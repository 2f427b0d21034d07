"""The `response.create` / `POST /v1/responses` body, validated at the edge with the offending param."""

from __future__ import annotations

import pytest

from server_shim.errors import APIError
from server_shim.requests import check_stream_id, parse_create


def refused(body, *, websocket=True) -> APIError:
    with pytest.raises(APIError) as raised:
        parse_create(body, websocket=websocket)
    return raised.value


def test_the_event_type_is_dropped_and_unknown_fields_are_tolerated():
    request = parse_create(
        {"type": "response.create", "model": "m", "input": "hi", "stream": True, "client_metadata": {"k": 1}},
        websocket=True,
    )
    assert request.model == "m" and request.stream is True
    assert request.model_extra == {"client_metadata": {"k": 1}}


def test_store_defaults_to_true_as_in_the_api():
    assert parse_create({"model": "m"}, websocket=False).stores is True
    assert parse_create({"model": "m", "store": False}, websocket=False).stores is False


def test_background_is_refused_over_websocket_only():
    error = refused({"model": "m", "background": True})
    assert (error.code, error.param) == ("unsupported_parameter", "background")
    assert parse_create({"model": "m", "background": True}, websocket=False).background is True


def test_stream_id_is_refused_over_http():
    error = refused({"model": "m", "stream_id": "a"}, websocket=False)
    assert (error.code, error.param) == ("unsupported_parameter", "stream_id")


@pytest.mark.parametrize(
    ("body", "code", "param"),
    [
        ({}, "missing_required_parameter", "model"),
        ({"model": ""}, "invalid_value", "model"),
        ({"model": 3}, "invalid_value", "model"),
        ({"model": "m", "input": {"a": 1}}, "invalid_value", "input"),
        ({"model": "m", "temperature": -1}, "invalid_value", "temperature"),
        ({"model": "m", "top_p": 1.5}, "invalid_value", "top_p"),
        ({"model": "m", "max_output_tokens": 0}, "invalid_value", "max_output_tokens"),
        ({"model": "m", "metadata": {"k": 1}}, "invalid_value", "metadata.k"),
        ({"model": "m", "tools": ["x"]}, "invalid_value", "tools.0"),
        ({"model": "m", "generate": "maybe"}, "invalid_value", "generate"),
    ],
)
def test_invalid_fields_name_the_param(body, code, param):
    error = refused(body)
    assert (error.status, error.code, error.param) == (400, code, param)
    assert param in error.message


@pytest.mark.parametrize("value", ["a", "A-b_c.9", "x" * 256])
def test_valid_stream_ids(value):
    assert check_stream_id(value) == value


@pytest.mark.parametrize("value", ["", "x" * 257, "a b", "a/b", "é", 7, ["a"]])
def test_invalid_stream_ids(value):
    with pytest.raises(APIError) as raised:
        check_stream_id(value)
    assert (raised.value.code, raised.value.param) == ("invalid_stream_id", "stream_id")


def test_no_stream_id_is_the_default_lane():
    assert check_stream_id(None) is None
