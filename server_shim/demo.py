"""`responses-ws demo`: the same tool-calling loop over HTTP (full history) and over WebSocket (chained).

Both runs use the official `openai` SDK against the shim started in-process on the simulated
backend. The shim counts the bytes it receives, so the table shows what really crossed the wire.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from openai import AsyncOpenAI
from openai.types.responses import FunctionToolParam, ResponseInputParam

from .app import create_app
from .server import BackgroundServer
from .settings import Settings

MODEL = "simulated-1"
TOOLS: list[FunctionToolParam] = [
    {
        "type": "function",
        "name": "lookup",
        "description": "Look up a record by number.",
        "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
        "strict": False,
    }
]


@dataclass
class LoopResult:
    transport: str
    turns: int = 0
    bytes_sent: int = 0
    seconds: float = 0.0
    turn_seconds: list[float] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)

    @property
    def median_turn_ms(self) -> float:
        return statistics.median(self.turn_seconds) * 1000 if self.turn_seconds else 0.0


def tool_result(n: int, payload_bytes: int) -> str:
    """A deterministic tool output of about `payload_bytes` bytes."""
    row = f"record {n}: " + "x" * 60 + "\n"
    return (row * (payload_bytes // len(row) + 1))[:payload_bytes]


def next_user_message(turn: int) -> dict[str, Any]:
    return {
        "role": "user",
        "content": f"Step {turn}: fetch the next record.\ncall lookup {json.dumps({'n': turn})}",
    }


def follow_up(output: list[Any], turn: int, payload_bytes: int) -> list[dict[str, Any]]:
    """What the agent adds after a response: tool results for its calls, else the next user message."""
    calls = [item for item in output if item.type == "function_call"]
    if not calls:
        return [next_user_message(turn)]
    return [
        {"type": "function_call_output", "call_id": call.call_id, "output": tool_result(turn, payload_bytes)}
        for call in calls
    ]


def as_input(output: list[Any]) -> list[dict[str, Any]]:
    return [item.model_dump(exclude_none=True) for item in output]


async def http_loop(
    base_url: str,
    turns: int,
    payload_bytes: int,
    *,
    adapt: Callable[[AsyncOpenAI], AsyncOpenAI] | None = None,
) -> LoopResult:
    """Stateless HTTP: every turn sends the whole history, as most frameworks do.

    `adapt` changes the client before the loop uses it (the benchmarks pass `ws_transport.wrap`:
    the same calls, sent over one WebSocket)."""
    result = LoopResult("HTTP, full history")
    client = AsyncOpenAI(base_url=base_url, api_key="demo")
    async with adapt(client) if adapt is not None else client:
        history: list[dict[str, Any]] = [next_user_message(0)]
        start = time.perf_counter()
        for turn in range(turns):
            t0 = time.perf_counter()
            response = await client.responses.create(
                model=MODEL, input=cast(ResponseInputParam, history), tools=TOOLS, store=False
            )
            result.turn_seconds.append(time.perf_counter() - t0)
            result.outputs.append(response.output_text or response.output[0].type)
            history += as_input(response.output) + follow_up(response.output, turn + 1, payload_bytes)
        result.seconds = time.perf_counter() - start
    result.turns = turns
    return result


async def websocket_loop(base_url: str, turns: int, payload_bytes: int) -> LoopResult:
    """WebSocket mode: one connection, `previous_response_id` plus only the new items."""
    result = LoopResult("WebSocket, chained")
    async with AsyncOpenAI(base_url=base_url, api_key="demo") as client, client.responses.connect() as conn:
        new_items: list[dict[str, Any]] = [next_user_message(0)]
        previous_id: str | None = None
        start = time.perf_counter()
        for turn in range(turns):
            t0 = time.perf_counter()
            await conn.response.create(
                model=MODEL,
                input=cast(ResponseInputParam, new_items),
                tools=TOOLS,
                store=False,
                previous_response_id=previous_id,
            )
            async for event in conn:
                if event.type == "error":
                    raise RuntimeError(f"demo turn {turn} failed: {event.error.message}")
                if event.type == "response.completed":
                    response = event.response
                    break
            result.turn_seconds.append(time.perf_counter() - t0)
            result.outputs.append(response.output_text or response.output[0].type)
            previous_id = response.id
            new_items = follow_up(response.output, turn + 1, payload_bytes)
        result.seconds = time.perf_counter() - start
    result.turns = turns
    return result


async def compare(turns: int, payload_bytes: int, tokens_per_s: float) -> list[LoopResult]:
    settings = Settings(simulated_tokens_per_s=tokens_per_s, usage_ledger="off")  # simulated turns are not usage
    app = create_app(settings)
    with BackgroundServer(app, settings) as server:
        results = []
        for loop in (http_loop, websocket_loop):
            before = server.shim.stats.bytes_received
            result = await loop(server.base_url, turns, payload_bytes)
            result.bytes_sent = server.shim.stats.bytes_received - before
            results.append(result)
    return results


def format_table(results: list[LoopResult]) -> str:
    http, ws = results
    rows = [("transport", "turns", "bytes sent", "total s", "median turn ms")]
    for r in results:
        rows.append((r.transport, str(r.turns), f"{r.bytes_sent:,}", f"{r.seconds:.3f}", f"{r.median_turn_ms:.2f}"))
    rows.append(
        (
            "ratio HTTP / WebSocket",
            "",
            f"{http.bytes_sent / max(ws.bytes_sent, 1):.1f}x",
            f"{http.seconds / max(ws.seconds, 1e-9):.2f}x",
            f"{http.median_turn_ms / max(ws.median_turn_ms, 1e-9):.2f}x",
        )
    )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(cell.ljust(widths[i]) if i == 0 else cell.rjust(widths[i]) for i, cell in enumerate(row))
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def run_demo(turns: int = 30, payload_bytes: int = 4000, tokens_per_s: float = 1000.0) -> list[LoopResult]:
    print(
        f"responses-ws demo: {turns}-turn tool-calling loop, {payload_bytes}-byte tool results, "
        f"SIMULATED backend at {tokens_per_s:g} tokens/s, shim on loopback, official openai SDK as client\n"
    )
    results = asyncio.run(compare(turns, payload_bytes, tokens_per_s))
    if results[0].outputs != results[1].outputs:
        raise SystemExit("demo: the two transports produced different outputs")
    print(format_table(results))
    print("\nBoth transports produced the same outputs on every turn.")
    return results
