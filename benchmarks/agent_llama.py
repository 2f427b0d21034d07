"""Suite `agent-llama`: the tool-calling agent loop against a real inference server.

llama-cpp-python's OpenAI-compatible server runs on loopback with the tiny random-weight model
the tests generate (`benchmarks/tiny_model.py`), behind the shim. Its output is gibberish,
but real: its tokens are sampled, its tool calls are grammar-constrained to the tool's schema.
Odd turns force the `lookup` call (a named `tool_choice`, the way llama.cpp calls tools
reliably), even turns answer the tool's result in text. The same turns run over HTTP with the
full history and over `responses.connect()` chained; the backend does the same work both ways
(the shim sends it the whole conversation either way), so the difference is the API path.
"""

from __future__ import annotations

import asyncio
import importlib.util
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from openai import AsyncOpenAI

from server_shim import BackgroundServer, Settings, create_app

from .common import progress, summarize
from .report import fmt, format_table

MODEL = "tiny-llama"
PAYLOAD_BYTES = 200
TOOL = {
    "type": "function",
    "name": "lookup",
    "description": "Look up a record by number.",
    "parameters": {
        "type": "object",
        "properties": {"n": {"type": "integer"}},
        "required": ["n"],
        "additionalProperties": False,
    },
}


def _turn_fields(turn: int) -> dict[str, Any]:
    forced = {"type": "function", "name": "lookup"} if turn % 2 == 0 else "none"
    return {"model": MODEL, "tools": [TOOL], "tool_choice": forced, "temperature": 0, "max_output_tokens": 32}


def _follow_up(output: list[Any], turn: int) -> list[dict[str, Any]]:
    calls = [item for item in output if item.type == "function_call"]
    if calls:
        return [
            {"type": "function_call_output", "call_id": c.call_id, "output": f"record {turn}: " + "x" * PAYLOAD_BYTES}
            for c in calls
        ]
    return [{"role": "user", "content": f"Step {turn}: look up the next record."}]


async def http_loop(base_url: str, turns: int) -> dict[str, Any]:
    times, outputs = [], []
    async with AsyncOpenAI(base_url=base_url, api_key="bench", max_retries=0) as client:
        history: list[Any] = [{"role": "user", "content": "Look up record 0."}]
        start = time.perf_counter()
        for turn in range(turns):
            t0 = time.perf_counter()
            response = await client.responses.create(input=history, store=False, **_turn_fields(turn))
            times.append(time.perf_counter() - t0)
            outputs.append([(item.type, getattr(item, "name", None)) for item in response.output])
            history += [item.model_dump(exclude_none=True) for item in response.output] + _follow_up(
                response.output, turn
            )
        total = time.perf_counter() - start
    return {"total_s": total, "turn_s": times, "outputs": outputs}


async def websocket_loop(base_url: str, turns: int) -> dict[str, Any]:
    times, outputs = [], []
    async with (
        AsyncOpenAI(base_url=base_url, api_key="bench", max_retries=0) as client,
        client.responses.connect() as conn,
    ):
        new_items: list[Any] = [{"role": "user", "content": "Look up record 0."}]
        previous: str | None = None
        start = time.perf_counter()
        for turn in range(turns):
            t0 = time.perf_counter()
            await conn.response.create(
                input=new_items, store=False, previous_response_id=previous, **_turn_fields(turn)
            )
            async for event in conn:
                if event.type == "error":
                    raise RuntimeError(f"turn {turn}: {event.error.message}")
                if event.type in ("response.completed", "response.incomplete"):
                    response = event.response
                    break
            times.append(time.perf_counter() - t0)
            outputs.append([(item.type, getattr(item, "name", None)) for item in response.output])
            previous = response.id
            new_items = _follow_up(response.output, turn)
        total = time.perf_counter() - start
    return {"total_s": total, "turn_s": times, "outputs": outputs}


def run(out_dir: Path, *, quick: bool = False, turns: int | None = None, repeats: int | None = None) -> dict[str, Any]:
    turns = turns or (4 if quick else 40)
    repeats = repeats or (1 if quick else 3)
    if importlib.util.find_spec("llama_cpp") is None:
        return {"suite": "agent-llama", "status": "unavailable", "reason": "llama-cpp-python is not installed"}
    from .llama_server import LlamaServer
    from .tiny_model import write_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        model = write_tiny_model(Path(tmp) / "tiny.gguf")
        with LlamaServer(model, out_dir / "llama-server.log", alias=MODEL, n_ctx=16384) as llama:
            settings = Settings(backend=llama.base_url, default_model=MODEL, usage_ledger="off")
            with BackgroundServer(create_app(settings), settings) as shim:
                runs: dict[str, list[dict[str, Any]]] = {"http": [], "websocket": []}
                for repeat in range(repeats + 1):
                    for name, loop in (("http", http_loop), ("websocket", websocket_loop))[:: 1 if repeat % 2 else -1]:
                        progress(f"agent-llama: {'warm-up' if repeat == 0 else f'repeat {repeat}/{repeats}'}: {name}")
                        result = asyncio.run(loop(shim.base_url, turns))
                        if repeat:
                            runs[name].append(result)
    return analyse(runs, turns, llama.startup_s)


def analyse(runs: dict[str, list[dict[str, Any]]], turns: int, startup_s: float | None) -> dict[str, Any]:
    variants = {
        name: {
            "total_s": summarize(r["total_s"] for r in results),
            "turn_ms": summarize(t * 1000 for r in results for t in r["turn_s"]),
            "same_outputs_every_repeat": all(r["outputs"] == results[0]["outputs"] for r in results),
        }
        for name, results in runs.items()
    }
    ratios = [ws["total_s"] / http["total_s"] for ws, http in zip(runs["websocket"], runs["http"], strict=True)]
    return {
        "suite": "agent-llama",
        "status": "ok",
        "config": {"turns": turns, "payload_bytes": PAYLOAD_BYTES, "backend": "llama-cpp-python server, tiny model"},
        "llama_startup_s": startup_s,
        "variants": variants,
        "same_outputs_http_websocket": runs["http"][0]["outputs"] == runs["websocket"][0]["outputs"],
        "ratio_websocket_http_total": {"median": statistics.median(ratios), "n": len(ratios)},
    }


def table(result: dict[str, Any]) -> str:
    if result.get("status") != "ok":
        return f"agent-llama: {result.get('status')}: {result.get('reason')}"
    rows = [["variant", "total s p50", "turn ms p50", "turn ms p90"]]
    for name, v in result["variants"].items():
        rows.append([name, fmt(v["total_s"]["median"], 3), fmt(v["turn_ms"]["median"]), fmt(v["turn_ms"]["p90"])])
    ratio = result["ratio_websocket_http_total"]
    cfg = result["config"]
    return "\n".join(
        [
            f"agent-llama ({cfg['turns']}-turn tool loop against a real llama.cpp server, tiny generated model)",
            format_table(rows),
            f"  ratio websocket / http end-to-end time: median {fmt(ratio['median'], 3)} "
            f"(faster by {fmt(100 * (1 - ratio['median']), 1)}%, n={ratio['n']}); "
            f"same outputs over both: {result['same_outputs_http_websocket']}",
        ]
    )
