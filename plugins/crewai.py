"""CrewAI: an `LLM` whose OpenAI calls ride one WebSocket session.

    from plugins.crewai import websocket_llm

    llm = websocket_llm(LLM(model="openai/gpt-4.1", base_url=...))
    agent = Agent(role=..., goal=..., backstory=..., llm=llm, tools=[lookup])   # unchanged

CrewAI's native OpenAI provider (`crewai.llms.providers.openai.completion.OpenAICompletion`, what
`LLM(model="openai/...")` builds) calls the `openai` SDK itself, with its own `OpenAI` and
`AsyncOpenAI` clients; CrewAI pins `openai>=2.30,<3`, which `ws_transport` supports. Both clients
are wrapped by `ws_transport.wrap`: chat calls go over the session as chained `response.create`s,
and with `api="responses"` the Responses calls too. CrewAI starts each task's conversation afresh
(the task's context is in its first message), so the first call of every task goes in full.
"""

from __future__ import annotations

from typing import Any, TypeVar

import ws_transport

LLMT = TypeVar("LLMT")


def websocket_llm(llm: LLMT, **options: Any) -> LLMT:
    """Wrap the sync and async `openai` clients of a CrewAI OpenAI `LLM`; returns `llm`.

    `options` are `ws_transport.SessionOptions` fields. Raises `TypeError` for an LLM of another
    provider (they do not call the `openai` SDK).
    """
    if not (hasattr(llm, "_get_sync_client") and hasattr(llm, "_get_async_client")):
        raise TypeError(f"expected CrewAI's native OpenAI LLM (LLM(model='openai/...')), got {type(llm).__name__}")
    llm._client = ws_transport.wrap(llm._get_sync_client(), **options)  # type: ignore[attr-defined]
    llm._async_client = ws_transport.wrap(llm._get_async_client(), **options)  # type: ignore[attr-defined]
    return llm


def session_of(llm: Any) -> ws_transport.Session:
    """The session of the sync client (the one CrewAI's `Crew.kickoff()` uses)."""
    return ws_transport.session_of(llm._client)
