"""A plain `openai` client wrapped by `ws_transport`: the same code, one persistent WebSocket.

    python examples/openai_wrapped.py                           # a shim on loopback, simulated backend
    python examples/openai_wrapped.py --base-url https://api.openai.com/v1 --model gpt-5.1   # a real endpoint

The loop below is an ordinary stateless tool loop: it resends the whole history every turn.
`ws_transport.wrap(client)` is the only added line; the transport sends `previous_response_id`
and only the new items, and the session's stats show what that saved.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from collections.abc import Iterator
from typing import Any

from openai import OpenAI
from openai.types.responses import FunctionToolParam

import ws_transport
from server_shim import BackgroundServer, Settings, create_app

TOOLS: list[FunctionToolParam] = [
    {
        "type": "function",
        "name": "lookup",
        "description": "Look up a record by number.",
        "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
        "strict": False,
    }
]


def lookup(n: int) -> str:
    return f"record {n}: " + "details " * 100


@contextlib.contextmanager
def endpoint(base_url: str | None) -> Iterator[tuple[str, BackgroundServer | None]]:
    """`base_url` as given, else a shim on a free loopback port with the simulated backend."""
    if base_url:
        yield base_url, None
        return
    settings = Settings(usage_ledger="off")  # simulated turns stay out of the real usage ledger
    with BackgroundServer(create_app(settings), settings) as server:
        yield server.base_url, server


def run_loop(client: OpenAI, model: str, steps: int) -> list[str]:
    """A tool loop that keeps the whole history and sends all of it every turn, as most frameworks do."""
    history: list[Any] = []
    answers = []
    for step in range(steps):
        history.append({"role": "user", "content": f"Look up record {step}.\ncall lookup {json.dumps({'n': step})}"})
        while True:
            response = client.responses.create(model=model, input=history, tools=TOOLS, store=False)
            history += response.output
            calls = [item for item in response.output if item.type == "function_call"]
            if not calls:
                answers.append(response.output_text)
                break
            for call in calls:
                output = lookup(**json.loads(call.arguments))
                history.append({"type": "function_call_output", "call_id": call.call_id, "output": output})
    return answers


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", help="a real Responses endpoint (default: start a local shim, simulated backend)")
    parser.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", "local"))
    parser.add_argument("--model", help="model name (required with --base-url; default simulated-1)")
    parser.add_argument("--steps", type=int, default=5, help="user requests, each a tool call and an answer")
    args = parser.parse_args(argv)
    if args.base_url and not args.model:
        parser.error("--model is required with --base-url")

    with endpoint(args.base_url) as (base_url, server), OpenAI(base_url=base_url, api_key=args.api_key) as client:
        ws_transport.wrap(client)  # the one added line
        answers = run_loop(client, args.model or "simulated-1", args.steps)
        for answer in answers:
            print(f"answer: {answer[:100]}")
        stats = ws_transport.session_of(client).stats
        print(
            f"websocket session: {stats.turns} turns, {stats.turns_chained} chained; "
            f"{stats.bytes_sent:,} bytes sent where HTTP would have sent {stats.bytes_http_equivalent:,}"
        )
        if server is not None:
            print(f"shim: {server.shim.stats.websocket_connections} websocket connection(s)")


if __name__ == "__main__":
    main()
