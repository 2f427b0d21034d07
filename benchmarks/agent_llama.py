"""Suite `agent-llama`: the tool-calling agent loop against a real inference server.

llama-cpp-python's OpenAI-compatible server runs on loopback with the tiny random-weight model
the tests generate (`benchmarks/tiny_model.py`), behind the shim. Its output is gibberish,
but real: its tokens are sampled, its tool calls are grammar-constrained to the tool's schema.
Odd turns force the `lookup` call (a named `tool_choice`, the way llama.cpp calls tools
reliably), even turns answer the tool's result in text. The same turns run over HTTP with the
full history and over `responses.connect()` chained; the backend does the same work both ways
(the shim sends it the whole conversation either way), so the difference is the API path.

Each turn is reported as a distribution (p50, p99, max), not only as totals, and split by the
shim's own per-response log line (the shim runs in this process): the time from the turn's
start in the shim to its end (`in_shim_ms`: the backend's prompt processing and generation,
plus the shim's stages), and the rest (`outside_ms`: the client, the wire, the loop hops), so a
slow turn says where it was slow.

llama.cpp runs `--llama-threads` threads (default 1). Its threads wait for each other at every
step by spinning; with as many threads as cores and other work on those cores, one descheduled
thread holds the rest, and single requests stall for seconds (measured on the 2-core machine
with two CPU hogs: 2 threads, single requests up to 12-17 s; 1 thread, at most 1.4 s). That
stall lands on whichever path happens to run then, so compare the paths with 1 thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import orjson
from openai import AsyncOpenAI

from server_shim import BackgroundServer, Settings, create_app

from .common import machine_info, progress, summarize
from .raw_clients import without_none
from .report import fmt, format_table

MODEL = "tiny-llama"
PAYLOAD_BYTES = 200
LLAMA_THREADS = 1
SHIM_LOG = "responses_ws.responses"
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


def _follow_up(call_ids: list[str], turn: int) -> list[dict[str, Any]]:
    """A result for each call of the reply, else the next user message."""
    if call_ids:
        return [
            {"type": "function_call_output", "call_id": call_id, "output": f"record {turn}: " + "x" * PAYLOAD_BYTES}
            for call_id in call_ids
        ]
    return [{"role": "user", "content": f"Step {turn}: look up the next record."}]


def _call_ids(output: list[Any]) -> list[str]:
    return [item.call_id for item in output if item.type == "function_call"]


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
                _call_ids(response.output), turn
            )
        total = time.perf_counter() - start
    return {"total_s": total, "turn_s": times, "outputs": outputs}


async def raw_http_loop(base_url: str, turns: int) -> dict[str, Any]:
    """`http_loop` without the SDK (`raw_clients.py`): each history item encoded once, the bodies joined."""
    times, outputs = [], []
    headers = {"authorization": "Bearer bench", "content-type": "application/json"}
    async with httpx2.AsyncClient(base_url=base_url, headers=headers, timeout=120.0) as client:
        encoded = [orjson.dumps({"role": "user", "content": "Look up record 0."})]
        start = time.perf_counter()
        for turn in range(turns):
            t0 = time.perf_counter()
            fields = orjson.dumps({"store": False, **_turn_fields(turn)})[:-1]
            reply = await client.post("/responses", content=fields + b',"input":[' + b",".join(encoded) + b"]}")
            reply.raise_for_status()
            output = orjson.loads(reply.content)["output"]
            times.append(time.perf_counter() - t0)
            outputs.append([(item["type"], item.get("name")) for item in output])
            call_ids = [item["call_id"] for item in output if item["type"] == "function_call"]
            encoded += [orjson.dumps(without_none(item)) for item in output]
            encoded += [orjson.dumps(item) for item in _follow_up(call_ids, turn)]
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
            new_items = _follow_up(_call_ids(response.output), turn)
        total = time.perf_counter() - start
    return {"total_s": total, "turn_s": times, "outputs": outputs}


LOOPS = {"http": http_loop, "raw_http": raw_http_loop, "websocket": websocket_loop}


def run(
    out_dir: Path,
    *,
    quick: bool = False,
    turns: int | None = None,
    repeats: int | None = None,
    llama_threads: int = LLAMA_THREADS,
) -> dict[str, Any]:
    turns = turns or (4 if quick else 40)
    repeats = repeats or (1 if quick else 3)
    if importlib.util.find_spec("llama_cpp") is None:
        return {"suite": "agent-llama", "status": "unavailable", "reason": "llama-cpp-python is not installed"}
    from .llama_server import LlamaServer
    from .tiny_model import write_tiny_model

    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        model = write_tiny_model(Path(tmp) / "tiny.gguf")
        log_path = out_dir / "llama-server.log"
        with (
            LlamaServer(model, log_path, alias=MODEL, n_ctx=16384, n_threads=llama_threads) as llama,
            shim_response_log() as shim_log,
        ):
            settings = Settings(backend=llama.base_url, default_model=MODEL, usage_ledger="off")
            with BackgroundServer(create_app(settings), settings) as shim:
                runs: dict[str, list[dict[str, Any]]] = {name: [] for name in LOOPS}
                warmup_s: dict[str, float] = {}
                for repeat in range(repeats + 1):
                    for name, loop in list(LOOPS.items())[:: 1 if repeat % 2 else -1]:
                        progress(f"agent-llama: {'warm-up' if repeat == 0 else f'repeat {repeat}/{repeats}'}: {name}")
                        shim_log.clear()
                        result = asyncio.run(loop(shim.base_url, turns))
                        result["in_shim_ms"] = _in_shim_ms(shim_log, turns)
                        if repeat:
                            runs[name].append(result)
                        else:
                            warmup_s[name] = result["total_s"]
    result = analyse(runs, turns, llama.startup_s)
    result["warmup_total_s"] = warmup_s
    result["config"]["llama_threads"] = llama_threads
    result["machine"] = machine_info()
    result["load_average_1m"] = {"before": load_before[0], "after": os.getloadavg()[0]}
    return result


@contextlib.contextmanager
def shim_response_log() -> Iterator[list[dict[str, Any]]]:
    """The fields of the shim's INFO line per finished response (`server_shim/observe.py`), as they come."""
    logger = logging.getLogger(SHIM_LOG)
    lines: list[dict[str, Any]] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(dict(getattr(record, "fields", {})))

    handler = Collect()
    saved = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.level, logger.propagate = saved


