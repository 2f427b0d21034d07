"""Suite `floor`: the shim's server CPU per chained WebSocket turn, as a ratio to what the wire costs.

Two servers run side by side in child processes: the shim (`responses-ws serve`, simulated
backend, no pacing) and the floor (`floor_server.py`: the same uvicorn + `websockets`
sans-I/O stack answering every frame with the exact frames the shim sent for such a turn,
captured first). One lean client drives both with pre-encoded frames (a fixed prefix, the
previous response id, a fixed suffix: no SDK, no JSON encoding) and reads each reply up to its
`response.completed` (the only event it decodes).

Workloads, each run against both servers in alternating order on every repeat:
- `sequential`: one connection, chained turns one after the other, 1 output token;
- `concurrent`: several connections at once, chained turns, 1 output token;
- `long`: one connection, chained turns of 64 output tokens (per-delta cost =
  (CPU per long turn - CPU per sequential turn) / 63).

Server CPU is the child process's CPU time (user + system, summed over its threads from
/proc/PID/task/*/schedstat, nanosecond resolution), not wall time: the machine is shared. Ratios
are shim / floor for CPU per turn and shim / floor for turns/s, each from the same repeat.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import orjson
from websockets.asyncio.client import ClientConnection, connect
from websockets.asyncio.connection import Connection

from .common import (
    Subprocess,
    bounded,
    clean_floats,
    cpu_seconds,
    free_port,
    machine_info,
    perf,
    progress,
    shim_command,
    summarize,
)
from .report import fmt, format_table

MODEL = "simulated-1"
LONG_TOKENS = 64
COMPLETED = b'{"type":"response.completed"'
FAILED = (b'{"type":"error"', b'{"type":"response.failed"', b'{"type":"response.incomplete"')
SERVERS = ("floor", "shim")
AFTER_CLOSES_S = 1.5
"""Wait before each shim run: the shim trims once per burst of connection closes (`server_shim/trim.py`:
a full collection and the attribute cache emptied, 1 s after the last close), a cost per burst that
would otherwise land in whichever run comes next."""


class Frames:
    """Pre-encoded `response.create` frames: only the previous response id is spliced in."""

    def __init__(self, tokens: int) -> None:
        body = {
            "type": "response.create",
            "model": MODEL,
            "input": "Next step?",
            "store": False,
            "max_output_tokens": tokens,
        }
        self.first = orjson.dumps(body)
        self.prefix = self.first[:-1] + b',"previous_response_id":"'
        self.suffix = b'"}'

    def chained(self, previous: bytes | None) -> bytes:
        return self.first if previous is None else self.prefix + previous + self.suffix


async def _open(url: str) -> ClientConnection:
    return await connect(url, max_size=None, compression=None, open_timeout=30, ping_interval=None)


async def _turn(ws: Connection, frame: bytes) -> tuple[bytes, list[bytes]]:
    """Send one frame; return the response id and every frame of the reply."""
    await ws.send(frame, text=True)
    received = []
    while True:
        raw = await ws.recv(decode=False)
        received.append(raw)
        if raw.startswith(COMPLETED):
            return orjson.loads(raw)["response"]["id"].encode(), received
        if raw.startswith(FAILED):
            raise RuntimeError(f"turn failed: {raw[:300]!r}")


async def _chain(url: str, frames: Frames, turns: int, start: asyncio.Event) -> None:
    async with await _open(url) as ws:
        await start.wait()
        previous = None
        for _ in range(turns):
            previous, _ = await _turn(ws, frames.chained(previous))


async def measure(url: str, pid: int, frames: Frames, connections: int, turns: int) -> dict[str, float]:
    """`connections` chains of `turns` turns at once: server CPU per turn, turns/s, client CPU per turn."""
    start = asyncio.Event()
    chains = [asyncio.create_task(_chain(url, frames, turns, start)) for _ in range(connections)]
    await asyncio.sleep(0.2)  # let every connection open before the clock starts
    cpu0, client0, wall0 = cpu_seconds(pid, tree=False), _client_cpu(), perf()
    start.set()
    await bounded(asyncio.gather(*chains), 120, "the turns")
    wall, client = perf() - wall0, _client_cpu() - client0
    count = connections * turns
    return {
        "server_cpu_ms_per_turn": (cpu_seconds(pid, tree=False) - cpu0) * 1000 / count,
        "turns_per_s": count / wall,
        "client_cpu_ms_per_turn": client * 1000 / count,
    }


def _client_cpu() -> float:
    return time.process_time()


async def capture(url: str) -> dict[str, list[str]]:
    """The frames the shim sends for a chained 1-token and a 64-token turn (the floor replays them)."""
    replies: dict[str, list[str]] = {}
    async with await _open(url) as ws:
        for tokens in (1, LONG_TOKENS):
            frames = Frames(tokens)
            previous, _ = await _turn(ws, frames.chained(None))
            _, received = await _turn(ws, frames.chained(previous))
            replies[str(tokens)] = [raw.decode() for raw in received]
    return replies


WORKLOADS = {
    # name: (connections, turns per connection, output tokens)
    "sequential": (1, 400, 1),
    "concurrent": (16, 40, 1),
    "long": (1, 100, LONG_TOKENS),
}
QUICK_WORKLOADS = {"sequential": (1, 30, 1), "concurrent": (4, 8, 1), "long": (1, 10, LONG_TOKENS)}


async def _run(out_dir: Path, workloads: dict[str, tuple[int, int, int]], repeats: int) -> dict[str, Any]:
    shim_port, floor_port = free_port(), free_port()
    logs = out_dir / "logs"
    events_path = out_dir / "floor-events.json"
    samples: dict[str, dict[str, list[dict[str, float]]]] = {w: {s: [] for s in SERVERS} for w in workloads}
    with Subprocess(
        shim_command(shim_port), ready_url=f"http://127.0.0.1:{shim_port}/healthz", log_path=logs / "floor-shim.log"
    ) as shim:
        shim_url = f"ws://127.0.0.1:{shim_port}/v1/responses"
        replies = await capture(shim_url)
        events_path.write_bytes(orjson.dumps(replies))
        floor_cmd = [sys.executable, "-m", "benchmarks.floor_server", str(floor_port), str(events_path)]
        with Subprocess(
            floor_cmd, ready_url=f"http://127.0.0.1:{floor_port}/healthz", log_path=logs / "floor-server.log"
        ) as floor:
            servers = {
                "floor": (f"ws://127.0.0.1:{floor_port}/v1/responses", floor.pid),
                "shim": (shim_url, shim.pid),
            }
            for url, pid in servers.values():  # warm-up
                await measure(url, pid, Frames(1), 2, 20)
            for repeat in range(repeats):
                for workload, (connections, turns, tokens) in workloads.items():
                    order = SERVERS if repeat % 2 == 0 else SERVERS[::-1]
                    for name in order:
                        url, pid = servers[name]
                        if name == "shim":  # its after-burst trim, due 1 s after the last run's closes, goes first
                            await asyncio.sleep(AFTER_CLOSES_S)
                        sample = await measure(url, pid, Frames(tokens), connections, turns)
                        samples[workload][name].append(sample)
                progress(f"floor: repeat {repeat + 1}/{repeats} done")
    return {
        "events_per_turn": {n: len(frames) for n, frames in replies.items()},
        "bytes_per_turn": {n: sum(len(f.encode()) for f in frames) for n, frames in replies.items()},
        "workloads": {w: _summarize(per_server) for w, per_server in samples.items()},
    }


def _summarize(per_server: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    floor, shim = per_server["floor"], per_server["shim"]
    result: dict[str, Any] = {
        name: {key: summarize([s[key] for s in samples]) for key in samples[0]} for name, samples in per_server.items()
    }
    result["cpu_ratio"] = summarize(
        [s["server_cpu_ms_per_turn"] / f["server_cpu_ms_per_turn"] for s, f in zip(shim, floor, strict=True)]
    )
    result["throughput_ratio"] = summarize(
        [s["turns_per_s"] / f["turns_per_s"] for s, f in zip(shim, floor, strict=True)]
    )
    return result


def _per_delta_us(workloads: dict[str, Any], server: str) -> float | None:
    long, short = workloads.get("long"), workloads.get("sequential")
    if not long or not short:
        return None
    extra = long[server]["server_cpu_ms_per_turn"]["median"] - short[server]["server_cpu_ms_per_turn"]["median"]
    return extra * 1000 / (LONG_TOKENS - 1)


def run(out_dir: Path, *, quick: bool = False, repeats: int | None = None) -> dict[str, Any]:
    workloads = QUICK_WORKLOADS if quick else WORKLOADS
    repeats = repeats or (1 if quick else 3)
    result: dict[str, Any] = {"suite": "floor", "machine": machine_info()}
    result.update(asyncio.run(_run(out_dir, workloads, repeats)))
    result["per_delta_us"] = {s: _per_delta_us(result["workloads"], s) for s in SERVERS}
    result["config"] = {
        "quick": quick,
        "repeats": repeats,
        "workloads": {w: {"connections": c, "turns": t, "output_tokens": k} for w, (c, t, k) in workloads.items()},
        "shim": "responses-ws serve in a child process, simulated backend, no pacing, store false, chained",
        "floor": "benchmarks/floor_server.py: same uvicorn + websockets sans-I/O stack, replays the shim's frames",
        "cpu": "server process CPU time (all threads, /proc schedstat), not wall time",
    }
    ratio = result["workloads"]["sequential"]["cpu_ratio"]["median"]
    result["targets"] = [
        {
            "target": "shim server CPU per chained turn within 2x of the floor (sequential)",
            "measured": ratio,
            "op": "<=",
            "threshold": 2.0,
            "met": None if ratio is None else ratio <= 2.0,
        }
    ]
    return clean_floats(result)


def table(result: dict[str, Any]) -> str:
    rows = [
        ["floor: workload", "server", "CPU ms/turn", "turns/s", "client CPU ms/turn", "CPU x floor", "turns/s x floor"]
    ]
    for workload, w in result["workloads"].items():
        for server in SERVERS:
            s = w[server]
            is_shim = server == "shim"
            rows.append(
                [
                    workload,
                    server,
                    fmt(s["server_cpu_ms_per_turn"]["median"], 3),
                    fmt(s["turns_per_s"]["median"], 0),
                    fmt(s["client_cpu_ms_per_turn"]["median"], 3),
                    fmt(w["cpu_ratio"]["median"], 2) if is_shim else "1.00",
                    fmt(w["throughput_ratio"]["median"], 2) if is_shim else "1.00",
                ]
            )
    delta = result["per_delta_us"]
    note = f"per streamed delta (server CPU): shim {fmt(delta['shim'], 1)} us, floor {fmt(delta['floor'], 1)} us"
    events = result["events_per_turn"]
    return format_table(rows) + f"\n{note}; events per turn {events}"
