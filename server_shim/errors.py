"""Errors a client can switch on: one exception carries the HTTP status and the API error body."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class APIError(Exception):
    """An error reported to the client as an `error` event (WebSocket) or an error JSON body (HTTP)."""

    status: int
    code: str
    message: str
    param: str | None = None
    type: str = "invalid_request_error"
    retry_after_s: float | None = None
    """When a retry can succeed (rate limits, overload, shutdown); HTTP sends it as `Retry-After`."""

    def __str__(self) -> str:
        return f"{self.status} {self.code}: {self.message}"

    def body(self) -> dict[str, Any]:
        return {"message": self.message, "type": self.type, "param": self.param, "code": self.code}

    def event(self) -> dict[str, Any]:
        return {"type": "error", "status": self.status, "error": self.body()}


def invalid(code: str, message: str, param: str | None = None) -> APIError:
    return APIError(400, code, message, param)


def previous_response_not_found(response_id: str) -> APIError:
    return APIError(
        400,
        "previous_response_not_found",
        f"Previous response with id '{response_id}' not found.",
        "previous_response_id",
    )


def store_unavailable() -> APIError:
    """The shared response store (Redis) did not answer: only turns that need it fail, and only until it is back."""
    return APIError(
        503,
        "store_unavailable",
        "The response store is unreachable right now; retry shortly, or send the full input without "
        "previous_response_id.",
        type="server_error",
    )


def internal_error() -> APIError:
    """A bug on our side (a plugin or backend raised something unexpected): reported, never a hang."""
    return APIError(500, "server_error", "The server had an error while processing your request.", type="server_error")


class BackendError(Exception):
    """The backend failed: unreachable, an error status, or a stream cut short."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        retryable: bool = True,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.retryable = retryable
        self.retry_after_s = retry_after_s

    def api_error(self) -> APIError:
        if self.status == 429:
            return APIError(429, "rate_limit_exceeded", str(self), type="rate_limit_error")
        if self.status == 503:
            return APIError(503, "backend_unavailable", str(self), type="server_error")
        if self.status is not None and 400 <= self.status < 500:
            return APIError(400, "backend_rejected_request", str(self))
        return APIError(502, "backend_error", str(self), type="server_error")
