"""Suite `frameworks`: the agent loop of `benchmarks agent`, run by each framework, HTTP against WebSocket.

Each framework's own agent (a `lookup` tool returning ~4 KB, tasks `call lookup {...}` on one
conversation, two model calls a task: the tool call, then the answer) makes `turns` model calls
against one shim (simulated backend at 1,000 tokens/s, in this process), twice: with the
framework's stock OpenAI client over HTTP (the shim's `/v1/responses` or `/v1/chat/completions`,
the whole history every call) and with its one-line WebSocket adapter (README "Frameworks").

Per run: total wall time; per-turn time (p50 of the intervals between the server starting
successive turns: one agent step, the framework's own work included); bytes the client sent;
turns chained (`previous_response_id`, from the session's stats); and the split of the total
into server time (each turn from the shim accepting it to its last event, the backend's 16-token
generation included) and client time (the rest: the framework, the SDK, serialization and the
wire). LlamaIndex and CrewAI pin openai<3: they run when this suite runs in their venv
(`pip install -e . -r tests/frameworks/requirements.txt`), and are listed as not installed otherwise.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from openai import AsyncOpenAI

import ws_transport
from server_shim import BackgroundServer, Settings, create_app
from server_shim.backends import SimulatedBackend
from server_shim.demo import tool_result

from .common import clean_floats, machine_info, progress, rotated, summarize, write_json
from .report import fmt, format_table

TOKENS_PER_S = 1000.0
PAYLOAD_BYTES = 4000
TRANSPORTS = ("http", "websocket")
API_KEY = "bench"
MODEL = "gpt-4o-mini"
"""The simulator answers to this name: LlamaIndex and CrewAI refuse names they do not know."""


@dataclass
class Run:
    """What one agent loop reports: its session's stats when it rode one."""

    turns_chained: int = 0
    calls: int = 0


@dataclass
class ServerTurns:
    """The server's view of each turn: when the shim accepted it and how long it took to finish."""

    started: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)

    def record(self, turn: Any) -> None:
        stages = turn.result.stages
        self.started.append(stages.started)
        self.seconds.append(stages.elapsed())


def task(n: int) -> str:
    return f"Find record {n}.\ncall lookup {json.dumps({'n': n})}"


def lookup(n: int) -> str:
    """Look up a record by number."""
    return tool_result(n + 1, PAYLOAD_BYTES)  # ~4 KB, as in `benchmarks agent`


def _stats(session: ws_transport.Session) -> Run:
    return Run(session.stats.turns_chained, session.stats.turns)


# One loop per framework: `loop(base_url, tasks, transport) -> Run`, two model calls per task ---------------


def langchain_responses(base_url: str, tasks: int, transport: str) -> Run:
    from langchain.agents import create_agent
    from langchain_core.tools import tool

    from plugins.langchain import ChatOpenAI

    chat = ChatOpenAI(model=MODEL, base_url=base_url, api_key=API_KEY, transport=transport, store=False)  # type: ignore[arg-type]
    agent = create_agent(chat, [tool(lookup)])
    messages: list[Any] = []
    for n in range(tasks):
        messages = agent.invoke({"messages": [*messages, {"role": "user", "content": task(n)}]})["messages"]
    session = chat.ws_session()
    stats = _stats(session) if session is not None else Run()
    chat.close()
    return stats


def langchain_chat(base_url: str, tasks: int, transport: str) -> Run:
    from langchain.agents import create_agent
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    from plugins.langchain import websocket_chat_completions

    chat = ChatOpenAI(model=MODEL, base_url=base_url, api_key=API_KEY)  # type: ignore[arg-type]
    if transport == "websocket":
        chat = websocket_chat_completions(chat)
    agent = create_agent(chat, [tool(lookup)])
    messages: list[Any] = []
    for n in range(tasks):
        messages = agent.invoke({"messages": [*messages, {"role": "user", "content": task(n)}]})["messages"]
    return _stats(ws_transport.session_of(chat.root_client)) if transport == "websocket" else Run()