def _in_shim_ms(lines: list[dict[str, Any]], turns: int, wait_s: float = 2.0) -> list[float]:
    """Each turn's time in the shim, in order; the last line may land just after the client got its answer."""
    deadline = time.monotonic() + wait_s
    while len(lines) < turns and time.monotonic() < deadline:
        time.sleep(0.005)
    if len(lines) != turns:
        raise RuntimeError(f"agent-llama: the shim logged {len(lines)} responses for {turns} turns")
    return [float(line["duration_ms"]) for line in lines]


def analyse(runs: dict[str, list[dict[str, Any]]], turns: int, startup_s: float | None) -> dict[str, Any]:
    variants = {name: _variant(results) for name, results in runs.items()}
    ratios = _ratios(runs, "websocket", "http")
    return {
        "suite": "agent-llama",
        "status": "ok",
        "config": {"turns": turns, "payload_bytes": PAYLOAD_BYTES, "backend": "llama-cpp-python server, tiny model"},
        "llama_startup_s": startup_s,
        "variants": variants,
        "same_outputs_http_websocket": runs["http"][0]["outputs"] == runs["websocket"][0]["outputs"],
        "same_outputs_raw_http": runs["raw_http"][0]["outputs"] == runs["http"][0]["outputs"],
        "ratio_websocket_http_total": {"median": statistics.median(ratios), "n": len(ratios)},
        "ratio_websocket_raw_http_total": {
            "median": statistics.median(_ratios(runs, "websocket", "raw_http")),
            "n": len(ratios),
        },
        "notes": [
            "turn_ms: the client's time per turn; in_shim_ms: the shim's time for that response, from its start in the "
            "shim to its end (the llama.cpp server's work and the shim's stages); outside_ms = turn_ms - in_shim_ms "
            "(the client, the wire, the hops between event loops), paired per turn",
            "the order of the two paths alternates per repeat; repeat 0 is a warm-up and not counted",
        ],
    }


def _ratios(runs: dict[str, list[dict[str, Any]]], num: str, den: str) -> list[float]:
    """End-to-end time of `num` over `den`, paired per repeat."""
    return [a["total_s"] / b["total_s"] for a, b in zip(runs[num], runs[den], strict=True)]


def _variant(results: list[dict[str, Any]]) -> dict[str, Any]:
    turn_ms = [t * 1000 for r in results for t in r["turn_s"]]
    in_shim = [ms for r in results for ms in r["in_shim_ms"]]
    return {
        "total_s": summarize(r["total_s"] for r in results),
        "turn_ms": summarize(turn_ms),
        "in_shim_ms": summarize(in_shim),
        "outside_ms": summarize(t - s for t, s in zip(turn_ms, in_shim, strict=True)),
        "turns_over_1s": sum(t > 1000 for t in turn_ms),
        "same_outputs_every_repeat": all(r["outputs"] == results[0]["outputs"] for r in results),
    }


def table(result: dict[str, Any]) -> str:
    if result.get("status") != "ok":
        return f"agent-llama: {result.get('status')}: {result.get('reason')}"
    stats = ("p50", "p99", "max")
    rows = [["variant", "total s p50", *(f"{part} {q}" for part in ("turn ms", "in shim", "outside") for q in stats)]]
    rows[0].append("turns > 1 s")
    for name, v in result["variants"].items():
        turn, shim, outside = v["turn_ms"], v["in_shim_ms"], v["outside_ms"]
        rows.append(
            [
                name,
                fmt(v["total_s"]["median"], 3),
                *(fmt(turn[k]) for k in ("median", "p99", "max")),
                *(fmt(shim[k]) for k in ("median", "p99", "max")),
                *(fmt(outside[k]) for k in ("median", "p99", "max")),
                str(v["turns_over_1s"]),
            ]
        )
    ratio = result["ratio_websocket_http_total"]
    cfg = result["config"]
    load = result.get("load_average_1m") or {}
    return "\n".join(
        [
            f"agent-llama ({cfg['turns']}-turn tool loop against a real llama.cpp server, tiny generated model, "
            f"{cfg.get('llama_threads', '?')} llama.cpp thread(s); load average {fmt(load.get('before'))} before, "
            f"{fmt(load.get('after'))} after)",
            format_table(rows),
            "  in shim: the shim's time per response (llama.cpp's work + the shim's stages); outside: turn - in shim "
            "(client, wire, loop hops)",
            "  warm-up loops (not counted): "
            + ", ".join(f"{name} {fmt(s, 3)} s" for name, s in (result.get("warmup_total_s") or {}).items()),
            f"  ratio websocket / http end-to-end time: median {fmt(ratio['median'], 3)} "
            f"(faster by {fmt(100 * (1 - ratio['median']), 1)}%, n={ratio['n']}); "
            f"same outputs over both: {result['same_outputs_http_websocket']}",
            f"  ratio websocket / raw_http (no SDK: items encoded once) end-to-end time: median "
            f"{fmt(result['ratio_websocket_raw_http_total']['median'], 3)}; raw_http gave the same outputs as "
            f"http: {result['same_outputs_raw_http']}",
        ]
    )
