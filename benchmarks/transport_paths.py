"""ws_transport: chaining before serialization (`wrap()`) against the transport-level path, per turn.

    python -m benchmarks.transport_paths [--turns 100] [--repeats 3] [--payload 4000] [--sync] [--dicts]

A tool-calling loop that resends its whole history every turn (as frameworks do) runs against
the shim on loopback (simulated backend, no pacing), through three clients (the history holds the
SDK's output objects, as the SDK's own examples do, or with `--dicts` their `model_dump()`s):
- `before_serialization`: `ws_transport.wrap(client)`; the delta is found on the caller's objects
  and only the new items are encoded;
- `transport_level`: the same client with `http_client=httpx2.*Client(transport=*WebSocketTransport())`;
  the SDK serializes the whole history, the transport parses it and finds the delta by equality;
- `http`: the plain client, the whole history over HTTP (the reference; total time only).

Client-side time per turn = (frame handed to the socket - `create()` called) + (`create()`
returned - terminal event read off the socket): everything the client does, nothing the wire or
the server does. It is reported at turns 10, 50 and 100 as the median over the five turns ending
there and over the repeats. Bytes are read from the session stats and the shim's own counter.
JSON goes to `benchmarks/results/transport_paths.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import openai
from openai import AsyncOpenAI, OpenAI

import ws_transport
from server_shim import BackgroundServer, Settings, create_app
from server_shim.demo import TOOLS, follow_up, next_user_message
from ws_transport.connection import Connection, Listener

MODEL = "simulated-1"
MARKS = (10, 50, 100)
WINDOW = 5
TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed", "error"})
RESULTS = Path(__file__).resolve().parent / "results" / "transport_paths.json"
perf = time.perf_counter


@dataclass
class Probe:
    """Timestamps from inside the session: when the frame left, when the terminal event arrived."""

    sent: float = 0.0
    terminal: float = 0.0


PROBE = Probe()


def install_probe() -> None:
    """Benchmark-only instrumentation of the session's socket wrapper."""
    send, route = Connection.send, Connection._route

    async def timed_send(self: Connection, frame: bytes) -> None:
        PROBE.sent = perf()
        await send(self, frame)

    def timed_route(self: Connection, event: dict[str, Any], listener: Listener) -> None:
        if event.get("type") in TERMINAL:
            PROBE.terminal = perf()
        route(self, event, listener)

    Connection.send = timed_send  # type: ignore[method-assign]
    Connection._route = timed_route  # type: ignore[method-assign]


@dataclass
class Run:
    client_ms: list[float] = field(default_factory=list)
    total_ms: list[float] = field(default_factory=list)
    history_bytes: list[int] = field(default_factory=list)
    bytes_sent_at_30: int = 0
    bytes_http_equivalent_at_30: int = 0


def history_size(history: list[Any]) -> int:
    return len(json.dumps([i.model_dump(exclude_none=True) if hasattr(i, "model_dump") else i for i in history]))


@dataclass(frozen=True)
class Loop:
    turns: int
    payload: int
    dicts: bool


def extend(history: list[Any], output: list[Any], turn: int, loop: Loop) -> None:
    kept = [item.model_dump(exclude_none=True) for item in output] if loop.dicts else list(output)
    history += [*kept, *follow_up(output, turn + 1, loop.payload)]


async def run_async(client: AsyncOpenAI, loop: Loop, probed: bool) -> Run:
    run = Run()
    history: list[Any] = [next_user_message(0)]
    for turn in range(loop.turns):
        start = perf()
        response = await client.responses.create(model=MODEL, input=history, tools=TOOLS, store=False)
        record(run, start, perf(), probed, history, turn)
        extend(history, response.output, turn, loop)
        snapshot(run, client, turn)
    return run


def run_sync(client: OpenAI, loop: Loop, probed: bool) -> Run:
    run = Run()
    history: list[Any] = [next_user_message(0)]
    for turn in range(loop.turns):
        start = perf()
        response = client.responses.create(model=MODEL, input=history, tools=TOOLS, store=False)
        record(run, start, perf(), probed, history, turn)
        extend(history, response.output, turn, loop)
        snapshot(run, client, turn)
    return run


def record(run: Run, start: float, end: float, probed: bool, history: list[Any], turn: int) -> None:
    run.total_ms.append((end - start) * 1000)
    if probed:
        run.client_ms.append(((PROBE.sent - start) + (end - PROBE.terminal)) * 1000)
    if turn + 1 in MARKS:
        run.history_bytes.append(history_size(history))


def snapshot(run: Run, client: OpenAI | AsyncOpenAI, turn: int) -> None:
    transport = client._client._transport
    if turn + 1 == 30 and isinstance(transport, ws_transport.AsyncWebSocketTransport | ws_transport.WebSocketTransport):
        stats = ws_transport.session_of(client).stats
        run.bytes_sent_at_30, run.bytes_http_equivalent_at_30 = stats.bytes_sent, stats.bytes_http_equivalent


