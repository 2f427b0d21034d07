"""The transport's exceptions, and error events turned into the HTTP answers the SDK already understands.

What a caller can meet (all importable from `ws_transport`):

    openai.OpenAIError
    └── TransportError                  base of every ws_transport error
        ├── SessionClosed (RuntimeError)  a turn on a client (session) that was closed
        ├── TurnNotPrepared (RuntimeError)
        │                               a request marked as prepared by another client's `wrap`
        └── ConnectionLost              the socket closed before the response completed; reaches
                                        the caller in the `__cause__` chain of `openai.APIConnectionError`

Each subclasses what a caller of the `openai` SDK already catches: `openai.OpenAIError`, and
`RuntimeError` where plain HTTP raises that (a closed httpx client). The SDK passes its own
errors through without retrying them.

The session's internal signals (`UseHTTP`, `UpgradeRejected`, `TurnRejected`) never reach the
caller: they become an HTTP fallback or the HTTP response the server's answer stands for.

An `error` event becomes an HTTP response with the event's status and `{"error": {...}}` body, so
the SDK raises exactly what it raises over HTTP (`BadRequestError` for 400, `NotFoundError` for
404, `RateLimitError` for 429, `InternalServerError` for 5xx, ...) and applies its own retry rules.
"""

from __future__ import annotations

from typing import Any

import httpx2
import openai
import orjson

from . import _http

STATUS_BY_TYPE = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "rate_limit_error": 429,
    "server_error": 500,
}


class TransportError(openai.OpenAIError):
    """Base class of every `ws_transport` error."""


class SessionClosed(TransportError, RuntimeError):
    """The client (its session) was closed: it sends no more turns, as a closed HTTP client sends nothing."""


class TurnNotPrepared(TransportError, RuntimeError):
    """A request carries a prepared-turn ticket this session never issued (sent through another client)."""


class ConnectionLost(TransportError):
    """The socket closed before the turn's terminal event."""

    def __init__(self, code: int, reason: str = "") -> None:
        super().__init__(f"WebSocket closed with code {code} before the response completed {reason}".strip())
        self.code = code
        self.reason = reason


class SessionError(Exception):
    """Base of the session's internal signals; none of them reaches the caller as is."""


class UseHTTP(SessionError):
    """The session cannot use a WebSocket (upgrade refused, or the reconnect budget is spent)."""


class UpgradeRejected(SessionError):
    """The server refused the upgrade with a status the caller must see (401, 403, ...)."""

    def __init__(self, status: int, body: bytes, headers: list[tuple[str, str]]) -> None:
        super().__init__(f"WebSocket upgrade rejected with HTTP {status}")
        self.status = status
        self.body = body
        self.headers = headers


class TurnRejected(SessionError):
    """The server answered the request with an `error` event before the response started."""

    def __init__(self, event: dict[str, Any]) -> None:
        self.error = error_body(event)
        self.status = error_status(event)
        super().__init__(f"{self.status} {self.error.get('code')}: {self.error.get('message')}")


def error_body(event: dict[str, Any]) -> dict[str, Any]:
    error = event.get("error")
    return error if isinstance(error, dict) else {"message": str(error or "unknown error"), "type": "server_error"}


def error_code(event: dict[str, Any]) -> str | None:
    code = error_body(event).get("code")
    return code if isinstance(code, str) else None


def error_status(event: dict[str, Any]) -> int:
    """The event's own `status` when it has one, else the status its error type has over HTTP."""
    status = event.get("status")
    if isinstance(status, int) and 400 <= status <= 599:
        return status
    return STATUS_BY_TYPE.get(str(error_body(event).get("type")), 500)


def error_response(status: int, error: dict[str, Any], request: httpx2.Request) -> httpx2.Response:
    return _http.module_of(request).Response(
        status,
        headers={"content-type": "application/json"},
        content=orjson.dumps({"error": error}),
        request=request,
    )
