"""Suite `replicas`: chained turns with 1 and 2 workers, memory and Redis store, and what a store write costs.

The shim runs as `responses-ws serve [--workers 2] [--store redis://...]` in a child process on
the zero-latency simulated backend; a real `redis-server` (persistence off) runs beside it. The
clients are lean (raw `websockets`, only terminal frames parsed), one connection per client,
each chaining its turns with `previous_response_id`.

- load: C clients at once x T chained turns (`store: true`), for C in 64 and 256: turns/s over
  the wall time, and p50/p99 of per-turn latency (send to terminal event);
- store cost: one client, two chains on one connection, one `store: true` and one `store: false`,
  their N turns alternating (so both see the same machine load): p50 per-turn latency of each
  and the difference, what one store write adds to a turn.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import orjson
from websockets.asyncio.client import ClientConnection, connect

from .common import (
    Subprocess,
    bounded,
    clean_floats,
    cpu_seconds,
    free_port,
    machine_info,
    perf,
    progress,
    raise_fd_limit,
    shim_command,
    summarize,
    write_json,
)
from .redis_server import RedisServer
from .report import fmt, format_table

MODEL = "simulated-1"
COMPLETED = b'{"type":"response.completed"'
ENDS = (COMPLETED, b'{"type":"response.failed"', b'{"type":"error"', b'{"type":"response.incomplete"')


async def _turn(ws: ClientConnection, previous: str | None, store: bool) -> tuple[str, float]:
    frame = {"type": "response.create", "model": MODEL, "input": "next step", "store": store, "max_output_tokens": 16}
    if previous is not None:
        frame["previous_response_id"] = previous
    t0 = perf()
    await ws.send(orjson.dumps(frame), text=True)
    while True:
        message = await ws.recv(decode=False)
        if message.startswith(ENDS):
            break
    elapsed = perf() - t0
    if not message.startswith(COMPLETED):
        raise RuntimeError(f"a chained turn ended badly: {message[:300]!r}")
    return orjson.loads(message)["response"]["id"], elapsed


async def _client(url: str, turns: int, store: bool, latencies: list[float]) -> None:
    async with connect(url, max_size=None, compression=None, open_timeout=30, ping_interval=None) as ws:
        previous = None
        for _ in range(turns):
            previous, elapsed = await bounded(_turn(ws, previous, store), 60.0, "a chained turn")
            latencies.append(elapsed)


async def load_round(url: str, pid: int, clients: int, turns: int, store: bool) -> dict[str, Any]:
    latencies: list[float] = []
    cpu0, client0, t0 = cpu_seconds(pid), time.process_time(), perf()
    await asyncio.gather(*(_client(url, turns, store, latencies) for _ in range(clients)))
    wall = perf() - t0
    return {
        "clients": clients,
        "turns_per_client": turns,
        "store": store,
        "turns": len(latencies),
        "wall_s": wall,
        "turns_per_s": len(latencies) / wall,
        "latency_ms": summarize(v * 1000 for v in latencies),
        "server_cpu_share": (cpu_seconds(pid) - cpu0) / wall,
        "client_cpu_share": (time.process_time() - client0) / wall,
    }


async def server_rounds(
    out_dir: Path, workers: int, store_url: str | None, loads: list[tuple[int, int]], sequential: int
) -> dict[str, Any]:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = [*shim_command(port), "--workers", str(workers), "--store", store_url or "memory"]
    name = f"replicas-{workers}w-{'redis' if store_url else 'memory'}"
    env = {**_env(), "RESPONSES_WS_USAGE_PATH": str(out_dir / "logs" / f"{name}-usage.db")}
    result: dict[str, Any] = {"workers": workers, "store": "redis" if store_url else "memory", "load": []}
    with Subprocess(cmd, ready_url=base + "/healthz", log_path=out_dir / "logs" / f"{name}.log", env=env) as server:
        url = base.replace("http://", "ws://") + "/v1/responses"
        await load_round(url, server.pid, 4, 3, True)  # warm-up: every worker imports and connects
        for clients, turns in loads:
            progress(f"replicas: {name}: {clients} clients x {turns} chained turns")
            result["load"].append(await load_round(url, server.pid, clients, turns, True))
        if sequential:
            progress(f"replicas: {name}: 1 client, {sequential} turns alternating store true/false")
            result["store_cost"] = await store_cost(url, sequential)
    return result


async def store_cost(url: str, turns: int) -> dict[str, Any]:
    """Two chains on one connection, one stored and one not, their turns alternating: paired in time."""
    latencies: dict[bool, list[float]] = {True: [], False: []}
    previous: dict[bool, str | None] = {True: None, False: None}
    async with connect(url, max_size=None, compression=None, open_timeout=30, ping_interval=None) as ws:
        for index in range(2 * turns):
            store = index % 2 == 0
            previous[store], elapsed = await bounded(_turn(ws, previous[store], store), 60.0, "a chained turn")
            latencies[store].append(elapsed)
    return {
        "stored": summarize(v * 1000 for v in latencies[True]),
        "not_stored": summarize(v * 1000 for v in latencies[False]),
    }


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("RESPONSES_WS_")}


def run(out_dir: Path, *, quick: bool = False, repeats: int | None = None) -> dict[str, Any]:
    loads = [(8, 3)] if quick else [(64, 10), (256, 5)]
    sequential = 20 if quick else 150
    raise_fd_limit(4 * max(c for c, _ in loads) + 512)
    progress(f"replicas: loads {loads}, store cost over {sequential} sequential turns")

    async def all_rounds() -> list[dict[str, Any]]:
        rounds = []
        with RedisServer() as redis:
            for store_url in (None, redis.url):
                for workers in (1, 2):
                    redis.command("FLUSHALL")
                    rounds.append(
                        await server_rounds(out_dir, workers, store_url, loads, sequential if workers == 1 else 0)
                    )
        return rounds

    load_average = os.getloadavg()
    rounds = asyncio.run(all_rounds())
    result = clean_floats(
        {
            "suite": "replicas",
            "config": {"quick": quick, "loads": loads, "sequential_turns": sequential, "backend": "simulated"},
            "machine": {**machine_info(), "load_average_at_start": load_average},
            "rounds": rounds,
            "targets": [_target(rounds)],
        }
    )
    write_json(out_dir, "replicas", result)
    return result


def _target(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Informative: what one Redis write adds to a turn's median latency (1 worker, 1 client)."""
    redis = next(r for r in rounds if r["store"] == "redis" and r["workers"] == 1)
    added = redis["store_cost"]["stored"]["median"] - redis["store_cost"]["not_stored"]["median"]
    return {
        "target": "a Redis store write adds < 2 ms to a turn's median latency (1 worker, 1 client)",
        "measured": added,
        "threshold": 2.0,
        "op": "<",
        "met": added < 2.0,
    }


