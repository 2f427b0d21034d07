"""Errors a client can switch on: one exception carries the HTTP status and the API error body."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

MAX_LISTED_MODELS = 20
"""How many served model names a `model_not_found` message lists before it abbreviates."""


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


def previous_response_in_progress(response_id: str) -> APIError:
    """The parent is still streaming on another lane of this connection: it exists, but has no output to continue from yet."""
    return APIError(
        409,
        "previous_response_in_progress",
        f"Previous response with id '{response_id}' is still in progress; wait for its terminal event.",
        "previous_response_id",
    )


def model_not_found(model: str, served: Sequence[str]) -> APIError:
    """Names what is served, so a client configured for another model (say `gpt-4o` against the simulator)
    learns the fix (`default_model`, a `models` alias, or the served name) from the error itself."""
    shown = ", ".join(served[:MAX_LISTED_MODELS]) + (", ..." if len(served) > MAX_LISTED_MODELS else "")
    suffix = f"; this server serves: {shown}." if served else "."
    return APIError(404, "model_not_found", f"The model '{model}' does not exist{suffix}", "model")


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
    """The backend failed: unreachable, an error status, or a stream cut short.

    The message is for the log: it may hold the backend's address and its error body. The
    client gets `api_error()`, which says what happened and the status, with the backend's own
    error message (`detail`) only after addresses and paths are taken out; `public=True` marks a
    message written by this server for the client (no backend text in it).
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        retryable: bool = True,
        retry_after_s: float | None = None,
        detail: str | None = None,
        public: bool = False,
        unreached: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.retryable = retryable
        self.retry_after_s = retry_after_s
        self.detail = detail
        self.public = public
        self.unreached = unreached
        """Why the backend was never reached ('connection refused'): safe for the client, unlike the address."""
        self.deployment: str | None = None
        """The deployment that failed (set by the router): clients may see its name, never its URL."""

    @property
    def backend_fault(self) -> bool:
        """Whether the backend itself failed (counts toward its breaker), rather than refused this request."""
        return self.status is None or self.status >= 500 or self.status == 408

    def api_error(self) -> APIError:
        """What the client sees: what happened, the status and the deployment's name, never its address."""
        status = self.status
        said = f": {redact(self.detail)}" if self.detail else ""
        backend = f"The backend of deployment {self.deployment!r}" if self.deployment else "The backend"
        if status == 429:
            wait = f" Retry after {self.retry_after_s:g} s." if self.retry_after_s else ""
            message = f"{backend} is rate limiting requests (status 429).{wait}"
            return APIError(
                429, "rate_limit_exceeded", message, type="rate_limit_error", retry_after_s=self.retry_after_s
            )
        if status == 504:
            message = str(self) if self.public else f"{backend} timed out (status 504)."
            return APIError(504, "backend_timeout", message, type="server_error")
        if status == 503:
            message = str(self) if self.public else f"{backend} is unavailable (status 503){said}."
            return APIError(503, "backend_unavailable", message, type="server_error", retry_after_s=self.retry_after_s)
        if status is not None and 400 <= status < 500:
            return APIError(400, "backend_rejected_request", f"{backend} rejected the request (status {status}){said}.")
        if self.public:
            return APIError(502, "backend_error", str(self), type="server_error")
        if self.unreached:
            where = f" to deployment {self.deployment!r}" if self.deployment else ""
            message = f"The backend was not reached: {self.unreached}{where}."
            return APIError(502, "backend_error", message, type="server_error")
        message = f"{backend} failed (status {status})." if status else f"{backend} failed before finishing."
        return APIError(502, "backend_error", message, type="server_error")


def _opaque(match: re.Match[str]) -> str:
    """A long run of token characters with both letters and digits: a key, a token, a hash."""
    run = match.group()
    return "<secret>" if any(c.isdigit() for c in run) and any(c.isalpha() for c in run) else run


_REDACTIONS: tuple[tuple[re.Pattern[str], Any], ...] = (
    (re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://\S+"), "<url>"),
    (re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]+"), r"\1 <secret>"),
    (
        re.compile(
            r"(?i)\b((?:x-)?api[_-]?key|(?:access|auth|refresh)[_-]?token|secret|password|passwd|authorization)"
            r"""(["']?\s*[:=]\s*["']?)(?!(?:bearer|basic)\s)[^\s"',;}]+"""
        ),
        r"\1\2<secret>",
    ),
    (
        re.compile(
            r"\b(?:(?:sk|pk|rk|csk|gsk|glpat|github_pat|gh[pousr]|xox[abposr])[-_][A-Za-z0-9_-]{3,}"
            r"|hf_[A-Za-z0-9]{8,}|key-[A-Za-z0-9]{8,}|(?:AKIA|ASIA)[0-9A-Z]{16}|AIza[0-9A-Za-z_-]{35})"
        ),
        "<secret>",
    ),
    (re.compile(r"\beyJ[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]*)?"), "<secret>"),  # a JWT
    (re.compile(r"\b[0-9a-fA-F]{24,}\b"), "<secret>"),
    (re.compile(r"[A-Za-z0-9+/_-]{32,}={0,2}"), _opaque),
    (re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?\b"), "<address>"),
    (
        re.compile(r"\[?(?:(?:[0-9a-fA-F]{1,4}:){7}[0-9a-fA-F]{1,4}|[0-9a-fA-F:]*::[0-9a-fA-F:]*)\]?(?::\d+)?"),
        "<address>",
    ),
    (re.compile(r"(?:[A-Za-z]:)?(?:[\\/][\w.@-]+){2,}[\\/]?"), "<path>"),
)


def without_credentials(url: str) -> str:
    """A backend URL for a log line: the user and password some URLs carry (`http://user:pw@host`) taken out."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def redact(text: str, limit: int = 300) -> str:
    """A backend's error text without URLs, credentials (bearer tokens, `sk-...`-like keys, `api_key=...`,
    long hex or base64 runs), IP addresses or file paths, and at most `limit` characters.

    Only the text's start is looked at (4 x `limit`): the rest is cut anyway, and a redaction pattern
    never runs over an unbounded body."""
    text = text[: 4 * limit]
    for pattern, replacement in _REDACTIONS:
        text = pattern.sub(replacement, text)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
