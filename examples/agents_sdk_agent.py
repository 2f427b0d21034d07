"""An OpenAI Agents SDK agent over a `ws_transport`-wrapped client.

    python examples/agents_sdk_agent.py                         # a shim on loopback, simulated backend
    python examples/agents_sdk_agent.py --base-url https://api.openai.com/v1 --model gpt-5.1   # a real endpoint

`websocket_run_config()` gives `Runner.run` a model provider whose models are the SDK's own
`OpenAIResponsesModel` over one wrapped `AsyncOpenAI`: the SDK sends the whole conversation each
turn and the transport sends only what is new. See `plugins/agents_sdk.py` for when the SDK's own
WebSocket model is the better choice.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
from collections.abc import Iterator
from typing import Any

from agents import Agent, Runner, function_tool

from plugins.agents_sdk import WebSocketModelProvider, websocket_run_config
from server_shim import BackgroundServer, Settings, create_app

TASK = [
    'Look up record 3 with the lookup tool.\ncall lookup {"n": 3}',
    'Now double 21 with the double tool.\ncall double {"x": 21}',
]
"""Two steps of one conversation. The `call NAME {json}` lines make the simulated backend call the tool."""


@function_tool
def lookup(n: int) -> str:
    """Look up a record by number."""
    return f"record {n}: status=active owner=team-{n % 5}"


@function_tool
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


async def run(base_url: str, api_key: str, model: str) -> WebSocketModelProvider:
    provider = WebSocketModelProvider(base_url=base_url, api_key=api_key, default_model=model)
    # tracing_disabled: this example exports nothing; drop it to send traces as usual
    run_config = websocket_run_config(provider, tracing_disabled=True)
    agent = Agent(name="clerk", instructions="Use the tools when asked; answer briefly.", tools=[lookup, double])
    history: list[Any] = []
    for step in TASK:
        result = await Runner.run(agent, [*history, {"role": "user", "content": step}], run_config=run_config)
        print(f"user:  {step.splitlines()[0]}")
        print(f"agent: {str(result.final_output)[:120]}")
        history = result.to_input_list()
    await provider.aclose()
    return provider


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", help="a real Responses endpoint (default: start a local shim, simulated backend)")
    parser.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", "local"))
    parser.add_argument("--model", help="model name (required with --base-url; default simulated-1)")
    args = parser.parse_args(argv)
    if args.base_url and not args.model:
        parser.error("--model is required with --base-url")

    with endpoint(args.base_url) as (base_url, server):
        provider = asyncio.run(run(base_url, args.api_key, args.model or "simulated-1"))
        stats = provider.session.stats
        print(
            f"websocket session: {stats.turns} turns, {stats.turns_chained} chained; "
            f"{stats.bytes_sent:,} bytes sent where HTTP would have sent {stats.bytes_http_equivalent:,}"
        )
        if server is not None:
            print(f"shim: {server.shim.stats.websocket_connections} websocket connection(s)")


if __name__ == "__main__":
    main()
