"""Suite 2, `agent`: a 50-turn tool-calling loop end to end, HTTP against WebSocket.

The loops are the ones `responses-ws demo` runs (server_shim/demo.py), imported, not copied:
the raw `openai` client, stateless HTTP with the whole history every turn against WebSocket
mode with `previous_response_id`; the simulated backend streams at 1,000 tokens/s and calls
the `lookup` tool on every other turn, each tool result ~4 KB. `raw-http` is the same stateless
loop without the SDK (`benchmarks/raw_clients.py`: `httpx2`, each item encoded once), the HTTP
baseline that isolates the SDK's per-turn transform of the history; `raw-websocket` is WebSocket
mode with the same kind of client, so the raw pair differs only in API path, wire and server.
`wrap` is the SDK's HTTP loop unchanged with its client given to `ws_transport.wrap()`.

A variant is one function: register it with `@variant(name, label)`; it receives
`(base_url, turns, payload_bytes)` and returns a `server_shim.demo.LoopResult` (per-turn
seconds, total seconds, the outputs). Every variant is compared with the `http` baseline,
pair by pair (same repeat); `PAIRS` lists further pairs to compare.
"""

from __future__ import annotations

import asyncio
import importlib.util
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ws_transport
from server_shim import BackgroundServer, Settings, create_app
from server_shim.backends import SimulatedBackend
from server_shim.demo import MODEL, LoopResult, http_loop, next_user_message, tool_result, websocket_loop

from . import plot
from .raw_clients import raw_http_loop, raw_websocket_loop

if TYPE_CHECKING:
    from plugins.langchain import Transport
from .common import (
    Recorder,
    TimedBackend,
    bounded,
    clean_floats,
    machine_info,
    paired_ratios,
    progress,
    rotated,
    summarize,
    write_json,
)
from .report import fmt, format_table

AgentLoop = Callable[[str, int, int], Awaitable[LoopResult]]
BASELINE = "http"
TOKENS_PER_S = 1000.0
PAYLOAD_BYTES = 4000


@dataclass(frozen=True)
class Variant:
    name: str
    label: str
    loop: AgentLoop


VARIANTS: dict[str, Variant] = {}
PAIRS: list[tuple[str, str]] = [("websocket", "http"), ("websocket", "raw-http"), ("raw-websocket", "raw-http")]
"""(numerator, denominator) pairs compared besides every variant against the baseline."""


def variant(name: str, label: str) -> Callable[[AgentLoop], AgentLoop]:
    """Register an agent loop as a variant of this suite."""

    def register(loop: AgentLoop) -> AgentLoop:
        VARIANTS[name] = Variant(name, label, loop)
        return loop

    return register


variant(BASELINE, "HTTP, stateless full history, raw openai client (demo.http_loop)")(http_loop)
variant("websocket", "WebSocket, previous_response_id, raw openai client (demo.websocket_loop)")(websocket_loop)


async def wrap_loop(base_url: str, turns: int, payload_bytes: int) -> LoopResult:
    """`demo.http_loop` unchanged (the whole history every call), its client given to `ws_transport.wrap`."""
    return await http_loop(base_url, turns, payload_bytes, adapt=ws_transport.wrap)


variant("wrap", "ws_transport.wrap(AsyncOpenAI()): the HTTP loop's calls, whole history, over one WebSocket")(wrap_loop)
PAIRS.append(("wrap", "raw-http"))
variant("raw-http", "HTTP, stateless full history, raw httpx2 client, items encoded once (raw_clients.raw_http_loop)")(
    raw_http_loop
)
variant("raw-websocket", "WebSocket, previous_response_id, raw websockets client (raw_clients.raw_websocket_loop)")(
    raw_websocket_loop
)


# LangChain: the same conversation driven by a real `create_agent` agent --------------------

CLIENT_PREPARE_MS: dict[str, list[list[float]]] = {}
"""Per LangChain run, the ms `ChatOpenAI` spent turning the history into a request, per turn."""


