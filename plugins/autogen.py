"""AutoGen: an `OpenAIChatCompletionClient` whose calls ride one WebSocket session.

    from plugins.autogen import websocket_model_client

    model_client = websocket_model_client(OpenAIChatCompletionClient(model="gpt-4.1", base_url=...))
    agent = AssistantAgent("clerk", model_client=model_client, tools=[lookup])   # unchanged

AutoGen sends every model call as `chat.completions.create` with the whole conversation. The
client's `AsyncOpenAI` is wrapped by `ws_transport.wrap(..., chat_completions=True)`, so each call
goes over the session as a chained `response.create` carrying only the messages since the last
answer, and comes back as the same `ChatCompletion` / chunks (`create` and `create_stream` alike).

AutoGen puts each message's `source` in the chat `name` field by default; the Responses input has
no such field, so a call with names could only go over HTTP. This adapter turns that off
(`include_name_in_message=False`, as AutoGen itself does for models that refuse names), so every
call can ride the session.
"""

from __future__ import annotations

from typing import Any, TypeVar

import ws_transport

ModelClientT = TypeVar("ModelClientT")


def websocket_model_client(model_client: ModelClientT, **options: Any) -> ModelClientT:
    """Route `model_client`'s calls over one WebSocket session; returns `model_client`.

    `model_client` is an `autogen_ext.models.openai.OpenAIChatCompletionClient` (or another
    `BaseOpenAIChatCompletionClient`); `options` are `ws_transport.SessionOptions` fields.
    """
    from autogen_ext.models.openai import BaseOpenAIChatCompletionClient

    if not isinstance(model_client, BaseOpenAIChatCompletionClient):
        raise TypeError(f"expected an AutoGen OpenAI chat completion client, got {type(model_client).__name__}")
    model_client._include_name_in_message = False  # type: ignore[attr-defined]
    ws_transport.wrap(model_client._client, chat_completions=True, **options)  # type: ignore[attr-defined]
    return model_client


def session_of(model_client: Any) -> ws_transport.Session:
    """The session behind a client returned by `websocket_model_client`: stats, chains."""
    return ws_transport.session_of(model_client._client)
