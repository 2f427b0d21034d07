"""The transport's public exceptions, and error events turned into the status HTTP would answer."""

from __future__ import annotations

import openai
import pytest

import ws_transport
from ws_transport.errors import error_body, error_status


def test_the_package_exports_the_user_surface_and_only_that() -> None:
    assert sorted(ws_transport.__all__) == [
        "AsyncWebSocketTransport",
        "ConnectionLost",
        "ReconnectPolicy",
        "Session",
        "SessionClosed",
        "SessionOptions",
        "SessionStats",
        "TransportError",
        "TurnNotPrepared",
        "WebSocketTransport",
        "session_of",
        "wrap",
    ]
    assert all(hasattr(ws_transport, name) for name in ws_transport.__all__)


@pytest.mark.parametrize(
    "error", [ws_transport.SessionClosed, ws_transport.TurnNotPrepared, ws_transport.ConnectionLost]
)
def test_every_transport_error_is_an_openai_error(error: type[Exception]) -> None:
    assert issubclass(error, ws_transport.TransportError) and issubclass(error, openai.OpenAIError)


def test_errors_raised_where_http_raises_runtime_error_are_runtime_errors_too() -> None:
    assert issubclass(ws_transport.SessionClosed, RuntimeError)
    assert issubclass(ws_transport.TurnNotPrepared, RuntimeError)


def test_connection_lost_carries_the_close_code_and_reason() -> None:
    lost = ws_transport.ConnectionLost(1011, "backend fell over")
    assert (lost.code, lost.reason) == (1011, "backend fell over")
    assert "1011" in str(lost) and "backend fell over" in str(lost)


@pytest.mark.parametrize(
    ("event", "status"),
    [
        ({"type": "error", "status": 429, "error": {"type": "rate_limit_error"}}, 429),
        ({"type": "error", "error": {"type": "invalid_request_error"}}, 400),
        ({"type": "error", "error": {"type": "not_found_error"}}, 404),
        ({"type": "error", "error": {"type": "something_new"}}, 500),
        ({"type": "error", "status": 200, "error": {"type": "authentication_error"}}, 401),
    ],
)
def test_an_error_event_answers_with_its_own_status_else_its_types(event: dict, status: int) -> None:
    assert error_status(event) == status


def test_an_error_event_without_an_error_object_still_has_a_body() -> None:
    assert error_body({"type": "error", "error": "boom"}) == {"message": "boom", "type": "server_error"}
