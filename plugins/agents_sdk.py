"""OpenAI Agents SDK: run agents over a `ws_transport`-wrapped `AsyncOpenAI`.

    from agents import Agent, Runner
    from plugins.agents_sdk import websocket_run_config

    run_config = websocket_run_config(base_url="http://127.0.0.1:8787/v1", api_key="sk-local")
    result = await Runner.run(agent, "Find record 3", run_config=run_config)

Every model the run resolves is the SDK's own `OpenAIResponsesModel` over one wrapped client:
the SDK sends the whole conversation each turn, as it does over HTTP, and the transport sends
`previous_response_id` plus only the new items on one persistent WebSocket.

When to use the SDK's own WebSocket model instead
--------------------------------------------------
The SDK has one: `OpenAIResponsesWSModel`, enabled with
`agents.set_default_openai_responses_transport("websocket")`, `OpenAIProvider(use_responses_websocket=True)`
or `agents.responses_websocket_session()`. Prefer it when you talk to api.openai.com only, your
runs on a model are sequential, and you either accept the full history on every turn or run with
`auto_previous_response_id=True`/`previous_response_id` (server-side state, so `store` matters).
It needs nothing from this project, and it also works against the shim (`websocket_base_url`).

Use this module when you want:
- chaining without asking for it: the wrapped client finds the previous response itself and
  sends only the new items, also with `store=False`; a lost chain (reconnect, cache eviction)
  is resent in full once instead of failing the run;
- concurrency: parallel runs share a socket through `stream_id` lanes (the SDK's model
  serializes requests on its one connection with a lock);
- fallback: a proxy that refuses the upgrade (404/405/426) sends the session back to HTTP.

What the shim adds behind either one: WebSocket mode in front of any backend (vLLM, SGLang,
Ollama, llama.cpp, Cerebras), none of which has it; connection-scoped state that survives
`store=False` and a response store shared by every connection of the server, so a reconnecting
client can continue a stored chain; validators and classifiers that see only the new
items; routing, failover and usage sinks (see `plugins.hookspecs`).
"""

from __future__ import annotations

from typing import Any

from agents import RunConfig
from agents.models import get_default_model
from agents.models.interface import Model, ModelProvider
from agents.models.openai_responses import OpenAIResponsesModel
from openai import AsyncOpenAI

import ws_transport

from .transport import wrap as wrap_client


def wrapped_client(
    client: AsyncOpenAI | None = None, *, base_url: str | None = None, api_key: str | None = None, **options: Any
) -> AsyncOpenAI:
    """`client` (or a new `AsyncOpenAI(base_url=..., api_key=...)`) wrapped in place; options: `SessionOptions` fields."""
    if client is None:
        client = AsyncOpenAI(base_url=base_url, api_key=api_key)
    return wrap_client(client, **options)


def websocket_model(model: str, client: AsyncOpenAI | None = None, **client_args: Any) -> OpenAIResponsesModel:
    """An `OpenAIResponsesModel` over a wrapped client, for `Agent(model=...)`."""
    return OpenAIResponsesModel(model, wrapped_client(client, **client_args))


class WebSocketModelProvider(ModelProvider):
    """Resolves every model name to an `OpenAIResponsesModel` over one wrapped client (one session).

    `default_model` serves agents that name no model (else the SDK's default). `session` is the
    `ws_transport.Session` (its `stats`); `aclose()` closes the client and its sockets.
    """

    def __init__(
        self,
        client: AsyncOpenAI | None = None,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        default_model: str | None = None,
        **options: Any,
    ) -> None:
        self.client = wrapped_client(client, base_url=base_url, api_key=api_key, **options)
        self.default_model = default_model

    @property
    def session(self) -> ws_transport.Session:
        return ws_transport.session_of(self.client)

    def get_model(self, model_name: str | None) -> Model:
        name = model_name or self.default_model or get_default_model()
        return OpenAIResponsesModel(name, self.client, model_is_explicit=model_name is not None)

    async def aclose(self) -> None:
        await self.client.close()


def websocket_run_config(
    provider: WebSocketModelProvider | AsyncOpenAI | None = None,
    *,
    base_url: str | None = None,
    api_key: str | None = None,
    default_model: str | None = None,
    **run_config_fields: Any,
) -> RunConfig:
    """A `RunConfig` whose models run over the WebSocket transport; other `RunConfig` fields as keywords.

    Pass a `WebSocketModelProvider` to share its session between runs, an `AsyncOpenAI` to wrap,
    or `base_url`/`api_key` to build one.
    """
    if isinstance(provider, WebSocketModelProvider):
        if base_url or api_key or default_model:
            raise TypeError("base_url, api_key and default_model belong to the provider you passed, not here")
    else:
        provider = WebSocketModelProvider(provider, base_url=base_url, api_key=api_key, default_model=default_model)
    return RunConfig(model_provider=provider, **run_config_fields)
