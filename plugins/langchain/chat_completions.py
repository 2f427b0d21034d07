"""A stock `langchain_openai.ChatOpenAI` on Chat Completions, its calls over one WebSocket session.

    from plugins.langchain import websocket_chat_completions

    model = websocket_chat_completions(ChatOpenAI(model="gpt-4.1", base_url=...))   # use_responses_api unset/False
    agent = create_agent(model, tools)                                                # unchanged

For users who keep LangChain on `chat.completions.create` (the default for most models and
OpenAI-compatible servers). The model's sync and async `openai` clients are wrapped by
`ws_transport.wrap(..., chat_completions=True)`: each call goes over the session as a chained
`response.create` with only the messages since the last answer. `ChatOpenAI` from this package
(the Responses API with lineage checks and per-thread sessions) remains the richer option.
"""

from __future__ import annotations

from typing import Any, TypeVar

import ws_transport

from .sessions import own_client

ModelT = TypeVar("ModelT")


def websocket_chat_completions(model: ModelT, **options: Any) -> ModelT:
    """Wrap the model's `root_client` and `root_async_client`; returns `model`. `options`: `SessionOptions` fields.

    Without an `http_client` of the user's, langchain-openai gives every model with the same base URL
    one cached httpx client; the model gets clients of its own first (borrowing that pool), so other
    models stay on HTTP.
    """
    for name, given, asynchronous in (
        ("root_client", "http_client", False),
        ("root_async_client", "http_async_client", True),
    ):
        client = getattr(model, name, None)
        if client is None:
            raise TypeError(f"expected a langchain_openai ChatOpenAI with its {name}, got {type(model).__name__}")
        client, _ = own_client(client, getattr(model, given, None), asynchronous=asynchronous)
        setattr(model, name, client)
        setattr(model, "async_client" if asynchronous else "client", client.chat.completions)
        ws_transport.wrap(client, chat_completions=True, **options)
    return model
