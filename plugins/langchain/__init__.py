"""LangChain: WebSocket mode behind one flag, for new code and for existing agents.

    from plugins.langchain import ChatOpenAI          # was: from langchain_openai import ChatOpenAI

    model = ChatOpenAI(model="gpt-5.1")                # transport="websocket" unless RESPONSES_WS_TRANSPORT=http
    agent = langchain.agents.create_agent(model, tools)

`ChatOpenAI` is `langchain_openai.ChatOpenAI` with a `transport` field. It always uses the
Responses API, so the two transports differ only in how the request travels:

- `"http"`: the stock behaviour, every turn a `POST /responses` with the whole history.
- `"websocket"`: the model's own `openai` clients are wrapped with `ws_transport.wrap`, so
  `responses.create` goes over one persistent WebSocket. Each call converts only the messages
  after the newest `AIMessage` that carries a response id and sends them with that id as
  `previous_response_id` (what `use_previous_response_id=True` does), so the client's work per
  turn does not grow with the history. That happens only when the messages before it are the
  history that response answered (see `Lineage`): a history a middleware summarized or trimmed
  goes in full, as over HTTP. If the server has lost the response (a reconnect with
  `store=False`), the call is repeated once with the full history.

Threads: a call made inside a LangGraph run with a `thread_id` (or inside `agent_session(key)`)
uses a session of its own, i.e. its own socket and server-side connection cache, kept for the
most recent `max_agent_sessions` threads; other calls share the model's root session. Either
way a thread's requests name the response its own history ended with, so parallel threads
never continue each other's chain.

For an agent whose model is already a stock `ChatOpenAI`, add `WebSocketTransportMiddleware()`
to `create_agent(..., middleware=[...])`: it switches the model to the WebSocket transport for
each model call of the run and leaves other models alone.

A stock `ChatOpenAI` kept on Chat Completions: `websocket_chat_completions(model)` (see
`chat_completions.py`) sends its `chat.completions.create` calls over a session.
"""

from __future__ import annotations

from .chat_completions import websocket_chat_completions
from .lineage import Lineage, split_at_last_response
from .middleware import WebSocketTransportMiddleware, with_websocket_transport
from .model import TRANSPORT_ENV, ChatOpenAI, Transport, agent_session, default_transport

__all__ = [
    "TRANSPORT_ENV",
    "ChatOpenAI",
    "Lineage",
    "Transport",
    "WebSocketTransportMiddleware",
    "agent_session",
    "default_transport",
    "split_at_last_response",
    "websocket_chat_completions",
    "with_websocket_transport",
]
