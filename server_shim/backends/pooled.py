"""What every HTTP backend shares: one pooled client, `/models`, and errors that carry their status."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import cast

import httpx2

from ..errors import BackendError, without_credentials
from .base import loads
from .rate_limits import RateLimitState


class PooledHTTPBackend:
    """One `httpx2.AsyncClient` per backend, reused by every request of every connection."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 300.0,
        name: str = "http",
        max_connections: int = 100,
        rate_limit_reserve_tokens: int = 2048,
    ) -> None:
        self.name = name
        self.base_url = base_url.rstrip("/")
        self.where = without_credentials(self.base_url)
        """The URL as log lines and error messages for the operator show it (no user or password)."""
        self.rate_limit = RateLimitState(reserve_tokens=rate_limit_reserve_tokens)
        headers = {"content-type": "application/json"}
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        self._client = httpx2.AsyncClient(
            base_url=self.base_url,
            headers=headers,
            timeout=httpx2.Timeout(timeout_s, connect=10.0),
            limits=httpx2.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        )

    def endpoint(self, path: str) -> httpx2.URL:
        """`path` under the base URL, merged as the client merges a relative URL: made once per backend and
        passed as it is, since a relative URL is parsed and merged again on every request (~2k bytecodes)."""
        return self._client.build_request("POST", path).url

    async def aclose(self) -> None:
        await self._client.aclose()

    async def models(self) -> list[str]:
        try:
            response = await self._client.get("/models")
        except httpx2.HTTPError as exc:
            raise BackendError(f"backend {self.where} unreachable: {exc}", unreached=unreached(exc)) from exc
        if response.status_code != 200:
            raise BackendError(
                f"backend {self.where} /models answered {response.status_code}", status=response.status_code
            )
        return [entry["id"] for entry in loads(response.content).get("data", [])]

    async def _status_error(self, response: httpx2.Response) -> BackendError:
        """The error for a non-200 answer: 5xx and 429 may be retried elsewhere, 429 says when."""
        status = response.status_code
        body = (await response.aread()).decode(errors="replace")[:2000]
        return BackendError(
            f"backend {self.where} answered HTTP {status}: {body[:500]}",
            status=status,
            retryable=status >= 500 or status == 429,
            retry_after_s=self.rate_limit.retry_after(response.headers) if status == 429 else None,
            detail=error_message(body),
        )


DRAIN_TIMEOUT_S = 0.1
"""How long a finished stream's remaining bytes may take to arrive (the `openai` SDK waits as long)."""


async def drain(response: httpx2.Response, timeout_s: float = DRAIN_TIMEOUT_S) -> None:
    """Read what is left of a stream after its end marker, so HTTP/1.1 can reuse its connection.

    A stream is parsed up to `[DONE]` or `response.completed`, but the body ends only with the last
    chunk after it; closed before that, httpx drops the connection, and the next turn connects
    again (20 turns to llama-cpp-python's server made 19 connections). Bounded, so a server that
    keeps the body open after its end marker cannot hold the turn: then the connection is dropped.
    """
    if response.is_closed:
        return
    with contextlib.suppress(httpx2.HTTPError, TimeoutError):
        async with asyncio.timeout(timeout_s):
            async for _ in cast(AsyncIterator[bytes], response.stream):
                pass


def error_message(body: str) -> str | None:
    """The message in an error body (`{"error": {"message"}}`, `{"message"}`, `{"detail"}`), else the text."""
    try:
        parsed = loads(body)
    except ValueError:
        return body.strip() or None
    if isinstance(parsed, dict):
        error = parsed.get("error")
        for candidate in (
            error.get("message") if isinstance(error, dict) else error,
            parsed.get("message"),
            parsed.get("detail"),
        ):
            if isinstance(candidate, str) and candidate:
                return candidate
    return None


def unreached(exc: BaseException) -> str | None:
    """Why a request never reached the backend, in words a client may see; None when it did reach it."""
    if isinstance(exc, httpx2.ConnectTimeout):
        return "connection timed out"
    if not isinstance(exc, httpx2.ConnectError):
        return None
    cause: BaseException | None = exc
    for _ in range(8):  # httpx2 wraps the socket's error a few levels down
        if cause is None:
            break
        if isinstance(cause, ConnectionRefusedError):
            return "connection refused"
        cause = cause.__cause__ or cause.__context__
    return "connection failed"