async def langchain_loop(base_url: str, turns: int, payload_bytes: int, transport: Transport) -> LoopResult:
    """`create_agent` with `plugins.langchain.ChatOpenAI(transport=...)`, the demo's conversation turn for turn.

    Each user message asks for one `lookup` (a model turn that calls it, then one that answers its
    result), so `turns` model calls see exactly the histories of `demo.http_loop`. A turn is one
    model call as the agent makes it (history conversion, request, response parsing); the agent
    is invoked with the messages so far, as an app without a checkpointer does.
    """
    from langchain.agents import create_agent
    from langchain.agents.middleware import AgentMiddleware, hook_config
    from langchain_core.messages import HumanMessage
    from langchain_core.tools import tool
    from pydantic import SecretStr

    from plugins.langchain import ChatOpenAI

    @tool
    def lookup(n: int) -> str:
        """Look up a record by number."""
        return tool_result(n + 1, payload_bytes)

    prepare_ms: list[float] = []

    class TimedChatOpenAI(ChatOpenAI):
        def _get_request_payload(self, *args: Any, **kwargs: Any) -> dict:
            t0 = time.perf_counter()
            try:
                return super()._get_request_payload(*args, **kwargs)
            finally:
                prepare_ms.append((time.perf_counter() - t0) * 1000)

    result = LoopResult(f"LangChain create_agent, transport={transport}")

    class Turns(AgentMiddleware):
        """Times each model call and ends the agent once `turns` calls are made."""

        async def awrap_model_call(self, request: Any, handler: Any) -> Any:
            t0 = time.perf_counter()
            response = await handler(request)
            result.turn_seconds.append(time.perf_counter() - t0)
            message = response.result[0]
            result.outputs.append(message.text or ("function_call" if message.tool_calls else ""))
            return response

        @hook_config(can_jump_to=["end"])
        def after_model(self, state: Any, runtime: Any) -> dict[str, Any] | None:
            return {"jump_to": "end"} if len(result.turn_seconds) >= turns else None

    model = TimedChatOpenAI(model=MODEL, base_url=base_url, api_key=SecretStr("demo"), transport=transport, store=False)
    agent = create_agent(model, [lookup], middleware=[Turns()])
    history: list[Any] = []
    start = time.perf_counter()
    while len(result.turn_seconds) < turns:
        ask = next_user_message(len(result.turn_seconds))
        history = (await agent.ainvoke({"messages": [*history, HumanMessage(ask["content"])]}))["messages"]
    result.seconds = time.perf_counter() - start
    result.turns = turns
    await model.aclose()
    CLIENT_PREPARE_MS.setdefault(f"langchain-{transport}", []).append(prepare_ms)
    return result


async def langchain_http_loop(base_url: str, turns: int, payload_bytes: int) -> LoopResult:
    return await langchain_loop(base_url, turns, payload_bytes, "http")


async def langchain_websocket_loop(base_url: str, turns: int, payload_bytes: int) -> LoopResult:
    return await langchain_loop(base_url, turns, payload_bytes, "websocket")


if importlib.util.find_spec("langchain") and importlib.util.find_spec("langchain_openai"):  # the `langchain` extra
    variant("langchain-http", "LangChain create_agent, plugins.langchain.ChatOpenAI(transport='http'): full history")(
        langchain_http_loop
    )
    variant("langchain-websocket", "LangChain create_agent, plugins.langchain.ChatOpenAI(transport='websocket')")(
        langchain_websocket_loop
    )
    PAIRS.append(("langchain-websocket", "langchain-http"))


def client_prepare(warmup: int) -> dict[str, Any]:
    """Per LangChain variant: ms to build each request from the history, overall and at the first and last turn."""
    out = {}
    for name, runs in CLIENT_PREPARE_MS.items():
        kept = runs[warmup:]
        if kept:
            out[name] = {
                "all_turns": summarize(x for r in kept for x in r),
                "first_turn": summarize(r[0] for r in kept),
                "last_turn": summarize(r[-1] for r in kept),
            }
    return out


