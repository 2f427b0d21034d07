"""Suite 1, `overhead`: what a turn costs beyond generation, against history length.

The same 50-turn conversation (~4 KB of new user input a turn, ~200 KB of history by the last
turn, one output token a turn from a zero-latency simulated backend) runs through:

- `websocket`: the official SDK's `responses.connect()`, `previous_response_id` + new items only;
- `http_chained`: SDK `responses.create(stream=True)`, `previous_response_id` + `store: true`;
- `http_stateless`: SDK `responses.create(stream=True)` with the whole history, `store: false`;
- `http_raw`: the same stateless requests without the SDK (`httpx2`, each history item encoded once,
  only the terminal event decoded): the HTTP baseline without the SDK's per-turn transform;
- `websocket_raw`: WebSocket mode without the SDK (the loop encodes each frame, decodes only the
  terminal event); against `http_raw` it leaves the client out: the difference is wire and server;
- `backend_http` (floor over the wire): the same simulated backend behind an OpenAI-compatible
  Chat Completions server on loopback (benchmarks/chat_server.py, in-process), called with the
  SDK's `chat.completions.create(stream=True)` and the whole history, as a client without the shim would;
- `backend_inprocess` (the floor): `SimulatedBackend.stream()` called in-process, no server at all.

Overhead = turn time on the client minus the backend's own generation time (time spent inside
its `stream()`, measured in the server). The shim and the chat server run in this process, in a
uvicorn thread each, so client and server marks share one clock (see common.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
from openai import AsyncOpenAI

from server_shim import BackgroundServer, Settings, create_app
from server_shim.backends import SimulatedBackend

from . import loops, plot
from .chat_server import create_chat_app
from .common import (
    BREAKDOWN_PARTS,
    Recorder,
    ThreadServer,
    TimedBackend,
    TimingMiddleware,
    clean_floats,
    machine_info,
    paired_ratios,
    progress,
    rotated,
    summarize,
    timed_http_client,
    validation_probe,
    write_json,
)
from .report import fmt
from .turns import (
    MODEL,
    OUTPUT_TOKENS,
    USER_BYTES,
    user_message,
)

FIELDS = ("total_ms", "overhead_ms", "generation_ms", *BREAKDOWN_PARTS, "server_parse_ms")


@dataclass
class Env:
    recorder: Recorder
    shim: BackgroundServer
    chat: ThreadServer
    clients: dict[str, AsyncOpenAI]
    backend: TimedBackend
    raw: httpx2.AsyncClient


Runner = Callable[[Env, int], Awaitable[list[dict[str, Any]]]]


@dataclass(frozen=True)
class Alternative:
    name: str
    label: str
    run: Runner
    through_shim: bool


async def _websocket(env: Env, turns: int) -> list[dict[str, Any]]:
    return await loops.websocket(env.clients["websocket"], env.recorder, turns)


async def _http_chained(env: Env, turns: int) -> list[dict[str, Any]]:
    return await loops.http_responses(env.clients["http_chained"], env.recorder, turns, chained=True)


async def _http_stateless(env: Env, turns: int) -> list[dict[str, Any]]:
    return await loops.http_responses(env.clients["http_stateless"], env.recorder, turns)


async def _http_raw(env: Env, turns: int) -> list[dict[str, Any]]:
    return await loops.http_raw(env.raw, f"{env.shim.base_url}/responses", env.recorder, turns)


async def _websocket_raw(env: Env, turns: int) -> list[dict[str, Any]]:
    url = env.shim.base_url.replace("http://", "ws://", 1) + "/responses"
    return await loops.websocket_raw(url, env.recorder, turns)


async def _backend_http(env: Env, turns: int) -> list[dict[str, Any]]:
    return await loops.chat_completions(env.clients["backend_http"], env.recorder, turns)


async def _backend_inprocess(env: Env, turns: int) -> list[dict[str, Any]]:
    return await loops.backend_inprocess(env.backend, env.recorder, turns)


ALTERNATIVES: tuple[Alternative, ...] = (
    Alternative("websocket", "WebSocket, previous_response_id (SDK connect)", _websocket, True),
    Alternative("http_chained", "HTTP, previous_response_id + store", _http_chained, True),
    Alternative("http_stateless", "HTTP, stateless full history", _http_stateless, True),
    Alternative("http_raw", "HTTP, stateless full history, raw httpx2 client (no SDK)", _http_raw, True),
    Alternative(
        "websocket_raw", "WebSocket, previous_response_id, raw websockets client (no SDK)", _websocket_raw, True
    ),
    Alternative("backend_http", "backend direct over HTTP (chat completions, full history)", _backend_http, False),
    Alternative("backend_inprocess", "backend direct in-process (floor)", _backend_inprocess, False),
)


@contextlib.asynccontextmanager
async def environment() -> Any:
    recorder = Recorder()
    backend = TimedBackend(SimulatedBackend(model=MODEL), recorder)
    settings = Settings(usage_ledger="off")  # simulated turns stay out of the real usage ledger
    app = create_app(settings, backend=backend, validators=[validation_probe(recorder)])
    app.add_middleware(TimingMiddleware, recorder=recorder)
    chat_app = create_chat_app(TimedBackend(SimulatedBackend(model=MODEL), recorder))
    chat_app.add_middleware(TimingMiddleware, recorder=recorder)
    with BackgroundServer(app, settings) as shim, ThreadServer(chat_app) as chat:
        clients: dict[str, AsyncOpenAI] = {}
        try:
            for alt in ALTERNATIVES:
                base = shim.base_url if alt.through_shim else chat.base_url
                clients[alt.name] = AsyncOpenAI(
                    base_url=base, api_key="bench", max_retries=0, http_client=timed_http_client(recorder)
                )
            async with timed_http_client(recorder) as raw:
                yield Env(recorder, shim, chat, clients, backend, raw)
        finally:
            for client in clients.values():
                await client.close()


def window(turns: int, centre: int, width: int = 5) -> list[int]:
    """0-based turn indexes of a window of `width` turns centred on 1-based turn `centre`, clipped."""
    low = max(0, min(centre - 1 - width // 2, turns - width))
    return list(range(low, min(turns, low + width)))


async def measure(turns: int, repeats: int, warmup: int) -> dict[str, Any]:
    samples: dict[str, list[list[dict[str, Any]]]] = {alt.name: [] for alt in ALTERNATIVES}
    bytes_sent: dict[str, list[int]] = {alt.name: [] for alt in ALTERNATIVES}
    async with environment() as env:
        for rep in range(-warmup, repeats):
            kind = "warm-up" if rep < 0 else f"repeat {rep + 1}/{repeats}"
            for alt in rotated(ALTERNATIVES, rep):
                before = env.shim.shim.stats.bytes_received
                progress(f"overhead: {kind}: {alt.name}, {turns} turns")
                rows = await alt.run(env, turns)
                if rep >= 0:
                    samples[alt.name].append(rows)
                    if alt.through_shim:
                        bytes_sent[alt.name].append(env.shim.shim.stats.bytes_received - before)
    return {"samples": samples, "bytes_sent": bytes_sent}


def analyse(samples: dict[str, list[list[dict[str, Any]]]], turns: int, quick: bool = False) -> dict[str, Any]:
    first, last = window(turns, 5), window(turns, turns)
    alternatives: dict[str, Any] = {}
    for name, runs in samples.items():
        per_turn = []
        for t in range(turns):
            entry: dict[str, Any] = {"turn": t + 1}
            for f in FIELDS:
                entry[f] = summarize(run[t][f] for run in runs)
            per_turn.append(entry)

        def pooled(turn_indexes: list[int], runs: list[list[dict[str, Any]]] = runs) -> dict[str, Any]:
            return {f: summarize(run[t][f] for run in runs for t in turn_indexes) for f in FIELDS}

        forwarded = all(run[t]["backend_messages"] == run[t]["expected_messages"] for run in runs for t in range(turns))
        alternatives[name] = {
            "per_turn": per_turn,
            "all_turns": pooled(list(range(turns))),
            "first_window": pooled(first),
            "last_window": pooled(last),
            "backend_got_full_history": forwarded,
            "samples_overhead_ms": [[row["overhead_ms"] for row in run] for run in runs],
            "samples_total_ms": [[row["total_ms"] for row in run] for run in runs],
        }

    def values(name: str, field: str, turn_indexes: list[int]) -> list[float | None]:
        return [run[t][field] for run in samples[name] for t in turn_indexes]

    def ratio(num: str, den: str, turn_indexes: list[int], label: str, field: str = "overhead_ms") -> dict[str, Any]:
        return {
            "name": f"{num} / {den} {field}, {label}",
            "numerator": num,
            "denominator": den,
            "field": field,
            "turns": [t + 1 for t in turn_indexes],
            "paired": summarize(paired_ratios(values(num, field, turn_indexes), values(den, field, turn_indexes))),
        }

    all_turns = list(range(turns))
    ratios = [
        ratio("websocket", "http_stateless", last, f"last {len(last)} turns"),
        ratio("websocket", "http_stateless", all_turns, "all turns"),
        ratio("websocket", "http_chained", last, f"last {len(last)} turns"),
        ratio("http_chained", "http_stateless", last, f"last {len(last)} turns"),
        ratio("websocket", "backend_http", last, f"last {len(last)} turns"),
        ratio("http_stateless", "backend_http", last, f"last {len(last)} turns"),
        ratio("websocket", "http_stateless", last, f"last {len(last)} turns", field="total_ms"),
        ratio("websocket", "http_raw", last, f"last {len(last)} turns"),
        ratio("websocket", "http_raw", last, f"last {len(last)} turns", field="total_ms"),
        ratio("http_raw", "http_stateless", last, f"last {len(last)} turns"),
        ratio("websocket_raw", "http_raw", last, f"last {len(last)} turns"),
        ratio("websocket_raw", "http_raw", last, f"last {len(last)} turns", field="total_ms"),
    ]
    growth_per_repeat = []
    for run in samples["websocket"]:
        head = summarize(run[t]["overhead_ms"] for t in first)["median"]
        tail = summarize(run[t]["overhead_ms"] for t in last)["median"]
        if head and tail is not None:
            growth_per_repeat.append(tail / head - 1.0)

    def added(other: str, turn_indexes: list[int]) -> dict[str, Any]:
        pairs = zip(values("websocket", "total_ms", turn_indexes), values(other, "total_ms", turn_indexes), strict=True)
        return summarize(a - b for a, b in pairs if a is not None and b is not None)

    added_latency = {
        "websocket_minus_backend_inprocess": added("backend_inprocess", all_turns),
        "websocket_minus_backend_http": added("backend_http", all_turns),
        "websocket_minus_backend_http_first_window": added("backend_http", first),
        "websocket_minus_backend_http_last_window": added("backend_http", last),
        "websocket_shim_server_ms": alternatives["websocket"]["all_turns"]["server_ms"],
    }
    added_stats = added_latency["websocket_minus_backend_inprocess"]
    ws_vs_http = next(r for r in ratios if r["numerator"] == "websocket" and r["denominator"] == "http_stateless")
    growth = summarize(growth_per_repeat)
    # The 1/5 target is about long histories (turn 50, ~200 KB); a quick run's few turns only check the direction.
    ratio_target = (
        _target(
            f"quick run: WebSocket turn overhead below stateless HTTP's at turn {turns} (paired ratio, last {len(last)} "
            "turns, median; the full run's target is 1/5 at turn 50)",
            ws_vs_http["paired"]["median"],
            1.0,
            "<",
        )
        if quick
        else _target(
            f"WebSocket turn overhead <= 1/5 of stateless HTTP at turn {turns} (paired ratio, last {len(last)} turns, median)",
            ws_vs_http["paired"]["median"],
            0.2,
            "<=",
        )
    )
    targets = [
        ratio_target,
        _target(
            f"WebSocket overhead grows < 20% from turn {first[len(first) // 2] + 1} to turn {turns} (median over repeats)",
            growth["median"],
            0.2,
            "<",
        ),
        _target(
            "shim added latency over the backend called in-process, WebSocket, p50 per turn (ms)",
            added_stats["median"],
            1.0,
            "<",
        ),
    ]
    return {
        "alternatives": alternatives,
        "ratios": ratios,
        "websocket_overhead_growth": {
            "windows": [[t + 1 for t in first], [t + 1 for t in last]],
            "per_repeat": growth_per_repeat,
            "stats": growth,
        },
        "added_latency_ms": added_latency,
        "targets": targets,
    }


def _target(name: str, measured: float | None, threshold: float, op: str) -> dict[str, Any]:
    met = None if measured is None else (measured <= threshold if op == "<=" else measured < threshold)
    return {"target": name, "measured": measured, "threshold": threshold, "op": op, "met": met}


def table(result: dict[str, Any]) -> str:
    from .report import format_table

    turns = result["config"]["turns"]
    rows = [
        [
            "alternative",
            "overhead p50 all",
            "p90",
            "p99",
            "p50 turn ~5",
            f"p50 turn {turns}",
            "client prep",
            "req wire",
            "server",
            "resp wire",
            "client parse",
        ]
    ]
    for name, alt in result["alternatives"].items():
        allt, first, last = alt["all_turns"], alt["first_window"], alt["last_window"]
        rows.append(
            [
                name,
                fmt(allt["overhead_ms"]["median"]),
                fmt(allt["overhead_ms"]["p90"]),
                fmt(allt["overhead_ms"]["p99"]),
                fmt(first["overhead_ms"]["median"]),
                fmt(last["overhead_ms"]["median"]),
                *(fmt(last[p]["median"]) for p in BREAKDOWN_PARTS),
            ]
        )
    lines = [f"overhead (ms, per turn; parts at the last {len(window(turns, turns))} turns)", format_table(rows)]
    added = result["added_latency_ms"]
    lines.append(
        "  WebSocket added latency per turn (paired, p50): "
        f"over the backend in-process {fmt(added['websocket_minus_backend_inprocess']['median'])} ms, "
        f"over the backend over HTTP {fmt(added['websocket_minus_backend_http']['median'])} ms "
        f"(first turns {fmt(added['websocket_minus_backend_http_first_window']['median'])}, "
        f"last turns {fmt(added['websocket_minus_backend_http_last_window']['median'])}); "
        f"time inside the shim {fmt(added['websocket_shim_server_ms']['median'])} ms"
    )
    for r in result["ratios"]:
        lines.append(
            f"  ratio {r['name']}: median {fmt(r['paired']['median'], 3)} (p90 {fmt(r['paired']['p90'], 3)}, n={r['paired']['n']})"
        )
    return "\n".join(lines)


def run(out_dir: Path, *, quick: bool = False, turns: int | None = None, repeats: int | None = None) -> dict[str, Any]:
    turns = turns or (5 if quick else 50)
    repeats = repeats or (2 if quick else 10)
    warmup = 1
    progress(f"overhead: {turns} turns x {repeats} repeats (+{warmup} warm-up) x {len(ALTERNATIVES)} alternatives")
    measured = asyncio.run(measure(turns, repeats, warmup))
    result: dict[str, Any] = {
        "suite": "overhead",
        "machine": machine_info(),
        "config": {
            "turns": turns,
            "repeats": repeats,
            "warmup_runs": warmup,
            "user_bytes_per_turn": USER_BYTES,
            "output_tokens_per_turn": OUTPUT_TOKENS,
            "history_bytes_last_turn": sum(len(user_message(t)["content"]) for t in range(turns)),
            "quick": quick,
            "backend": "zero-latency simulated backend; 'backend_http' = that backend behind benchmarks/chat_server.py "
            "(OpenAI-compatible Chat Completions, in-process uvicorn thread); 'backend_inprocess' = its stream() called directly",
        },
        "alternatives_described": {a.name: a.label for a in ALTERNATIVES},
        "bytes_sent_per_run": {k: summarize(v) for k, v in measured["bytes_sent"].items() if v},
        "notes": [
            "overhead = client turn time - time spent inside the backend's stream() (measured in the server)",
            "client_prepare = SDK call until the encoded request reaches the transport; request_wire = until the ASGI app "
            "has the whole body/frame; server = shim time minus generation; response_wire = terminal event handed to "
            "uvicorn until its last chunk is read by the client; client_parse = until the SDK returns the parsed event",
            "client and servers share one process (servers in uvicorn threads) and one monotonic clock",
            "the SDK parses each stream event before it reads the next, so response_wire also holds the client's "
            "handling of the turn's earlier events (9 events a turn); client_parse is the terminal event only",
            "ratios are medians of ratios of paired samples: same repeat, same turn, same run; order rotates per repeat",
        ],
    }
    result.update(analyse(measured["samples"], turns, quick))
    result = clean_floats(result)
    write_json(out_dir, "overhead", result)
    plot.overhead_plot(result, out_dir / "overhead.png")
    return result
