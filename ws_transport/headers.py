"""Which request headers go on the WebSocket upgrade, and which of them say whom a socket speaks for."""

from __future__ import annotations

import httpx2

from .turn import TICKET_HEADER

DROP_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "content-type",
        "accept",
        "accept-encoding",
        "connection",
        "transfer-encoding",
        "user-agent",
        "idempotency-key",
        TICKET_HEADER,
        "x-stainless-raw-response",
        "x-stainless-retry-count",
        "x-stainless-read-timeout",
        "x-stainless-timeout",
    }
)
"""Request headers that describe one HTTP exchange; the rest (auth, org, project, beta, custom) go on the upgrade."""
CREDENTIAL_HEADERS = frozenset({"authorization", "api-key", "openai-organization", "openai-project"})
"""Headers that say who a request speaks for (`api-key` is Azure's)."""


Headers = list[tuple[str, str]]
Credentials = tuple[tuple[str, str], ...]


def upgrade_headers(request: httpx2.Request) -> Headers:
    """The request's headers that belong on the upgrade: auth, organization, project, beta, custom."""
    return [(k, v) for k, v in request.headers.multi_items() if k.lower() not in DROP_HEADERS]


def credentials_of(headers: Headers) -> Credentials:
    """What decides who a socket speaks for: a turn rides only a socket upgraded with the same."""
    return tuple(sorted((k.lower(), v) for k, v in headers if k.lower() in CREDENTIAL_HEADERS))


def websocket_url(url: httpx2.URL) -> str:
    return str(url.copy_with(scheme={"http": "ws", "https": "wss"}.get(url.scheme, url.scheme)))