async def measure(
    names: list[str], turns: int, repeats: int, warmup: int, payload_bytes: int, tokens_per_s: float
) -> dict[str, Any]:
    CLIENT_PREPARE_MS.clear()
    recorder = Recorder()
    backend = TimedBackend(SimulatedBackend(tokens_per_s=tokens_per_s, model=MODEL), recorder)
    settings = Settings(simulated_tokens_per_s=tokens_per_s, usage_ledger="off")  # simulated turns are not usage
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    with BackgroundServer(create_app(settings, backend=backend), settings) as server:
        for rep in range(-warmup, repeats):
            kind = "warm-up" if rep < 0 else f"repeat {rep + 1}/{repeats}"
            for name in rotated(names, rep):
                progress(f"agent: {kind}: {name}, {turns} turns")
                before_bytes = server.shim.stats.bytes_received
                before_streams = len(backend.stream_walls)
                loop = VARIANTS[name].loop
                result = await bounded(
                    loop(server.base_url, turns, payload_bytes), 30.0 + 10.0 * turns, f"agent {name}"
                )
                walls = backend.stream_walls[before_streams:]
                if rep < 0:
                    continue
                if len(walls) != len(result.turn_seconds):
                    raise RuntimeError(f"agent {name}: {len(walls)} backend calls for {len(result.turn_seconds)} turns")
                runs[name].append(
                    {
                        "seconds": result.seconds,
                        "turn_ms": [s * 1000 for s in result.turn_seconds],
                        "generation_ms": [w * 1000 for w in walls],
                        "overhead_ms": [(s - w) * 1000 for s, w in zip(result.turn_seconds, walls, strict=True)],
                        "bytes_sent": server.shim.stats.bytes_received - before_bytes,
                        "outputs": result.outputs,
                    }
                )
    return runs


def analyse(runs: dict[str, list[dict[str, Any]]], turns: int, quick: bool = False) -> dict[str, Any]:
    reference = runs[BASELINE][0]["outputs"] if runs.get(BASELINE) else None
    variants: dict[str, Any] = {}
    for name, rs in runs.items():
        variants[name] = {
            "label": VARIANTS[name].label,
            "total_s": summarize(r["seconds"] for r in rs),
            "generation_s": summarize(sum(r["generation_ms"]) / 1000 for r in rs),
            "turn_ms": summarize(x for r in rs for x in r["turn_ms"]),
            "overhead_ms": summarize(x for r in rs for x in r["overhead_ms"]),
            "bytes_sent": summarize(r["bytes_sent"] for r in rs),
            "same_outputs_as_baseline": all(r["outputs"] == reference for r in rs) if reference is not None else None,
            "per_turn": [
                {
                    "turn": t + 1,
                    "turn_ms": summarize(r["turn_ms"][t] for r in rs),
                    "overhead_ms": summarize(r["overhead_ms"][t] for r in rs),
                    "generation_ms": summarize(r["generation_ms"][t] for r in rs),
                }
                for t in range(turns)
            ],
            "samples_total_s": [r["seconds"] for r in rs],
        }
    pairs = [(n, BASELINE) for n in runs if n != BASELINE and BASELINE in runs]
    pairs += [p for p in PAIRS if p not in pairs and p[0] in runs and p[1] in runs]
    comparisons: list[dict[str, Any]] = []
    for num, den in pairs:
        ratios = paired_ratios([r["seconds"] for r in runs[num]], [r["seconds"] for r in runs[den]])
        stats = summarize(ratios)
        comparisons.append(
            {
                "name": f"{num} / {den} end-to-end time",
                "numerator": num,
                "denominator": den,
                "paired_ratio": stats,
                "faster_by": None if stats["median"] is None else 1.0 - stats["median"],
            }
        )
    targets = []
    main = next((c for c in comparisons if (c["numerator"], c["denominator"]) == ("websocket", BASELINE)), None)
    if main is not None and quick:  # a few turns: the history is short, so only the direction is a target
        targets.append(
            {
                "target": f"quick run: {turns}-turn agent loop at {TOKENS_PER_S:g} tok/s: WebSocket faster end to end than "
                "HTTP (1 - paired ratio, median; the full run's target is 40% at 50 turns)",
                "measured": main["faster_by"],
                "threshold": 0.0,
                "op": ">",
                "met": None if main["faster_by"] is None else main["faster_by"] > 0.0,
            }
        )
    elif main is not None:
        targets.append(
            {
                "target": f"{turns}-turn agent loop at {TOKENS_PER_S:g} tok/s: WebSocket >= 40% faster end to end than HTTP (1 - paired ratio, median)",
                "measured": main["faster_by"],
                "threshold": 0.4,
                "op": ">=",
                "met": None if main["faster_by"] is None else main["faster_by"] >= 0.4,
            }
        )
    return {"variants": variants, "comparisons": comparisons, "targets": targets}


