"""One tool-calling agent per framework, its model calls over one WebSocket session: the one line each needs.

    python examples/framework_agents.py pydantic-ai        # a shim on loopback, simulated backend
    python examples/framework_agents.py autogen
    python examples/framework_agents.py langchain           # a stock ChatOpenAI on Chat Completions
    python examples/framework_agents.py smolagents          # a ToolCallingAgent (pip install -e '.[smolagents]')
    python examples/framework_agents.py llama-index         # needs LlamaIndex (openai<3): tests/frameworks/requirements.txt
    python examples/framework_agents.py crewai              # needs CrewAI (openai<3): tests/frameworks/requirements.txt
    python examples/framework_agents.py autogen --base-url https://api.openai.com/v1 --model gpt-4.1   # a real endpoint

Each agent has a `lookup` tool and runs three tasks on one conversation. Against the shim's
simulator the model calls the tool because the task says `call lookup {...}`, then answers with
the tool's result. The script prints the answers and the session's stats: turns sent, and how
many of them went with `previous_response_id` and only their new messages.

Each framework is an optional install: `pip install -e '.[pydantic-ai]'` (or `.[autogen]`,
`.[langchain]`, `.[smolagents]`) from this checkout; LlamaIndex and CrewAI pin openai<3, so they go in a venv of
their own with `pip install -e . -r tests/frameworks/requirements.txt`. A missing one is named, exit 2.

The model name defaults to `gpt-4o-mini`, not the other examples' `simulated-1`: LlamaIndex and
CrewAI refuse model names they do not know, so the shim started here serves its simulator under
that name (`default_model`). The key is `--api-key`, else `OPENAI_API_KEY`, else `sk-local` (the
shim started here checks none; a real endpoint needs its own).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

from openai import AsyncOpenAI

import ws_transport
from server_shim import BackgroundServer, Settings, create_app

TASKS = [f"Find record {n}.\ncall lookup {json.dumps({'n': n})}" for n in (3, 4, 5)]


def lookup(n: int) -> str:
    """Look up a record by number."""
    return f"record {n} is blue"


SIMULATED = True
"""Whether the model is the shim's simulator (no --base-url): it calls a tool only when told by a `call` line."""


def pydantic_ai(base_url: str, api_key: str, model: str) -> tuple[list[str], Any]:
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    client = ws_transport.wrap(AsyncOpenAI(base_url=base_url, api_key=api_key))  # the one line
    agent = Agent(OpenAIChatModel(model, provider=OpenAIProvider(openai_client=client)), instructions="Be brief.")
    agent.tool_plain(lookup)

    async def run() -> list[str]:
        history, outputs = None, []
        for task in TASKS:
            result = await agent.run(task, message_history=history)
            history, _ = result.all_messages(), outputs.append(result.output)
        return outputs

    return asyncio.run(run()), ws_transport.session_of(client).stats


def autogen(base_url: str, api_key: str, model: str) -> tuple[list[str], Any]:
    from autogen_agentchat.agents import AssistantAgent
    from autogen_core.models import ModelInfo
    from autogen_ext.models.openai import OpenAIChatCompletionClient

    from plugins.autogen import session_of, websocket_model_client

    info = ModelInfo(vision=False, function_calling=True, json_output=False, family="unknown", structured_output=False)
    client = websocket_model_client(  # the one line
        OpenAIChatCompletionClient(model=model, base_url=base_url, api_key=api_key, model_info=info)
    )
    agent = AssistantAgent("clerk", model_client=client, tools=[lookup], reflect_on_tool_use=True)

    async def run() -> list[str]:
        return [str((await agent.run(task=task)).messages[-1].content) for task in TASKS]

    return asyncio.run(run()), session_of(client).stats


def langchain(base_url: str, api_key: str, model: str) -> tuple[list[str], Any]:
    from langchain.agents import create_agent
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    from plugins.langchain import websocket_chat_completions

    chat = websocket_chat_completions(ChatOpenAI(model=model, base_url=base_url, api_key=api_key))  # the one line
    agent = create_agent(chat, [tool(lookup)], system_prompt="Be brief.")
    messages: list[Any] = []
    outputs = []
    for task in TASKS:
        messages = agent.invoke({"messages": [*messages, {"role": "user", "content": task}]})["messages"]
        outputs.append(str(messages[-1].content))
    return outputs, ws_transport.session_of(chat.root_client).stats


