"""Who may call: bearer API keys on every route but the probes, the metrics key, and the refusal they get.

Kept apart from the app so the key checks (constant-time, every key compared) read on their own.
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence

from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket

from . import http
from .errors import APIError
from .tenants import ApiKey

PROBE_DETAILS = "probe_details"
"""Scope state: whether `/healthz` and `/readyz` may show deployment names and counts to this caller."""


class BearerAuth:
    """Require `Authorization: Bearer <key>` on every route but the probes; 401 at the upgrade.

    The key's tenant goes into the scope's state (`tenants.scope_tenant`) for the routes. `/metrics`
    names deployments and counts, so it takes any API key or the `metrics_key` (the one a scraper
    holds, which opens nothing else), unless `metrics_open`. Without API keys only `/metrics` is guarded
    (when a `metrics_key` is set).
    """

    PROBE_PATHS = frozenset({"/healthz", "/readyz"})
    METRICS_PATH = "/metrics"

    def __init__(
        self, app: ASGIApp, keys: Sequence[ApiKey], metrics_key: str | None = None, metrics_open: bool = False
    ) -> None:
        self.app = app
        self.keys = [(key.key.encode(), key.tenant) for key in keys]
        self.metrics_key = metrics_key.encode() if metrics_key else None
        self.metrics_open = metrics_open

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        if path in self.PROBE_PATHS:  # open, but their details only for a valid key
            scope.setdefault("state", {})[PROBE_DETAILS] = self._tenant(scope) is not None
            await self.app(scope, receive, send)
            return
        if path == self.METRICS_PATH:
            if self.metrics_open or self._metrics_allowed(scope):
                await self.app(scope, receive, send)
                return
        elif not self.keys:
            await self.app(scope, receive, send)
            return
        else:
            tenant = self._tenant(scope)
            if tenant is not None:
                scope.setdefault("state", {})["tenant"] = tenant
                await self.app(scope, receive, send)
                return
        error = APIError(
            401,
            "invalid_api_key",
            "Missing or invalid API key: send 'Authorization: Bearer <key>'.",
            type="authentication_error",
        )
        await deny(scope, receive, send, error)

    def _metrics_allowed(self, scope: Scope) -> bool:
        if self._tenant(scope) is not None:
            return True
        presented = _bearer(scope)
        return (
            self.metrics_key is not None and presented is not None and hmac.compare_digest(presented, self.metrics_key)
        )

    def _tenant(self, scope: Scope) -> str | None:
        """The tenant of the presented key; every key is compared (in constant time) so timing tells nothing."""
        presented = _bearer(scope)
        if presented is None:
            return None
        found = None
        for key, tenant in self.keys:
            if hmac.compare_digest(presented, key):
                found = tenant
        return found


def _bearer(scope: Scope) -> bytes | None:
    """The key of the request's `Authorization: Bearer <key>` header, if it has one."""
    for name, value in scope["headers"]:
        if name == b"authorization" and value[:7].lower() == b"bearer ":
            return bytes(value[7:].strip())
    return None


async def deny(scope: Scope, receive: Receive, send: Send, error: APIError) -> None:
    """Answer an HTTP request, or refuse a WebSocket upgrade, with `error`'s status and JSON body."""
    denial = http.error_response(error)
    if scope["type"] == "http":
        await denial(scope, receive, send)
    else:
        await WebSocket(scope, receive, send).send_denial_response(denial)
