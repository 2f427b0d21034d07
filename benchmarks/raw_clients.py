"""The demo's agent loop without the `openai` SDK, over HTTP (`httpx2`) and over WebSocket (`websockets`).

Frameworks call `client.responses.create(input=history)`, and the SDK transforms and encodes the
whole history on every call. This client does what a careful HTTP client could do instead: each
item is encoded once, when it joins the history (the reply's items with their null fields dropped,
as the SDK's `model_dump(exclude_none=True)` drops them), and each turn's body is those bytes
joined. What is left is what any stateless HTTP client pays: the whole history on the wire and
parsed by the server, every turn. Comparing it with the SDK over HTTP isolates the SDK's
per-turn cost. `raw_websocket_loop` is WebSocket mode with the same kind of client (frames
encoded by the loop, only the terminal event decoded): the raw pair differs only in the API
path, the wire and the server.
"""

from __future__ import annotations

import time
from typing import Any

import httpx2
import orjson
from websockets.asyncio.client import connect

from server_shim.demo import MODEL, TOOLS, LoopResult, next_user_message, tool_result

HEAD = orjson.dumps({"model": MODEL, "tools": TOOLS, "store": False})[:-1] + b',"input":['
"""Everything of the body but the history, encoded once."""
FAILED_PREFIXES = (b'{"type":"error"', b'{"type":"response.failed"', b'{"type":"response.incomplete"')
"""How the events that end a turn without a response begin (the shim writes `type` first)."""


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


async def raw_websocket_loop(base_url: str, turns: int, payload_bytes: int) -> LoopResult:
    """WebSocket mode, `previous_response_id` and the new items, frames encoded and events skimmed by the loop."""
    result = LoopResult("WebSocket, chained, raw websockets client")
    url = base_url.replace("http://", "ws://", 1) + "/responses"
    options = {"type": "response.create", "model": MODEL, "tools": TOOLS, "store": False}
    headers = {"authorization": "Bearer demo"}
    async with connect(url, additional_headers=headers, max_size=None, compression=None, ping_interval=None) as ws:
        new_items: list[dict[str, Any]] = [next_user_message(0)]
        previous: dict[str, Any] = {}
        start = time.perf_counter()
        for turn in range(turns):
            t0 = time.perf_counter()
            await ws.send(orjson.dumps({**options, **previous, "input": new_items}), text=True)
            response = await _terminal(ws)
            output = response["output"]
            result.turn_seconds.append(time.perf_counter() - t0)
            result.outputs.append(_output_text(output) or output[0]["type"])
            previous = {"previous_response_id": response["id"]}
            new_items = _follow_up(output, turn + 1, payload_bytes)
        result.seconds = time.perf_counter() - start
    result.turns = turns
    return result


async def _terminal(ws: Any) -> dict[str, Any]:
    """The terminal event's response: the one event decoded; the others are only looked at."""
    while True:
        raw = await ws.recv(decode=False)
        if raw.startswith(b'{"type":"response.completed"'):
            response: dict[str, Any] = orjson.loads(raw)["response"]
            return response
        if raw.startswith(FAILED_PREFIXES):
            raise RuntimeError(f"raw WebSocket turn failed: {raw[:500]!r}")
