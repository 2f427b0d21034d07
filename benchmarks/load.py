"""Suite `load`: many concurrent WebSocket clients, each a chain of turns, against one shim process.

The shim runs in a child process (`responses-ws serve`, simulated backend, no pacing), a fresh
one per level so each level's RSS is its own, its usage ledger a new SQLite file (an empty table each
run, whichever checkout serves it). At each level, N clients open their connection
first; then all run T chained turns at once (`previous_response_id`, `store: false`, 4 output
tokens), each turn timed from its send to its `response.completed`. Clients are lean (raw
`websockets`, events told apart by prefix, only the terminal event parsed).

Reported per level: turns/s (turns / wall time of the turn phase), turn latency p50/p99 (the headline),
and apart what it is made of: the p50/p99 of each client's first turn (unchained, on a fresh connection,
all N sent at the same instant: a herd) and of the steady state (every turn after each client's first
two), errors (error events, failed responses, refused or dropped connections: must be 0), the server's
CPU seconds per turn, the load generator's own (this process's CPU time over the turn phase, per turn:
it shares the machine with the server), and the server's VmRSS idle (before the clients), at peak (sampled every 50 ms) and after
every client left (the lowest sample in the `SETTLE_S` seconds after the last close: the server
collects and trims once per burst of closes, a second or a few after it, see `server_shim/trim.py`).
`allocators` runs each level once per CPython allocator: `default` (no `PYTHONMALLOC` in the server's
environment: a bare `serve`, which runs itself again on the C allocator where glibc's `malloc_trim` exists),
`pymalloc` (`PYTHONMALLOC=pymalloc`: Python's own allocator, the opt-out) or `malloc` (`PYTHONMALLOC=malloc`).

`checkouts` compares checkouts side by side: each level is served from each checkout (a directory holding a
`server_shim/`, put first on the server's `PYTHONPATH`; checked before anything runs) `repeats` times, the
checkouts' order alternating from one repeat to the next, so a change in the machine's load falls on both; the
medians over the repeats are tabled side by side. The clients always run this checkout's code.

A second part, `big_frame`, measures what large frames cost the other connections: connection B
runs back-to-back small turns while connection A sends, one after the other, (a) a 3 MB frame of
one long text input, (b) a 3 MB frame of 60,000 tiny items (refused: over `max_input_items`), (c)
the largest item count accepted (5,000 tiny items). B's turn latency p50/p99/max beside each,
and alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
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
    percentile,
    perf,
    progress,
    raise_fd_limit,
    rss_bytes,
    shim_command,
    summarize,
)
from .report import fmt, format_table

MODEL = "simulated-1"
LEVELS = (50, 200, 500, 1000)
TURNS = 20
SETTLE_S = 10.0
ALLOCATORS = ("default",)
COMPLETED = b'{"type":"response.completed"'
FAILED = (b'{"type":"error"', b'{"type":"response.failed"', b'{"type":"response.incomplete"')


async def _open(url: str) -> ClientConnection:
    return await connect(url, max_size=None, compression=None, open_timeout=60, ping_interval=None)


async def _turn(ws: ClientConnection, text: str, previous: str | None, tokens: int = 4) -> tuple[str | None, float]:
    """One turn: (the response id, or None if it failed; seconds from send to its terminal event)."""
    body = {"type": "response.create", "model": MODEL, "input": text, "store": False, "max_output_tokens": tokens}
    if previous:
        body["previous_response_id"] = previous
    start = perf()
    await ws.send(orjson.dumps(body), text=True)
    while True:
        raw = await ws.recv(decode=False)
        if raw.startswith(COMPLETED):
            return orjson.loads(raw)["response"]["id"], perf() - start
        if raw.startswith(FAILED):
            return None, perf() - start


async def _client(ws: ClientConnection, turns: int, by_turn: list[list[float]], start: asyncio.Event) -> int:
    """A chain of `turns` turns, each one's latency added to `by_turn[its index]`; returns the errors it met."""
    await start.wait()
    previous = None
    errors = 0
    for n in range(turns):
        response_id, seconds = await _turn(ws, f"Turn {n}: what next?", previous)
        by_turn[n].append(seconds)
        if response_id is None:
            errors += 1
        previous = response_id
    return errors


async def _sample_rss(pid: int, peak: list[int], stop: asyncio.Event) -> None:
    while not stop.is_set():
        with contextlib.suppress(OSError):
            peak[0] = max(peak[0], rss_bytes(pid))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.05)