def table(result: dict[str, Any]) -> str:
    rows = [["workers / store", "clients", "turns/s", "p50 ms", "p99 ms", "server CPU", "client CPU"]]
    for r in result["rounds"]:
        for load in r["load"]:
            rows.append(
                [
                    f"{r['workers']} / {r['store']}",
                    str(load["clients"]),
                    fmt(load["turns_per_s"], 0),
                    fmt(load["latency_ms"]["median"], 1),
                    fmt(load["latency_ms"]["p99"], 1),
                    fmt(100 * load["server_cpu_share"], 0) + "%",
                    fmt(100 * load["client_cpu_share"], 0) + "%",
                ]
            )
    cost = [["store (1 worker, 1 client)", "store: true p50 ms", "store: false p50 ms", "added ms"]]
    for r in result["rounds"]:
        if "store_cost" in r:
            stored, not_stored = r["store_cost"]["stored"]["median"], r["store_cost"]["not_stored"]["median"]
            cost.append([r["store"], fmt(stored, 3), fmt(not_stored, 3), fmt(stored - not_stored, 3)])
    cfg = result["config"]
    title = f"replicas (chained turns over WebSocket, simulated backend; loads {cfg['loads']} clients x turns)"
    return "\n".join([title, format_table(rows), "", format_table(cost)])
