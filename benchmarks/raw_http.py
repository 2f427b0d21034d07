"""The stateless HTTP baseline without the `openai` SDK: the demo's loop over `httpx2` with its own JSON.

Frameworks call `client.responses.create(input=history)`, and the SDK transforms and encodes the
whole history on every call. This client does what a careful HTTP client could do instead: each
item is encoded once, when it joins the history (the reply's items with their null fields dropped,
as the SDK's `model_dump(exclude_none=True)` drops them), and each turn's body is those bytes
joined. What is left is what any stateless HTTP client pays: the whole history on the wire and
parsed by the server, every turn. Comparing it with the SDK over HTTP isolates the SDK's
per-turn cost; comparing it with WebSocket isolates what chaining saves beyond that.
"""

from __future__ import annotations

import time
from typing import Any

import httpx2
import orjson

from server_shim.demo import MODEL, TOOLS, LoopResult, next_user_message, tool_result

HEAD = orjson.dumps({"model": MODEL, "tools": TOOLS, "store": False})[:-1] + b',"input":['
"""Everything of the body but the history, encoded once."""


def without_none(value: Any) -> Any:
    """The JSON value with every null field dropped, at any depth (the SDK's `exclude_none=True`)."""
    if isinstance(value, dict):
        return {k: without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_none(v) for v in value]
    return value


def _follow_up(output: list[dict[str, Any]], turn: int, payload_bytes: int) -> list[dict[str, Any]]:
    """`demo.follow_up` on plain dicts: tool results for the reply's calls, else the next user message."""
    calls = [item for item in output if item["type"] == "function_call"]
    if not calls:
        return [next_user_message(turn)]
    return [
        {"type": "function_call_output", "call_id": call["call_id"], "output": tool_result(turn, payload_bytes)}
        for call in calls
    ]


def _output_text(output: list[dict[str, Any]]) -> str:
    """The SDK's `Response.output_text`: the text parts of the reply's messages, joined."""
    return "".join(
        part["text"]
        for item in output
        if item["type"] == "message"
        for part in item.get("content") or ()
        if part.get("type") == "output_text"
    )


async def raw_http_loop(base_url: str, turns: int, payload_bytes: int) -> LoopResult:
    """Stateless HTTP, the whole history every turn, sent as pre-encoded JSON by `httpx2`."""
    result = LoopResult("HTTP, full history, raw httpx2 client, items encoded once")
    headers = {"authorization": "Bearer demo", "content-type": "application/json"}
    async with httpx2.AsyncClient(base_url=base_url, headers=headers, timeout=60.0) as client:
        encoded: list[bytes] = [orjson.dumps(next_user_message(0))]
        start = time.perf_counter()
        for turn in range(turns):
            t0 = time.perf_counter()
            reply = await client.post("/responses", content=HEAD + b",".join(encoded) + b"]}")
            reply.raise_for_status()
            output = orjson.loads(reply.content)["output"]
            result.turn_seconds.append(time.perf_counter() - t0)
            result.outputs.append(_output_text(output) or output[0]["type"])
            new = [without_none(item) for item in output] + _follow_up(output, turn + 1, payload_bytes)
            encoded += [orjson.dumps(item) for item in new]
        result.seconds = time.perf_counter() - start
    result.turns = turns
    return result