def server_env(allocator: str, checkout: Path | None = None, usage_dir: Path | None = None) -> dict[str, str]:
    """The server child's environment for a CPython allocator (`default`: without `PYTHONMALLOC`, as a bare `serve`),
    serving `checkout`'s `server_shim` when one is named, its usage ledger a new SQLite file in `usage_dir` when one
    is named (and `RESPONSES_WS_USAGE_PATH` is not set): every run starts from an empty ledger, whatever earlier runs
    or another checkout's table left in the default one."""
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONMALLOC"}
    if usage_dir is not None:
        environment.setdefault("RESPONSES_WS_USAGE_PATH", str(usage_dir / "usage.db"))
    if checkout is not None:
        environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(checkout), environment.get("PYTHONPATH")]))
    return environment if allocator == "default" else {**environment, "PYTHONMALLOC": allocator}


def checkout_label(checkout: Path) -> str:
    """A checkout as the tables name it: its directory and, in a git work tree, its commit."""
    commit = subprocess.run(
        ["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    return f"{checkout.name}@{commit}" if commit else checkout.name


def check_checkout(checkout: Path) -> None:
    """Fail unless a server started with `checkout` on its path imports `server_shim` from it."""
    found = subprocess.run(
        [sys.executable, "-c", "import server_shim; print(server_shim.__file__)"],
        env=server_env("default", checkout),
        cwd=checkout,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not Path(found).resolve().is_relative_to(checkout.resolve()):
        raise RuntimeError(f"a server given {checkout} would import server_shim from {found}")


async def _settled_rss(pid: int, seconds: float) -> int:
    """The lowest RSS sampled over `seconds` (every 0.25 s)."""
    lowest = rss_bytes(pid)
    deadline = perf() + seconds
    while perf() < deadline:
        await asyncio.sleep(0.25)
        lowest = min(lowest, rss_bytes(pid))
    return lowest


async def level(
    out_dir: Path,
    clients: int,
    turns: int,
    allocator: str = "pymalloc",
    settle_s: float = SETTLE_S,
    checkout: Path | None = None,
) -> dict[str, Any]:
    raise_fd_limit(2 * clients + 512)
    port = free_port()
    url = f"ws://127.0.0.1:{port}/v1/responses"
    log = out_dir / "logs" / f"load-{clients}-{allocator}{'-' + checkout.name if checkout else ''}.log"
    usage_dir = tempfile.TemporaryDirectory(prefix="load-usage-")
    child = Subprocess(
        shim_command(port),
        ready_url=f"http://127.0.0.1:{port}/healthz",
        log_path=log,
        env=server_env(allocator, checkout, Path(usage_dir.name)),
        cwd=checkout,
    )
    with usage_dir, child as server:
        warm = await _open(url)
        for n in range(3):
            await _turn(warm, f"warm {n}", None)
        await warm.close()
        await asyncio.sleep(0.5)
        idle = rss_bytes(server.pid)
        progress(f"load: {clients} clients x {turns} turns, {allocator} (idle RSS {idle / 2**20:.0f} MB)")
        opened = await bounded(
            asyncio.gather(*(_open(url) for _ in range(clients)), return_exceptions=True), 120, "connecting"
        )
        sockets = [ws for ws in opened if isinstance(ws, ClientConnection)]
        refused = len(opened) - len(sockets)
        by_turn: list[list[float]] = [[] for _ in range(turns)]
        start, stop, peak = asyncio.Event(), asyncio.Event(), [idle]
        sampler = asyncio.create_task(_sample_rss(server.pid, peak, stop))
        runs = [asyncio.create_task(_client(ws, turns, by_turn, start)) for ws in sockets]
        began, cpu_before, own_before = perf(), cpu_seconds(server.pid, tree=False), time.process_time()
        start.set()
        outcomes = await bounded(asyncio.gather(*runs, return_exceptions=True), 600, "the turn phase")
        wall, cpu = perf() - began, cpu_seconds(server.pid, tree=False) - cpu_before
        own = time.process_time() - own_before
        errors = refused + sum(o if isinstance(o, int) else 1 for o in outcomes)
        await asyncio.gather(*(ws.close() for ws in sockets), return_exceptions=True)
        stop.set()
        await sampler
        after = await _settled_rss(server.pid, settle_s)
    latencies = [seconds for turn in by_turn for seconds in turn]
    steady = [seconds for turn in by_turn[2:] for seconds in turn]
    return {
        "clients": clients,
        "allocator": allocator,
        "checkout": checkout_label(checkout) if checkout else None,
        "server_cpu_ms_per_turn": cpu / len(latencies) * 1000 if latencies else None,
        "client_cpu_ms_per_turn": own / len(latencies) * 1000 if latencies else None,
        "turns_per_client": turns,
        "turns": len(latencies),
        "wall_s": wall,
        "turns_per_s": len(latencies) / wall if wall > 0 else None,
        "latency_p50_ms": percentile(latencies, 50) * 1000 if latencies else None,
        "latency_p99_ms": percentile(latencies, 99) * 1000 if latencies else None,
        "first_turn_p50_ms": percentile(by_turn[0], 50) * 1000 if by_turn[0] else None,
        "first_turn_p99_ms": percentile(by_turn[0], 99) * 1000 if by_turn[0] else None,
        "steady_p50_ms": percentile(steady, 50) * 1000 if steady else None,
        "steady_p99_ms": percentile(steady, 99) * 1000 if steady else None,
        "errors": errors,
        "rss_idle_bytes": idle,
        "rss_peak_bytes": peak[0],
        "rss_after_bytes": after,
        "rss_after_over_idle": after / idle if idle else None,
    }


async def _small_turns(ws: ClientConnection, seconds: float) -> list[float]:
    latencies = []
    deadline = perf() + seconds
    while perf() < deadline:
        _, elapsed = await _turn(ws, "small", None, tokens=1)
        latencies.append(elapsed)
    return latencies


async def big_frame(out_dir: Path, frames: int, seconds: float) -> dict[str, Any]:
    port = free_port()
    url = f"ws://127.0.0.1:{port}/v1/responses"

    def frame(value: Any) -> bytes:
        return orjson.dumps(
            {"type": "response.create", "model": MODEL, "input": value, "store": False, "max_output_tokens": 1}
        )

    def items(count: int) -> list[dict[str, str]]:
        return [{"type": "message", "role": "user", "content": f"item {n}"} for n in range(count)]

    kinds = {"text_3mb": frame("x" * 3_000_000), "items_60k": frame(items(60_000)), "items_5k": frame(items(5_000))}
    log = out_dir / "logs" / "load-big-frame.log"
    result: dict[str, Any] = {"frame_bytes": {name: len(data) for name, data in kinds.items()}}
    with Subprocess(shim_command(port), ready_url=f"http://127.0.0.1:{port}/healthz", log_path=log):
        async with await _open(url) as b, await _open(url) as a:
            await _small_turns(b, 0.5)
            result["alone"] = _stats(await _small_turns(b, seconds))
            for name, data in kinds.items():

                async def sender(data: bytes = data) -> None:
                    for _ in range(frames):
                        await a.send(data, text=True)
                        while not (await a.recv(decode=False)).startswith((COMPLETED, *FAILED)):
                            pass

                sending = asyncio.create_task(sender())
                result[f"beside_{name}"] = _stats(await _small_turns(b, seconds))
                await bounded(sending, 120, "the big frames")
    return result


def _stats(latencies: list[float]) -> dict[str, Any]:
    return {
        "turns": len(latencies),
        "p50_ms": percentile(latencies, 50) * 1000,
        "p99_ms": percentile(latencies, 99) * 1000,
        "max_ms": max(latencies) * 1000,
    }


def run(
    out_dir: Path,
    *,
    quick: bool = False,
    repeats: int | None = None,
    clients: list[int] | None = None,
    turns: int | None = None,
    allocators: list[str] | None = None,
    checkouts: list[Path] | None = None,
) -> dict[str, Any]:
    """Every level (or those in `clients`, then without the big-frame part), `turns` chained turns per client,
    once per allocator in `allocators`, `repeats` times (1 unless given), served from each of `checkouts` in
    turn (this one's when none), their order alternating between repeats."""
    levels = clients or ([5, 20] if quick else list(LEVELS))
    turns = turns or (3 if quick else TURNS)
    repeats = repeats or 1
    served: list[Path | None] = [c.resolve() for c in checkouts] if checkouts else [None]
    for checkout in served:
        if checkout is not None:
            check_checkout(checkout)
    result: dict[str, Any] = {"suite": "load", "machine": machine_info(), "levels": []}

    async def all_levels() -> None:
        for n in levels:
            for allocator in allocators or ALLOCATORS:
                for repeat in range(repeats):
                    for checkout in served if repeat % 2 == 0 else served[::-1]:
                        lvl = await level(out_dir, n, turns, allocator, 2.0 if quick else SETTLE_S, checkout)
                        result["levels"].append({**lvl, "repeat": repeat})
        if clients is None:
            result["big_frame"] = await big_frame(out_dir, frames=2 if quick else 5, seconds=1.0 if quick else 3.0)

    asyncio.run(all_levels())
    if repeats > 1 or len(served) > 1:
        result["side_by_side"] = side_by_side(result["levels"])
    result["config"] = {
        "quick": quick,
        "levels": levels,
        "turns_per_client": turns,
        "allocators": allocators or list(ALLOCATORS),
        "repeats": repeats,
        "checkouts": [checkout_label(c) for c in served if c is not None],
        "rss_after": f"lowest RSS in the {SETTLE_S:g} s after the last client closed",
        "server": "responses-ws serve in a child process, simulated backend, no pacing, 4 output tokens a turn",
        "turn": "chained with previous_response_id, store false; latency from send to response.completed",
        "first_turn": "each client's first turn: unchained, on a connection opened before the turn phase, all at once",
        "steady": "every turn after each client's first two",
        "client_cpu": "this process's CPU time over the turn phase, per turn (the load generator's own cost)",
    }
    result["targets"] = [
        {
            "target": f"no errors at {lvl['clients']} clients ({_named(lvl)})",
            "measured": lvl["errors"],
            "op": "<=",
            "threshold": 0,
            "met": lvl["errors"] == 0,
        }
        for lvl in result["levels"]
    ] + [
        {
            "target": f"RSS after {lvl['clients']} clients left within 10% of idle ({_named(lvl)}; store false)",
            "measured": lvl["rss_after_over_idle"],
            "op": "<=",
            "threshold": 1.10,
            "met": lvl["rss_after_over_idle"] is not None and lvl["rss_after_over_idle"] <= 1.10,
        }
        for lvl in result["levels"]
    ]
    return clean_floats(result)


def _named(lvl: dict[str, Any]) -> str:
    return lvl["allocator"] if lvl.get("checkout") is None else f"{lvl['allocator']}, {lvl['checkout']}"


SIDE_BY_SIDE = (
    "turns_per_s",
    "latency_p50_ms",
    "latency_p99_ms",
    "first_turn_p50_ms",
    "first_turn_p99_ms",
    "steady_p50_ms",
    "steady_p99_ms",
    "server_cpu_ms_per_turn",
    "client_cpu_ms_per_turn",
)


LATENCY_COLUMNS = ("turns/s", "p50 ms", "p99 ms", "first p50", "first p99", "steady p50", "steady p99")


def side_by_side(levels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per level, allocator and checkout, in the order first run: each figure's median over the repeats."""
    groups: dict[tuple[int, str, str | None], list[dict[str, Any]]] = {}
    for lvl in levels:
        groups.setdefault((lvl["clients"], lvl["allocator"], lvl.get("checkout")), []).append(lvl)
    return [
        {
            "clients": clients,
            "allocator": allocator,
            "checkout": checkout,
            "runs": len(runs),
            **{key: summarize(run[key] for run in runs)["median"] for key in SIDE_BY_SIDE},
        }
        for (clients, allocator, checkout), runs in groups.items()
    ]


def table(result: dict[str, Any]) -> str:
    head = ["load: clients", "allocator", "checkout", "turns", *LATENCY_COLUMNS, "errors", "CPU ms/turn", "client CPU"]
    rows = [[*head, "RSS idle MB", "peak MB", "after MB"]]
    for lvl in result["levels"]:
        rows.append(
            [
                lvl["clients"],
                lvl.get("allocator", "pymalloc"),  # runs before the `default` choice were pymalloc
                lvl.get("checkout") or "-",
                lvl["turns"],
                fmt(lvl["turns_per_s"], 0),
                fmt(lvl["latency_p50_ms"], 1),
                fmt(lvl["latency_p99_ms"], 1),
                fmt(lvl.get("first_turn_p50_ms"), 1),
                fmt(lvl.get("first_turn_p99_ms"), 1),
                fmt(lvl.get("steady_p50_ms"), 1),
                fmt(lvl.get("steady_p99_ms"), 1),
                lvl["errors"],
                fmt(lvl.get("server_cpu_ms_per_turn"), 2),
                fmt(lvl.get("client_cpu_ms_per_turn"), 2),
                fmt(lvl["rss_idle_bytes"] / 2**20, 0),
                fmt(lvl["rss_peak_bytes"] / 2**20, 0),
                fmt(lvl["rss_after_bytes"] / 2**20, 0),
            ]
        )
    lines = [format_table(rows)]
    if result.get("side_by_side"):
        lines.append(_side_by_side_table(result["side_by_side"]))
    big = result.get("big_frame")
    if big:
        frame_rows = [["small turns on B", "turns", "p50 ms", "p99 ms", "max ms"]]
        for key in ("alone", "beside_text_3mb", "beside_items_60k", "beside_items_5k"):
            s = big[key]
            frame_rows.append([key, s["turns"], fmt(s["p50_ms"], 1), fmt(s["p99_ms"], 1), fmt(s["max_ms"], 1)])
        lines.append(format_table(frame_rows))
    return "\n\n".join(lines)


def _side_by_side_table(groups: list[dict[str, Any]]) -> str:
    head = ["side by side (medians): clients", "allocator", "checkout", "runs", *LATENCY_COLUMNS]
    rows = [[*head, "CPU ms/turn", "client CPU"]]
    for g in groups:
        figures = [fmt(g[key], 0 if key == "turns_per_s" else 2 if "cpu" in key else 1) for key in SIDE_BY_SIDE]
        rows.append([g["clients"], g["allocator"], g["checkout"] or "-", g["runs"], *figures])
    return format_table(rows)