def autogen(base_url: str, tasks: int, transport: str) -> Run:
    from autogen_agentchat.agents import AssistantAgent
    from autogen_core.models import ModelInfo
    from autogen_ext.models.openai import OpenAIChatCompletionClient

    from plugins.autogen import session_of, websocket_model_client

    info = ModelInfo(vision=False, function_calling=True, json_output=False, family="unknown", structured_output=False)
    client = OpenAIChatCompletionClient(model=MODEL, base_url=base_url, api_key=API_KEY, model_info=info)
    if transport == "websocket":
        client = websocket_model_client(client)
    agent = AssistantAgent("clerk", model_client=client, tools=[lookup], reflect_on_tool_use=True)

    async def run() -> None:
        for n in range(tasks):
            await agent.run(task=task(n))
        await client.close()

    asyncio.run(run())
    return _stats(session_of(client)) if transport == "websocket" else Run()


def _pydantic_ai(base_url: str, tasks: int, transport: str, responses: bool) -> Run:
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
    from pydantic_ai.providers.openai import OpenAIProvider

    async def run() -> Run:
        client = AsyncOpenAI(base_url=base_url, api_key=API_KEY, max_retries=0)
        if transport == "websocket":
            client = ws_transport.wrap(client)
        provider = OpenAIProvider(openai_client=client)
        model = (
            OpenAIResponsesModel(MODEL, provider=provider) if responses else OpenAIChatModel(MODEL, provider=provider)
        )
        agent = Agent(model, tools=[lookup])
        history = None
        for n in range(tasks):
            history = (await agent.run(task(n), message_history=history)).all_messages()
        stats = _stats(ws_transport.session_of(client)) if transport == "websocket" else Run()
        await client.close()
        return stats

    return asyncio.run(run())


def pydantic_ai_chat(base_url: str, tasks: int, transport: str) -> Run:
    return _pydantic_ai(base_url, tasks, transport, responses=False)


def pydantic_ai_responses(base_url: str, tasks: int, transport: str) -> Run:
    return _pydantic_ai(base_url, tasks, transport, responses=True)


def smolagents(base_url: str, tasks: int, transport: str) -> Run:
    from smolagents import OpenAIServerModel, Tool, ToolCallingAgent

    from plugins.smolagents import session_of, websocket_model

    class Lookup(Tool):
        name = "lookup"
        description = "Look up a record by number."
        inputs = {"n": {"type": "integer", "description": "the record's number"}}
        output_type = "string"

        def forward(self, n: int) -> str:  # the simulator is told the agent's next step, final_answer
            return f"{lookup(n)}\ncall final_answer {json.dumps({'answer': f'record {n}'})}"

    model = OpenAIServerModel(model_id=MODEL, api_base=base_url, api_key=API_KEY)
    if transport == "websocket":
        model = websocket_model(model)
    agent = ToolCallingAgent(tools=[Lookup()], model=model, verbosity_level=0, max_steps=4)
    for n in range(tasks):
        agent.run(task(n), reset=n == 0)
    return _stats(session_of(model)) if transport == "websocket" else Run()


def llama_index(base_url: str, tasks: int, transport: str) -> Run:
    from llama_index.core.agent.workflow import FunctionAgent
    from llama_index.core.memory import ChatMemoryBuffer
    from llama_index.llms.openai import OpenAI as LlamaOpenAI

    async def run() -> Run:
        client = AsyncOpenAI(base_url=base_url, api_key=API_KEY, max_retries=0)
        if transport == "websocket":
            client = ws_transport.wrap(client)
        llm = LlamaOpenAI(model=MODEL, api_key=API_KEY, api_base=base_url, async_openai_client=client)
        agent = FunctionAgent(tools=[lookup], llm=llm)
        memory = ChatMemoryBuffer.from_defaults()
        for n in range(tasks):
            await agent.run(task(n), memory=memory)
        stats = _stats(ws_transport.session_of(client)) if transport == "websocket" else Run()
        await client.close()
        return stats

    return asyncio.run(run())