def make_clients(base_url: str, sync: bool) -> dict[str, Callable[[], Any]]:
    kwargs = {"base_url": base_url, "api_key": "bench", "max_retries": 0}
    if sync:
        return {
            "before_serialization": lambda: ws_transport.wrap(OpenAI(**kwargs)),
            "transport_level": lambda: OpenAI(
                **kwargs, http_client=httpx2.Client(transport=ws_transport.WebSocketTransport())
            ),
            "http": lambda: OpenAI(**kwargs),
        }
    return {
        "before_serialization": lambda: ws_transport.wrap(AsyncOpenAI(**kwargs)),
        "transport_level": lambda: AsyncOpenAI(
            **kwargs, http_client=httpx2.AsyncClient(transport=ws_transport.AsyncWebSocketTransport())
        ),
        "http": lambda: AsyncOpenAI(**kwargs),
    }


async def measure(server: BackgroundServer, args: argparse.Namespace) -> dict[str, list[Run]]:
    runs: dict[str, list[Run]] = {}
    clients = make_clients(server.base_url, args.sync)
    loop = Loop(args.turns, args.payload, args.dicts)
    for repeat in range(args.repeats + 1):  # repeat 0 warms up and is dropped
        order = list(clients) if repeat % 2 else list(reversed(clients))
        for name in order:
            client = clients[name]()
            if args.sync:
                with client:
                    run = run_sync(client, loop, probed=name != "http")
            else:
                async with client:
                    run = await run_async(client, loop, probed=name != "http")
            if repeat:
                runs.setdefault(name, []).append(run)
            print(f"[transport_paths] repeat {repeat} {name}: done", file=sys.stderr, flush=True)
    return runs


def at_mark(runs: list[Run], attribute: str, mark: int) -> float | None:
    values = [v for run in runs for v in getattr(run, attribute)[max(0, mark - WINDOW) : mark]]
    return round(statistics.median(values), 3) if values else None


def summarize(runs: dict[str, list[Run]], turns: int) -> dict[str, Any]:
    marks = [m for m in MARKS if m <= turns]
    paths = {
        name: {
            str(mark): {
                "client_ms": at_mark(path_runs, "client_ms", mark),
                "total_ms": at_mark(path_runs, "total_ms", mark),
            }
            for mark in marks
        }
        for name, path_runs in runs.items()
    }
    first = runs["before_serialization"][0]
    return {
        "paths": paths,
        "history_bytes": dict(zip(map(str, marks), first.history_bytes, strict=False)),
        "bytes_30_turns": {
            "websocket_sent": first.bytes_sent_at_30,
            "http_equivalent": first.bytes_http_equivalent_at_30,
        },
    }


async def http_bytes_30(server: BackgroundServer, payload: int, dicts: bool) -> int:
    """What plain HTTP really put on the wire for the first 30 turns (the shim counts received bytes)."""
    before = server.shim.stats.bytes_received
    async with AsyncOpenAI(base_url=server.base_url, api_key="bench", max_retries=0) as client:
        await run_async(client, Loop(30, payload, dicts), probed=False)
    return server.shim.stats.bytes_received - before


def table(summary: dict[str, Any]) -> str:
    rows = ["turn  history KB  before-serialization ms  transport-level ms  ratio  (HTTP total ms)"]
    paths = summary["paths"]
    for mark, size in summary["history_bytes"].items():
        before = paths["before_serialization"][mark]["client_ms"]
        level = paths["transport_level"][mark]["client_ms"]
        http = paths["http"][mark]["total_ms"]
        rows.append(
            f"{mark:>4}  {size / 1000:>10.0f}  {before:>23.2f}  {level:>18.2f}  {level / before:>5.1f}x  ({http:.2f})"
        )
    b = summary["bytes_30_turns"]
    if not b["websocket_sent"]:
        return "\n".join(rows)
    rows.append(
        f"30 turns: {b['websocket_sent']:,} B sent over WebSocket, {b['http_measured']:,} B over plain HTTP "
        f"({b['http_measured'] / b['websocket_sent']:.1f}x; the session's own estimate: {b['http_equivalent']:,} B)"
    )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.transport_paths", description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--payload", type=int, default=4000, help="bytes of each tool result")
    parser.add_argument("--sync", action="store_true", help="use OpenAI instead of AsyncOpenAI")
    parser.add_argument("--dicts", action="store_true", help="keep outputs in the history as dumped dicts")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    install_probe()
    settings = Settings(usage_ledger="off")  # simulated turns stay out of the real usage ledger
    with BackgroundServer(create_app(settings), settings) as server:
        runs = asyncio.run(measure(server, args))
        summary = summarize(runs, args.turns)
        if args.turns >= 30:
            summary["bytes_30_turns"]["http_measured"] = asyncio.run(http_bytes_30(server, args.payload, args.dicts))
    summary["config"] = {
        "turns": args.turns,
        "repeats": args.repeats,
        "tool_result_bytes": args.payload,
        "client": "OpenAI" if args.sync else "AsyncOpenAI",
        "history": "dumped dicts" if args.dicts else "SDK output objects",
        "window": WINDOW,
        "python": platform.python_version(),
        "openai": openai.__version__,
        "machine": platform.processor() or platform.machine(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    print(table(summary))
    print(f"\nwrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
