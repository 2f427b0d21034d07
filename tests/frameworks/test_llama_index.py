"""LlamaIndex (openai 2.x venv): a real `FunctionAgent` with a tool, on the `OpenAI` (Chat Completions)
and `OpenAIResponses` LLMs, their clients wrapped by `ws_transport.wrap()`."""

from __future__ import annotations

from typing import Any

import pytest
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.memory import ChatMemoryBuffer
from llama_index.llms.openai import OpenAI, OpenAIResponses
from openai import AsyncOpenAI
from support.agent_tasks import TASKS, answered, lookup
from support.wire import API_KEY

import ws_transport

pytestmark = pytest.mark.timeout(60)

MODEL = "gpt-4o-mini"  # LlamaIndex sizes its context window by the model name: the simulator answers to this one


@pytest.mark.parametrize("llm_class", [OpenAI, OpenAIResponses], ids=["OpenAI", "OpenAIResponses"])
async def test_a_function_agent_with_a_tool_chains_every_turn_after_the_first(
    make_server: Any, chain_report: Any, llm_class: Any
) -> None:
    server = make_server(default_model=MODEL)
    client = ws_transport.wrap(AsyncOpenAI(base_url=server.base_url, api_key=API_KEY))
    llm = llm_class(model=MODEL, api_key=API_KEY, api_base=server.base_url, async_openai_client=client)
    agent = FunctionAgent(tools=[lookup], llm=llm, system_prompt="Answer briefly.")
    memory = ChatMemoryBuffer.from_defaults()
    outputs = [str(await agent.run(task, memory=memory)) for task in TASKS]
    stats = ws_transport.session_of(client).stats
    await client.close()

    assert answered(outputs)
    assert (stats.turns, stats.turns_chained, stats.fallbacks) == (6, 5, 0)
    assert stats.chat_turns == (6 if llm_class is OpenAI else 0)
    assert stats.chat_fallbacks == {}
    chain_report(f"LlamaIndex {llm_class.__name__}", "llama-index-llms-openai", stats)