def crewai(base_url: str, tasks: int, transport: str) -> Run:
    os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("OTEL_SDK_DISABLED", "true")
    from crewai import LLM, Agent, Crew, Task
    from crewai.tools import tool

    from plugins.crewai import session_of, websocket_llm

    llm = LLM(model=f"openai/{MODEL}", base_url=base_url, api_key=API_KEY)
    if transport == "websocket":
        llm = websocket_llm(llm)
    agent = Agent(
        role="clerk", goal="find records", backstory="A records clerk.", llm=llm, tools=[tool("lookup")(lookup)]
    )
    work = [Task(description=task(n), expected_output="the record", agent=agent) for n in range(tasks)]
    Crew(agents=[agent], tasks=work).kickoff()  # each task starts its conversation afresh
    return _stats(session_of(llm)) if transport == "websocket" else Run()


@dataclass(frozen=True)
class Framework:
    name: str
    label: str
    loop: Callable[[str, int, str], Run]
    needs: str


FRAMEWORKS = [
    Framework(
        "langchain-responses", "LangChain create_agent, plugins.langchain.ChatOpenAI", langchain_responses, "langchain"
    ),
    Framework(
        "langchain-chat", "LangChain create_agent, stock ChatOpenAI (Chat Completions)", langchain_chat, "langchain"
    ),
    Framework("autogen", "AutoGen AssistantAgent, OpenAIChatCompletionClient", autogen, "autogen_ext"),
    Framework("pydantic-ai-chat", "pydantic-ai Agent, OpenAIChatModel", pydantic_ai_chat, "pydantic_ai"),
    Framework("pydantic-ai-responses", "pydantic-ai Agent, OpenAIResponsesModel", pydantic_ai_responses, "pydantic_ai"),
    Framework("smolagents", "smolagents ToolCallingAgent, OpenAIServerModel", smolagents, "smolagents"),
    Framework("llama-index", "LlamaIndex FunctionAgent, OpenAI (openai<3 venv)", llama_index, "llama_index"),
    Framework("crewai", "CrewAI Agent/Crew, native OpenAI provider (openai<3 venv)", crewai, "crewai"),
]


def installed() -> list[Framework]:
    return [f for f in FRAMEWORKS if importlib.util.find_spec(f.needs) is not None]


def measure_one(server: BackgroundServer, framework: Framework, tasks: int, transport: str) -> dict[str, Any]:
    """One agent loop, with what the server saw of it."""
    seen = ServerTurns()
    shim = server.shim
    record = shim.record_turn

    def recording(turn: Any) -> None:
        seen.record(turn)
        record(turn)

    shim.record_turn = recording  # type: ignore[method-assign]
    before = shim.stats.bytes_received
    start = time.perf_counter()
    try:
        run = framework.loop(server.base_url, tasks, transport)
    finally:
        seconds = time.perf_counter() - start
        del shim.record_turn
    turns = len(seen.seconds)
    if turns != 2 * tasks:
        raise RuntimeError(
            f"{framework.name} over {transport}: {turns} model turns for {tasks} tasks (expected two each)"
        )
    steps = [b - a for a, b in zip(seen.started, seen.started[1:], strict=False)]
    steps.append(start + seconds - seen.started[-1])
    server_s = sum(seen.seconds)
    return {
        "seconds": seconds,
        "turns": turns,
        "turn_ms": [s * 1000 for s in steps],
        "server_s": server_s,
        "client_s": seconds - server_s,
        "bytes_sent": shim.stats.bytes_received - before,
        "turns_chained": run.turns_chained,
    }