def llama_index(base_url: str, api_key: str, model: str) -> tuple[list[str], Any]:
    from llama_index.core.agent.workflow import FunctionAgent
    from llama_index.core.memory import ChatMemoryBuffer
    from llama_index.llms.openai import OpenAI as LlamaOpenAI

    client = ws_transport.wrap(AsyncOpenAI(base_url=base_url, api_key=api_key))
    llm = LlamaOpenAI(model=model, api_key=api_key, api_base=base_url, async_openai_client=client)  # the one line
    agent = FunctionAgent(tools=[lookup], llm=llm, system_prompt="Be brief.")
    memory = ChatMemoryBuffer.from_defaults()

    async def run() -> list[str]:
        return [str(await agent.run(task, memory=memory)) for task in TASKS]

    return asyncio.run(run()), ws_transport.session_of(client).stats


def crewai(base_url: str, api_key: str, model: str) -> tuple[list[str], Any]:
    os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("OTEL_SDK_DISABLED", "true")
    from crewai import LLM, Agent, Crew, Task
    from crewai.tools import tool

    from plugins.crewai import session_of, websocket_llm

    llm = websocket_llm(LLM(model=f"openai/{model}", base_url=base_url, api_key=api_key))  # the one line
    agent = Agent(
        role="clerk", goal="find records", backstory="A records clerk.", llm=llm, tools=[tool("lookup")(lookup)]
    )
    tasks = [Task(description=task, expected_output="the record", agent=agent) for task in TASKS]
    result = Crew(agents=[agent], tasks=tasks).kickoff()
    return [task.raw for task in result.tasks_output], session_of(llm).stats


def smolagents(base_url: str, api_key: str, model: str) -> tuple[list[str], Any]:
    from smolagents import OpenAIServerModel, ToolCallingAgent, tool

    from plugins.smolagents import session_of, websocket_model

    @tool
    def lookup_record(n: int) -> str:
        """Look up a record by number.

        Args:
            n: the record's number
        """
        found = lookup(n)  # a smolagents agent ends with its final_answer tool: the simulator is told so
        return f"{found}\ncall final_answer {json.dumps({'answer': found})}" if SIMULATED else found

    smol = websocket_model(OpenAIServerModel(model_id=model, api_base=base_url, api_key=api_key))  # the one line
    agent = ToolCallingAgent(tools=[lookup_record], model=smol, verbosity_level=0, max_steps=4)
    tasks = [task.replace("call lookup", "call lookup_record") for task in TASKS]
    outputs = [str(agent.run(task, reset=index == 0)) for index, task in enumerate(tasks)]
    return outputs, session_of(smol).stats


FRAMEWORKS: dict[str, Callable[[str, str, str], tuple[list[str], Any]]] = {
    "pydantic-ai": pydantic_ai,
    "autogen": autogen,
    "langchain": langchain,
    "llama-index": llama_index,
    "crewai": crewai,
    "smolagents": smolagents,
}


INSTALL = {
    "pydantic-ai": "pip install -e '.[pydantic-ai]'",
    "autogen": "pip install -e '.[autogen]'",
    "langchain": "pip install -e '.[langchain]'",
    "smolagents": "pip install -e '.[smolagents]'",
    "llama-index": "pip install -e . -r tests/frameworks/requirements.txt  (a venv of its own: openai<3)",
    "crewai": "pip install -e . -r tests/frameworks/requirements.txt  (a venv of its own: openai<3)",
}
"""What each framework needs, from the repository root."""


@contextlib.contextmanager
def endpoint(base_url: str | None) -> Iterator[str]:
    """`base_url` as given, else a shim on a free loopback port with the simulated backend."""
    if base_url:
        yield base_url
        return
    settings = Settings(port=0, default_model="gpt-4o-mini", usage_ledger="off")  # a name LlamaIndex and CrewAI know
    with BackgroundServer(create_app(settings), settings) as server:
        yield server.base_url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("framework", choices=sorted(FRAMEWORKS))
    parser.add_argument("--base-url", help="a real endpoint instead of a shim on loopback")
    parser.add_argument("--model", default="gpt-4o-mini", help="default gpt-4o-mini: a name every framework accepts")
    parser.add_argument(
        "--api-key",
        default=os.environ.get("OPENAI_API_KEY", "sk-local"),
        help="default: $OPENAI_API_KEY, else sk-local",
    )
    args = parser.parse_args()
    global SIMULATED
    SIMULATED = args.base_url is None
    try:
        with endpoint(args.base_url) as base_url:
            outputs, stats = FRAMEWORKS[args.framework](base_url, args.api_key, args.model)
    except ModuleNotFoundError as exc:
        print(
            f"{args.framework} needs {exc.name!r}, which is not installed: {INSTALL[args.framework]}", file=sys.stderr
        )
        sys.exit(2)
    for task, output in zip(TASKS, outputs, strict=True):
        print(f"{task.splitlines()[0]} -> {output[:60]}")
    print(f"{args.framework}: {stats.turns_chained} of {stats.turns} turns chained, {stats.fallbacks} over HTTP")


if __name__ == "__main__":
    main()
