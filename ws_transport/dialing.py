"""Opening a socket: the `policy.Dialer`'s attempts carried out, moving through the replicas.

Out of `session.py` so the session keeps to what a turn does; the decisions (how long to wait,
what a refusal means) stay in the sans-I/O `Dialer`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from websockets.asyncio.client import ClientConnection
from websockets.exceptions import InvalidHandshake, InvalidStatus

from . import _sdk
from .errors import UpgradeRejected
from .headers import Headers
from .options import SessionOptions
from .policy import Dialer, Replicas, Verdict

log = logging.getLogger("ws_transport")


class FallBack(Exception):
    """The upgrade was refused with 404/405/426, or the attempts are spent: the session goes over HTTP."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


async def dial(
    options: SessionOptions, replicas: Replicas, headers: Headers, user_agent: str | None
) -> ClientConnection:
    """A socket opened with the dialer's backoff; `UpgradeRejected` for a refusal the caller must see
    (401, 403...), `FallBack` when the session must continue over HTTP."""
    dialer = Dialer(options.reconnect)
    while (delay := dialer.next_delay()) is not None:
        await asyncio.sleep(delay)
        try:
            return await _connect(options, replicas.current, headers, user_agent)
        except InvalidStatus as exc:
            status = exc.response.status_code
            verdict = dialer.failed(status, f"the server refused the WebSocket upgrade with HTTP {status}")
            if verdict is Verdict.REJECT:
                content_type = exc.response.headers.get("content-type", "text/plain")
                body = bytes(exc.response.body or b"")
                raise UpgradeRejected(status, body, [("content-type", content_type)]) from exc
        except (OSError, TimeoutError, InvalidHandshake) as exc:
            verdict = dialer.failed(None, str(exc))
        log.debug("ws_transport: connection attempt %d failed: %s", dialer.attempts, dialer.reason)
        replicas.failed()  # the next replica, if any
        if verdict is Verdict.FALL_BACK:
            break
    raise FallBack(dialer.reason)


async def _connect(options: SessionOptions, url: str, headers: Headers, user_agent: str | None) -> ClientConnection:
    connect: dict[str, Any] = {"max_size": None, "compression": None, "open_timeout": options.open_timeout_s}
    connect.update(options.connect_options)
    return await _sdk.connect_websocket(url, headers, user_agent, **connect)