def measure(frameworks: list[Framework], turns: int, repeats: int) -> dict[str, dict[str, list[dict[str, Any]]]]:
    backend = SimulatedBackend(tokens_per_s=TOKENS_PER_S, model=MODEL)
    settings = Settings(port=0, simulated_tokens_per_s=TOKENS_PER_S, usage_ledger="off")
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {f.name: {t: [] for t in TRANSPORTS} for f in frameworks}
    with BackgroundServer(create_app(settings, backend=backend), settings) as server:
        for framework in frameworks:
            for transport in TRANSPORTS:  # warm-up: imports, first connections, caches
                measure_one(server, framework, 1, transport)
        for rep in range(repeats):
            for framework in rotated(frameworks, rep):
                for transport in rotated(list(TRANSPORTS), rep):
                    progress(
                        f"frameworks: repeat {rep + 1}/{repeats}: {framework.name} over {transport}, {turns} turns"
                    )
                    runs[framework.name][transport].append(measure_one(server, framework, turns // 2, transport))
    return runs


def analyse(runs: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, by_transport in runs.items():
        row: dict[str, Any] = {}
        for transport, rs in by_transport.items():
            row[transport] = {
                "total_s": summarize(r["seconds"] for r in rs),
                "turn_ms": summarize(x for r in rs for x in r["turn_ms"]),
                "server_s": summarize(r["server_s"] for r in rs),
                "client_s": summarize(r["client_s"] for r in rs),
                "bytes_sent": summarize(r["bytes_sent"] for r in rs),
                "turns": rs[0]["turns"],
                "turns_chained": summarize(r["turns_chained"] for r in rs),
            }
        http, ws = row["http"], row["websocket"]
        if http["total_s"]["median"] and ws["total_s"]["median"]:
            row["websocket_over_http_total"] = ws["total_s"]["median"] / http["total_s"]["median"]
            row["bytes_ratio"] = http["bytes_sent"]["median"] / max(1.0, ws["bytes_sent"]["median"])
        out[name] = row
    return out


def table(result: dict[str, Any]) -> str:
    header = ["framework", "transport", "total s", "turn ms p50", "client s", "server s", "bytes sent", "chained"]
    rows = [header]
    for name, row in result["frameworks"].items():
        for transport in TRANSPORTS:
            v = row[transport]
            rows.append(
                [
                    name,
                    transport,
                    fmt(v["total_s"]["median"], 3),
                    fmt(v["turn_ms"]["median"], 1),
                    fmt(v["client_s"]["median"], 3),
                    fmt(v["server_s"]["median"], 3),
                    fmt(v["bytes_sent"]["median"], 0),
                    f"{fmt(v['turns_chained']['median'], 0)}/{v['turns']}",
                ]
            )
    cfg = result["config"]
    lines = [
        f"frameworks ({cfg['turns']}-turn agent loop per framework, {cfg['tokens_per_s']:g} tok/s simulated, "
        f"{cfg['payload_bytes']} B tool results, median of {cfg['repeats']} runs)",
        format_table(rows),
    ]
    if cfg["not_installed"]:
        lines.append(f"  not installed here (not run): {', '.join(cfg['not_installed'])}")
    for name, row in result["frameworks"].items():
        if "websocket_over_http_total" in row:
            lines.append(
                f"  {name}: total WebSocket / HTTP {fmt(row['websocket_over_http_total'], 3)}, "
                f"bytes sent HTTP / WebSocket {fmt(row['bytes_ratio'], 1)}x"
            )
    return "\n".join(lines)


def run(
    out_dir: Path,
    *,
    quick: bool = False,
    turns: int | None = None,
    repeats: int | None = None,
    variants: list[str] | None = None,
) -> dict[str, Any]:
    turns = turns or (4 if quick else 50)
    turns += turns % 2  # two model calls a task
    repeats = repeats or (1 if quick else 2)
    frameworks = [f for f in installed() if variants is None or f.name in variants]
    missing = [f.name for f in FRAMEWORKS if f not in installed()]
    progress(f"frameworks: {turns} turns x {repeats} repeats x {len(frameworks)} frameworks x 2 transports")
    runs = measure(frameworks, turns, repeats)
    result: dict[str, Any] = {
        "suite": "frameworks",
        "machine": machine_info(),
        "config": {
            "turns": turns,
            "repeats": repeats,
            "tokens_per_s": TOKENS_PER_S,
            "payload_bytes": PAYLOAD_BYTES,
            "quick": quick,
            "not_installed": missing,
            "backend": "simulated backend in the shim, in this process (in-process uvicorn thread), paced at tokens_per_s",
        },
        "notes": [
            "HTTP: the framework's stock OpenAI client against the shim's /v1/responses or /v1/chat/completions, "
            "the whole history each call; WebSocket: its one-line adapter (README 'Frameworks')",
            "turn ms = interval between the server accepting successive model calls (one agent step, client work "
            "included); server s = sum over turns of accept-to-last-event (the 16-token generation included); "
            "client s = total - server s (the framework, the SDK, serialization, the wire)",
            "the shim shares this process, so client and server compete for one interpreter, as in `agent`",
        ],
        "frameworks": analyse(runs),
    }
    result = clean_floats(result)
    write_json(out_dir, "frameworks", result)
    return result
