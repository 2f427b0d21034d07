"""ws_transport: Responses API WebSocket mode for any `openai` client, with automatic incremental chaining.

    client = ws_transport.wrap(openai.OpenAI())       # or AsyncOpenAI
    response = client.responses.create(model=..., input=history, tools=tools)
    ws_transport.session_of(client).stats              # turns, turns_chained, bytes_sent, ...

`wrap()` keeps the client's API: `responses.create`/`responses.stream` run over one persistent
WebSocket session and send `previous_response_id` plus only the new items whenever the history
allows; `chat.completions.create` does too unless `wrap(client, chat_completions=False)` (translated
to `response.create`, answered as `ChatCompletion` / chunks); every other endpoint stays on HTTP.
For a client built elsewhere, pass
`httpx2.Client(transport=WebSocketTransport())` (or the async one; `httpx.Client` for an openai
1.x/2.x client) as its `http_client`. openai 1.x, 2.x and 3.x are supported (see `_http.py`).

Errors: failures the server reports reach the caller as the SDK's own exceptions, exactly as
over HTTP; the transport's own are `TransportError` and its subclasses (see `ws_transport.errors`).
"""

from __future__ import annotations

from .errors import ConnectionLost, SessionClosed, TransportError, TurnNotPrepared
from .httpx_transport import AsyncWebSocketTransport, WebSocketTransport
from .options import ReconnectPolicy, SessionOptions, SessionStats
from .session import Session
from .wrap import session_of, wrap

__all__ = [
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
