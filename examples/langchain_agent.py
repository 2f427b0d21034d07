"""A LangChain tool-calling agent on the Responses API WebSocket mode, switched on by one flag.

    python examples/langchain_agent.py                          # a shim on loopback, simulated backend
    python examples/langchain_agent.py --transport http         # the same agent over plain HTTP
    python examples/langchain_agent.py --base-url https://api.openai.com/v1 --model gpt-5.1   # a real endpoint

The only change from a stock LangChain agent is the import: `plugins.langchain.ChatOpenAI`
instead of `langchain_openai.ChatOpenAI`. Its `transport` field ("websocket" by default, or
`RESPONSES_WS_TRANSPORT`) picks how requests travel; `--transport` sets it here.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterator

from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver

from plugins.langchain import ChatOpenAI, default_transport
from server_shim import BackgroundServer, Settings, create_app

TASK = [
    'Look up record 3 with the lookup tool.\ncall lookup {"n": 3}',
    'Now double 21 with the double tool.\ncall double {"x": 21}',
]
"""Two steps of one conversation. The `call NAME {json}` lines make the simulated backend call the tool."""


@tool
def lookup(n: int) -> str:
    """Look up a record by number."""
    return f"record {n}: status=active owner=team-{n % 5}"


@tool
def double(x: int) -> str:
    """Double a number."""
    return str(2 * x)


@contextlib.contextmanager
def endpoint(base_url: str | None) -> Iterator[tuple[str, BackgroundServer | None]]:
    """`base_url` as given, else a shim on a free loopback port with the simulated backend."""
    if base_url:
        yield base_url, None
        return
    settings = Settings(usage_ledger="off")  # simulated turns stay out of the real usage ledger
    with BackgroundServer(create_app(settings), settings) as server:
        yield server.base_url, server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", help="a real Responses endpoint (default: start a local shim, simulated backend)")
    parser.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", "local"))
    parser.add_argument("--model", help="model name (required with --base-url; default simulated-1)")
    parser.add_argument("--transport", choices=["websocket", "http"], default=default_transport())
    args = parser.parse_args(argv)
    if args.base_url and not args.model:
        parser.error("--model is required with --base-url")

    with endpoint(args.base_url) as (base_url, server):
        model = ChatOpenAI(
            model=args.model or "simulated-1", base_url=base_url, api_key=args.api_key, transport=args.transport
        )
        agent = create_agent(
            model, [lookup, double], system_prompt="Use the tools when asked.", checkpointer=InMemorySaver()
        )
        config: RunnableConfig = {"configurable": {"thread_id": "example"}}
        print(f"transport={model.transport} endpoint={base_url}")
        for step in TASK:
            result = agent.invoke({"messages": [HumanMessage(step)]}, config)
            print(f"user:  {step.splitlines()[0]}")
            print(f"agent: {result['messages'][-1].text[:120]}")
        turns = sum(isinstance(m, AIMessage) for m in result["messages"])
        print(f"model turns: {turns}")
        session = model.ws_session("example")
        if session is not None:
            stats = session.stats
            print(
                f"websocket session: {stats.turns} turns, {stats.bytes_sent:,} bytes sent "
                f"(fallbacks to HTTP: {stats.fallbacks})"
            )
        if server is not None:
            shim = server.shim.stats
            print(
                f"shim received {shim.bytes_received:,} bytes, {shim.input_items_received} input items, "
                f"over {shim.websocket_connections} websocket connection(s)"
            )
        model.close()


if __name__ == "__main__":
    main()
