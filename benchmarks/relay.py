"""Suite 3, `relay`: text deltas per second one shim process streams, and idle connections held.

The shim runs in a child process (`responses-ws serve`, via `python -m server_shim.cli`) on the
zero-latency simulated backend, so its CPU time and RSS are its own. Clients are lean: raw
`websockets` frames and raw SSE bytes, counted by prefix without parsing JSON, so the client
is not what is measured (its CPU share is reported to show whether it kept up).

- throughput: N connections at once, each runs K responses of M output tokens (one
  `response.output_text.delta` per token); deltas/s = deltas received / wall time, and deltas
  per CPU-second of the server process;
- idle: C WebSocket connections opened and held; the server's RSS before and while holding
  them (VmRSS of the server process), a turn on one of them to show it still serves, then close.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import httpx2
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
    rss_bytes,
    shim_command,
    summarize,
    write_json,
)
from .report import fmt, format_table

MODEL = "simulated-1"
DELTA_PREFIX = b'{"type":"response.output_text.delta"'
DONE_PREFIXES = (
    b'{"type":"response.completed"',
    b'{"type":"response.incomplete"',
    b'{"type":"response.failed"',
    b'{"type":"error"',
)
SSE_DELTA = b"event: response.output_text.delta\n"


def _create(tokens: int) -> dict[str, Any]:
    return {"model": MODEL, "input": "Stream please.", "max_output_tokens": tokens, "store": False}


async def _ws_connection(url: str, responses: int, tokens: int, timeout_s: float) -> int:
    deltas = 0
    async with connect(url, max_size=None, compression=None, open_timeout=10) as ws:
        frame = orjson.dumps({"type": "response.create", **_create(tokens)})
        for _ in range(responses):
            await ws.send(frame, text=True)
            deltas += await bounded(_ws_drain(ws), timeout_s, "a relayed WebSocket response")
    return deltas


async def _ws_drain(ws: ClientConnection) -> int:
    deltas = 0
    while True:
        message = await ws.recv(decode=False)
        if message.startswith(DELTA_PREFIX):
            deltas += 1
        elif message.startswith(DONE_PREFIXES):
            if not message.startswith(b'{"type":"response.completed"'):
                raise RuntimeError(f"relay response ended badly: {message[:300]!r}")
            return deltas


async def _sse_stream(client: httpx2.AsyncClient, url: str, responses: int, tokens: int, timeout_s: float) -> int:
    deltas = 0
    body = orjson.dumps({**_create(tokens), "stream": True})

    async def one() -> int:
        count, tail = 0, b""
        async with client.stream("POST", url, content=body, headers={"content-type": "application/json"}) as response:
            if response.status_code != 200:
                raise RuntimeError(f"relay SSE answered {response.status_code}")
            async for chunk in response.aiter_raw():
                data = tail + chunk
                count += data.count(SSE_DELTA)
                # keep a partial marker for the next chunk, never a whole one (it was counted)
                cut = max(0, len(data) - len(SSE_DELTA) + 1)
                tail = data[cut:] if data.rfind(SSE_DELTA) < cut else b""
        return count

    for _ in range(responses):
        deltas += await bounded(one(), timeout_s, "a relayed SSE response")
    return deltas


async def throughput_round(
    kind: str, base: str, pid: int, connections: int, responses: int, tokens: int
) -> dict[str, Any]:
    timeout_s = 60.0 + tokens / 1000.0
    cpu0, client0, t0 = cpu_seconds(pid, tree=False), time.process_time(), perf()
    if kind == "websocket":
        url = base.replace("http://", "ws://") + "/v1/responses"
        counts = await asyncio.gather(*(_ws_connection(url, responses, tokens, timeout_s) for _ in range(connections)))
    else:
        limits = httpx2.Limits(max_connections=connections, max_keepalive_connections=connections)
        async with httpx2.AsyncClient(timeout=httpx2.Timeout(timeout_s, connect=10.0), limits=limits) as client:
            counts = await asyncio.gather(
                *(_sse_stream(client, base + "/v1/responses", responses, tokens, timeout_s) for _ in range(connections))
            )
    wall = perf() - t0
    server_cpu = cpu_seconds(pid, tree=False) - cpu0
    client_cpu = time.process_time() - client0
    deltas = sum(counts)
    expected = connections * responses * tokens
    return {
        "deltas": deltas,
        "expected_deltas": expected,
        "complete": deltas == expected,
        "wall_s": wall,
        "deltas_per_s": deltas / wall if wall > 0 else None,
        "server_cpu_s": server_cpu,
        "deltas_per_server_cpu_s": deltas / server_cpu if server_cpu > 0 else None,
        "server_cpu_share": server_cpu / wall if wall > 0 else None,
        "client_cpu_share": client_cpu / wall if wall > 0 else None,
    }


async def throughput(out_dir: Path, connections: int, responses: int, tokens: int, repeats: int) -> dict[str, Any]:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    result: dict[str, Any] = {}
    with Subprocess(
        shim_command(port), ready_url=base + "/healthz", log_path=out_dir / "logs" / "relay-throughput-shim.log"
    ) as server:
        for kind in ("websocket", "http_sse"):
            progress(f"relay: {kind} warm-up")
            await throughput_round(kind, base, server.pid, 1, 1, min(tokens, 2000))
            rounds = []
            for rep in range(repeats):
                progress(
                    f"relay: {kind} repeat {rep + 1}/{repeats}: {connections} connections x {responses} x {tokens} tokens"
                )
                rounds.append(await throughput_round(kind, base, server.pid, connections, responses, tokens))
            result[kind] = {
                "rounds": rounds,
                "deltas_per_s": summarize(r["deltas_per_s"] for r in rounds),
                "deltas_per_server_cpu_s": summarize(r["deltas_per_server_cpu_s"] for r in rounds),
                "server_cpu_share": summarize(r["server_cpu_share"] for r in rounds),
                "client_cpu_share": summarize(r["client_cpu_share"] for r in rounds),
                "complete": all(r["complete"] for r in rounds),
            }
    return result


async def _open(url: str) -> ClientConnection:
    return await connect(url, max_size=None, compression=None, open_timeout=20, ping_interval=None)


async def _one_turn(ws: ClientConnection) -> float:
    t0 = perf()
    await ws.send(orjson.dumps({"type": "response.create", **_create(16)}), text=True)
    await bounded(_ws_drain(ws), 30.0, "a turn on a held connection")
    return perf() - t0


async def _healthz_connections(client: httpx2.AsyncClient, base: str) -> int:
    return int((await client.get(base + "/healthz")).json()["connections"])


async def idle(out_dir: Path, count: int, hold_s: float, batch: int = 100) -> dict[str, Any]:
    soft, hard = raise_fd_limit(2 * count + 512)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    url = f"ws://127.0.0.1:{port}/v1/responses"
    held: list[ClientConnection] = []
    result: dict[str, Any] = {"connections_wanted": count, "fd_limit": [soft, hard]}
    with Subprocess(
        shim_command(port), ready_url=base + "/healthz", log_path=out_dir / "logs" / "relay-idle-shim.log"
    ) as server:
        async with httpx2.AsyncClient(timeout=10.0) as http:
            try:
                warm = [await _open(url) for _ in range(5)]
                await _one_turn(warm[0])
                for ws in warm:
                    await ws.close()
                await asyncio.sleep(0.5)
                result["rss_baseline_bytes"] = rss_bytes(server.pid)
                progress(f"relay: opening {count} idle WebSocket connections (fd limit {soft})")
                t0 = perf()
                for start in range(0, count, batch):
                    n = min(batch, count - start)
                    held += await bounded(
                        asyncio.gather(*(_open(url) for _ in range(n))), 60.0, "opening a batch of connections"
                    )
                result["open_s"] = perf() - t0
                deadline = perf() + 10.0
                while (seen := await _healthz_connections(http, base)) < count and perf() < deadline:
                    await asyncio.sleep(0.1)
                result["server_reported_connections"] = seen
                await asyncio.sleep(hold_s)
                samples = [rss_bytes(server.pid)]
                for _ in range(4):
                    await asyncio.sleep(0.1)
                    samples.append(rss_bytes(server.pid))
                result["rss_held_bytes"] = max(samples)
                result["connections_held"] = len(held)
                result["turn_on_held_connection_ms"] = await _one_turn(held[len(held) // 2]) * 1000
            finally:
                await asyncio.gather(*(ws.close() for ws in held), return_exceptions=True)
            deadline = perf() + 10.0
            with contextlib.suppress(httpx2.HTTPError):
                while await _healthz_connections(http, base) > 0 and perf() < deadline:
                    await asyncio.sleep(0.1)
            result["rss_after_close_bytes"] = rss_bytes(server.pid)
    delta = result["rss_held_bytes"] - result["rss_baseline_bytes"]
    result["rss_delta_bytes"] = delta
    result["rss_per_connection_bytes"] = delta / max(1, result["connections_held"])
    return result


def table(result: dict[str, Any]) -> str:
    cfg = result["config"]
    rows = [["relay", "deltas/s p50", "min", "max", "deltas/server-CPU-s", "server CPU", "client CPU", "complete"]]
    for kind, r in result["throughput"].items():
        rows.append(
            [
                kind,
                fmt(r["deltas_per_s"]["median"], 0),
                fmt(r["deltas_per_s"]["min"], 0),
                fmt(r["deltas_per_s"]["max"], 0),
                fmt(r["deltas_per_server_cpu_s"]["median"], 0),
                fmt(100 * (r["server_cpu_share"]["median"] or 0), 0) + "%",
                fmt(100 * (r["client_cpu_share"]["median"] or 0), 0) + "%",
                str(r["complete"]),
            ]
        )
    i = result["idle"]
    mb = 1024 * 1024
    lines = [
        f"relay ({cfg['connections']} connections x {cfg['responses_per_connection']} responses x {cfg['max_output_tokens']} tokens; zero-latency backend)",
        format_table(rows),
        f"  idle: {i['connections_held']} WebSocket connections held (server saw {i['server_reported_connections']}); server RSS "
        f"{i['rss_baseline_bytes'] / mb:.1f} MB -> {i['rss_held_bytes'] / mb:.1f} MB (+{i['rss_delta_bytes'] / mb:.1f} MB, "
        f"{i['rss_per_connection_bytes'] / 1024:.1f} KB/connection); a turn on a held connection {i['turn_on_held_connection_ms']:.1f} ms",
    ]
    return "\n".join(lines)


def run(out_dir: Path, *, quick: bool = False, repeats: int | None = None) -> dict[str, Any]:
    connections, responses, tokens = (2, 1, 1000) if quick else (4, 2, 20000)
    idle_count, hold_s = (50, 0.2) if quick else (1000, 2.0)
    repeats = repeats or (1 if quick else 3)
    progress(
        f"relay: throughput {connections}x{responses}x{tokens} tokens, {repeats} repeats; then {idle_count} idle connections"
    )

    async def both() -> tuple[dict[str, Any], dict[str, Any]]:
        return await throughput(out_dir, connections, responses, tokens, repeats), await idle(
            out_dir, idle_count, hold_s
        )

    through, held = asyncio.run(both())
    ws = through["websocket"]
    targets = [
        {
            "target": "one shim process streams >= 40,000 text deltas/s to clients (WebSocket, median)",
            "measured": ws["deltas_per_s"]["median"],
            "threshold": 40000,
            "op": ">=",
            "met": None if ws["deltas_per_s"]["median"] is None else ws["deltas_per_s"]["median"] >= 40000,
        },
        {
            "target": f"{idle_count} idle WebSocket connections held in < 500 MB (server RSS while holding, MB)",
            "measured": held["rss_held_bytes"] / 1024 / 1024,
            "threshold": 500,
            "op": "<",
            "met": held["rss_held_bytes"] < 500 * 1024 * 1024 and held["connections_held"] == idle_count,
        },
    ]
    result = clean_floats(
        {
            "suite": "relay",
            "machine": machine_info(),
            "config": {
                "connections": connections,
                "responses_per_connection": responses,
                "max_output_tokens": tokens,
                "repeats": repeats,
                "warmup": "one response of up to 2,000 tokens on one connection per transport",
                "idle_connections": idle_count,
                "hold_s": hold_s,
                "quick": quick,
                "server": "responses-ws serve (python -m server_shim.cli serve) in a child process, simulated backend, zero latency",
            },
            "notes": [
                "deltas/s counts response.output_text.delta events received by the clients over the wall time of a round",
                "server CPU share near 100% means the server was the bottleneck; client CPU near 100% means the client was",
                "RSS is VmRSS of the server process (no children); the baseline is taken after a warm-up turn",
            ],
            "throughput": through,
            "idle": held,
            "targets": targets,
        }
    )
    write_json(out_dir, "relay", result)
    return result