def table(result: dict[str, Any]) -> str:
    rows = [
        [
            "variant",
            "total s p50",
            "p90",
            "p99",
            "turn ms p50",
            "overhead ms p50",
            "p90",
            "generation s",
            "bytes sent",
            "same outputs",
        ]
    ]
    for name, v in result["variants"].items():
        rows.append(
            [
                name,
                fmt(v["total_s"]["median"], 3),
                fmt(v["total_s"]["p90"], 3),
                fmt(v["total_s"]["p99"], 3),
                fmt(v["turn_ms"]["median"]),
                fmt(v["overhead_ms"]["median"]),
                fmt(v["overhead_ms"]["p90"]),
                fmt(v["generation_s"]["median"], 3),
                fmt(v["bytes_sent"]["median"], 0),
                str(v["same_outputs_as_baseline"]),
            ]
        )
    cfg = result["config"]
    lines = [
        f"agent ({cfg['turns']}-turn tool loop, {cfg['tokens_per_s']:g} tok/s simulated, {cfg['payload_bytes']} B tool results)",
        format_table(rows),
    ]
    for name, v in result["variants"].items():
        prepare = v.get("client_prepare_ms")
        if prepare:
            lines.append(
                f"  {name}: building the request from the history took {fmt(prepare['first_turn']['median'], 3)} ms "
                f"at turn 1, {fmt(prepare['last_turn']['median'], 3)} ms at turn {cfg['turns']} (median)"
            )
    for c in result["comparisons"]:
        lines.append(
            f"  ratio {c['name']}: median {fmt(c['paired_ratio']['median'], 3)} (faster by {fmt(100 * c['faster_by'] if c['faster_by'] is not None else None, 1)}%, n={c['paired_ratio']['n']})"
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
    repeats = repeats or (2 if quick else 5)
    warmup = 1
    names = variants or list(VARIANTS)
    progress(f"agent: {turns} turns x {repeats} repeats (+{warmup} warm-up) x {len(names)} variants")
    runs = asyncio.run(measure(names, turns, repeats, warmup, PAYLOAD_BYTES, TOKENS_PER_S))
    result: dict[str, Any] = {
        "suite": "agent",
        "machine": machine_info(),
        "config": {
            "turns": turns,
            "repeats": repeats,
            "warmup_runs": warmup,
            "tokens_per_s": TOKENS_PER_S,
            "payload_bytes": PAYLOAD_BYTES,
            "quick": quick,
            "backend": "simulated backend in the shim process (in-process uvicorn thread), paced at tokens_per_s",
        },
        "notes": [
            "end to end = the client's wall time for the whole loop; per-turn overhead = turn time minus the backend's "
            "stream window (first to last delta, measured in the server)",
            "HTTP is non-streaming with the whole history each turn (store: false); WebSocket streams and chains",
            "ratios pair the runs of the same repeat; the variant order rotates each repeat",
        ],
    }
    result.update(analyse(runs, turns, quick))
    for name, prepare in client_prepare(warmup).items():
        result["variants"][name]["client_prepare_ms"] = prepare
    result = clean_floats(result)
    write_json(out_dir, "agent", result)
    plot.per_turn_plot(
        {n: v["per_turn"] for n, v in result["variants"].items()},
        "overhead_ms",
        out_dir / "agent.png",
        f"Agent loop: per-turn overhead vs turn ({turns} turns, {TOKENS_PER_S:g} tok/s simulated)",
        "turn time - backend stream window, ms (log; median, band min..p90)",
    )
    return result
