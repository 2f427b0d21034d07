"""Suite `memory`: what one held conversation costs the server (50 turns, ~4 KB tool outputs, ~200 KB).

Each conversation is an agent loop over its own WebSocket (raw `websockets` clients on loopback,
chained with `previous_response_id`): turn 1 asks for a `lookup` call; every later turn sends the
call's output (`TOOL_BYTES` of text) and a user message that asks for the next call, and the
simulated backend answers with that call. After T turns the conversation holds ~T x 4 KB of
JSON. N conversations are held at once (their connections stay open), with `store` on (the
memory store keeps every response too) and off (only the connection caches hold them).

Two variants, each per conversation:
- `in_process`: the shim under uvicorn in a thread of this process; `tracemalloc` bytes held
  after the turns minus before (connections already open, a warm-up conversation done), split
  by where they were allocated (the first `server_shim` frame of each allocation), and the
  server's own objects walked once (`sys.getsizeof`, each object counted once, in this order):
  items, chat rendering (messages), encoded fragments, Response objects, the rest of the states
  (tools, call ids, lists), the cache and store containers;
- `child_process`: `responses-ws serve` in a child process; its VmRSS after the turns minus
  before, over N (RSS includes allocator slack, so it is the figure a deployment sees). It runs on the
  allocator a bare `serve` picks (the C allocator, see `server_shim/trim.py`) unless `PYTHONMALLOC` is set
  for this process (the child inherits it).
"""

from __future__ import annotations

import asyncio
import gc
import linecache
import os
import sys
import tracemalloc
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson
from websockets.asyncio.client import ClientConnection, connect

from server_shim import create_app
from server_shim.settings import Settings
from server_shim.state import ConnectionCache, MemoryResponseStore, ResponseState

from .common import (
    Subprocess,
    ThreadServer,
    bounded,
    clean_floats,
    free_port,
    machine_info,
    progress,
    rss_bytes,
    shim_command,
)
from .report import fmt, format_table

MODEL = "simulated-1"
TURNS = 50
TOOL_BYTES = 4000
CONVERSATIONS = {"in_process": 4, "child_process": 16}
TARGET_MB = 0.8
COMPLETED = b'{"type":"response.completed"'
TOOL = {
    "type": "function",
    "name": "lookup",
    "description": "Look up a record by number.",
    "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
}
MB = 1024 * 1024


def _tool_output(n: int) -> str:
    row = f"record {n}: " + "x" * 60 + "\n"
    return (row * (TOOL_BYTES // len(row) + 1))[:TOOL_BYTES]


def _ask(n: int) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": f'Next record, please.\ncall lookup {{"n": {n}}}'}


async def _open(url: str) -> ClientConnection:
    return await connect(url, max_size=None, compression=None, open_timeout=60, ping_interval=None)


class AgentLoop:
    """One agent loop on one WebSocket: each `run(turns)` continues the chain where it stopped."""

    def __init__(self, ws: ClientConnection, store: bool) -> None:
        self.ws = ws
        self.store = store
        self.previous: str | None = None
        self.turns = 0
        self.json_bytes = 0
        """JSON bytes of the items sent and received so far: what the conversation holds, encoded."""
        self._items: list[dict[str, Any]] = [_ask(1)]

    async def run(self, turns: int) -> AgentLoop:
        for _ in range(turns):
            await self._turn()
        return self

    async def _turn(self) -> None:
        self.turns += 1
        body: dict[str, Any] = {"type": "response.create", "model": MODEL, "input": self._items, "tools": [TOOL]}
        body["store"] = self.store
        if self.previous:
            body["previous_response_id"] = self.previous
        await self.ws.send(orjson.dumps(body), text=True)
        while not (raw := await self.ws.recv(decode=False)).startswith(COMPLETED):
            if raw.startswith((b'{"type":"error"', b'{"type":"response.failed"')):
                raise RuntimeError(f"turn {self.turns} failed: {raw[:300]!r}")
        response = orjson.loads(raw)["response"]
        self.previous = response["id"]
        self.json_bytes += sum(len(orjson.dumps(item)) for item in [*self._items, *response["output"]])
        call_id = response["output"][-1]["call_id"]
        output = _tool_output(self.turns)
        self._items = [{"type": "function_call_output", "call_id": call_id, "output": output}, _ask(self.turns + 1)]


async def conversation(ws: ClientConnection, turns: int, store: bool) -> int:
    """One agent loop of `turns` chained turns; returns the JSON bytes of the items it sent and received."""
    return (await AgentLoop(ws, store).run(turns)).json_bytes


# ---------------------------------------------------------------------------------------------
# in process: tracemalloc and a walk of the server's own objects


def _states() -> tuple[list[ResponseState], list[Any]]:
    """Every response state the server holds, and the containers holding them (caches, store)."""
    states: dict[int, ResponseState] = {}
    holders: list[Any] = []
    for obj in gc.get_objects():
        if isinstance(obj, ConnectionCache | MemoryResponseStore):
            holders.append(obj)
            for state in obj._states.values():
                states[id(state)] = state
    return list(states.values()), holders


class _Walk:
    """`sys.getsizeof` summed over every object reachable from what is walked, each counted once."""

    def __init__(self) -> None:
        self.seen: set[int] = set()

    def size(self, roots: Iterable[Any], stop: tuple[type, ...] = ()) -> int:
        total = 0
        stack = list(roots)
        while stack:
            node = stack.pop()
            if id(node) in self.seen or isinstance(node, (*stop, type)):
                continue
            self.seen.add(id(node))
            total += sys.getsizeof(node)
            if isinstance(node, dict):
                stack.extend(node.keys())
                stack.extend(node.values())
            elif isinstance(node, list | tuple | set | frozenset):
                stack.extend(node)
            elif hasattr(node, "__slots__") or hasattr(node, "__dict__"):
                stack.extend(getattr(node, "__dict__", {}).values())
                for cls in type(node).__mro__:
                    for slot in getattr(cls, "__slots__", ()):
                        if hasattr(node, slot):
                            stack.append(getattr(node, slot))
        return total


def held_by(states: list[ResponseState], holders: list[Any]) -> dict[str, int]:
    """Bytes the server's states hold, by what holds them (each object charged to the first part that reaches it)."""
    from server_shim.backends.chat_convert import ChatPrompt
    from server_shim.history import History

    walk = _Walk()
    histories = {id(s.history): s.history for s in states}
    nodes: dict[int, History] = {}
    for history in histories.values():
        node: History | None = history
        while node is not None and id(node) not in nodes:
            nodes[id(node)] = node
            node = node.parent
    prompts: dict[int, ChatPrompt] = {}
    for node in nodes.values():
        for _, _, rendering in node._renderings:
            segment = rendering
            while isinstance(segment, ChatPrompt) and id(segment) not in prompts:
                prompts[id(segment)] = segment
                segment = segment.parent
    parts = {
        "items": walk.size([n.own for n in nodes.values()]),
        "fragments": walk.size(f for p in prompts.values() for f in getattr(p, "own_fragments", ())),
        "rendering": walk.size([*prompts.values(), *(n._renderings for n in nodes.values())], (History,)),
        "history_nodes": walk.size(nodes.values(), (ChatPrompt,)),
        "response_objects": walk.size(s.response for s in states),
        "states_rest": walk.size(states, (History, ChatPrompt)),
        "cache_and_store": walk.size(holders, (ResponseState,)),
    }
    parts["total"] = sum(parts.values())
    return parts


CLIENT_SITE = "client "


def _site(trace: tracemalloc.StatisticDiff) -> str:
    """Where an allocation was made: the innermost frame in the shim (`file:line code`), else its own.

    Allocations made by this suite's clients (in the same process) are named `client ...`: orjson
    keeps the keys it decodes in a process-wide cache, which the clients' parsing fills too.
    """
    frames = list(trace.traceback)  # oldest first
    if "benchmarks" in frames[-1].filename:
        return f"{CLIENT_SITE}{Path(frames[-1].filename).name}:{frames[-1].lineno}"
    for frame in reversed(frames):
        if "server_shim" in frame.filename:
            short = frame.filename.split("server_shim/", 1)[1]
            return f"{short}:{frame.lineno} {linecache.getline(frame.filename, frame.lineno).strip()[:60]}"
    frame = frames[-1]
    return f"{Path(frame.filename).name}:{frame.lineno}"


async def _in_process(count: int, turns: int, store: bool) -> dict[str, Any]:
    settings = Settings(usage_ledger="off")
    with ThreadServer(create_app(settings)) as server:
        url = f"ws://127.0.0.1:{server.port}/v1/responses"
        warm = await _open(url)
        await conversation(warm, 3, store)
        await warm.close()
        sockets = [await _open(url) for _ in range(count)]
        warm_ids = {state.id for state in _states()[0]}
        gc.collect()
        tracemalloc.start(8)
        before = tracemalloc.take_snapshot()
        sizes = await bounded(
            asyncio.gather(*(conversation(ws, turns, store) for ws in sockets)), 300, "the conversations"
        )
        await asyncio.sleep(0.3)  # post-inference work of the last turns
        gc.collect()
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()
        states, holders = _states()
        states = [s for s in states if s.id not in warm_ids]  # the warm-up's (stored) turns are not counted
        parts = held_by(states, holders)
        diff = after.compare_to(before, "traceback")
        sites: dict[str, int] = {}
        for stat in diff:
            sites[_site(stat)] = sites.get(_site(stat), 0) + stat.size_diff
        client = sum(size for site, size in sites.items() if site.startswith(CLIENT_SITE))
        held = sum(sites.values()) - client
        for ws in sockets:
            await ws.close()
    top = sorted(((k, v) for k, v in sites.items() if not k.startswith(CLIENT_SITE)), key=lambda kv: -kv[1])[:12]
    return {
        "conversations": count,
        "json_bytes_per_conversation": sum(sizes) // count,
        "tracemalloc_bytes_per_conversation": held / count,
        "client_bytes_excluded_per_conversation": client / count,
        "walk_bytes_per_conversation": {k: v / count for k, v in parts.items()},
        "states": len(states),
        "top_allocation_sites": [{"site": site, "bytes_per_conversation": size / count} for site, size in top],
    }


# ---------------------------------------------------------------------------------------------
# child process: RSS


async def _child_process(out_dir: Path, count: int, turns: int, store: bool) -> dict[str, Any]:
    port = free_port()
    url = f"ws://127.0.0.1:{port}/v1/responses"
    env = {**os.environ, "RESPONSES_WS_USAGE_LEDGER": "off"}
    log = out_dir / "logs" / f"memory-{'store' if store else 'nostore'}.log"
    with Subprocess(shim_command(port), ready_url=f"http://127.0.0.1:{port}/healthz", log_path=log, env=env) as server:
        warm = await _open(url)
        await conversation(warm, 3, store)
        await warm.close()
        sockets = [await _open(url) for _ in range(count)]
        await asyncio.sleep(0.3)
        before = rss_bytes(server.pid)
        sizes = await bounded(
            asyncio.gather(*(conversation(ws, turns, store) for ws in sockets)), 300, "the conversations"
        )
        await asyncio.sleep(0.5)
        after = rss_bytes(server.pid)
        for ws in sockets:
            await ws.close()
    return {
        "conversations": count,
        "json_bytes_per_conversation": sum(sizes) // count,
        "rss_before_bytes": before,
        "rss_after_bytes": after,
        "rss_bytes_per_conversation": (after - before) / count,
    }


def run(out_dir: Path, *, quick: bool = False, repeats: int | None = None, turns: int | None = None) -> dict[str, Any]:
    """Both variants, store on and off; `quick`: 2 conversations of 6 turns."""
    turns = turns or (6 if quick else TURNS)
    counts = {k: 2 for k in CONVERSATIONS} if quick else dict(CONVERSATIONS)
    result: dict[str, Any] = {"suite": "memory", "machine": machine_info(), "runs": []}

    async def every_run() -> None:
        for store in (False, True):
            progress(f"memory: in process, {counts['in_process']} x {turns} turns, store {store}")
            run_in = await _in_process(counts["in_process"], turns, store)
            progress(f"memory: child process, {counts['child_process']} x {turns} turns, store {store}")
            run_child = await _child_process(out_dir, counts["child_process"], turns, store)
            result["runs"].append({"store": store, "in_process": run_in, "child_process": run_child})

    asyncio.run(every_run())
    result["config"] = {
        "quick": quick,
        "turns": turns,
        "tool_output_bytes": TOOL_BYTES,
        "conversations": counts,
        "conversation": "agent loop: each turn a function_call_output and a user message in, a function_call out",
        "child_pythonmalloc": os.environ.get("PYTHONMALLOC") or "unset: a bare serve, which runs on the C allocator",
    }
    result["targets"] = [
        {
            "target": f"held {turns}-turn conversation, store {'on' if r['store'] else 'off'}, {variant} (MB)",
            "measured": value / MB,
            "op": "<=",
            "threshold": TARGET_MB,
            "met": None if quick else value / MB <= TARGET_MB,
        }
        for r in result["runs"]
        for variant, value in (
            ("tracemalloc", r["in_process"]["tracemalloc_bytes_per_conversation"]),
            ("RSS", r["child_process"]["rss_bytes_per_conversation"]),
        )
    ]
    return clean_floats(result)


def table(result: dict[str, Any]) -> str:
    turns = result["config"]["turns"]
    rows = [[f"memory: {turns}-turn conversation", "JSON KB", "tracemalloc MB", "RSS MB", "walk MB"]]
    parts: list[list[Any]] = [["held by (walk, MB per conversation)", "store off", "store on"]]
    for r in result["runs"]:
        walk = r["in_process"]["walk_bytes_per_conversation"]
        rows.append(
            [
                f"store {'on' if r['store'] else 'off'}",
                fmt(r["in_process"]["json_bytes_per_conversation"] / 1024, 0),
                fmt(r["in_process"]["tracemalloc_bytes_per_conversation"] / MB, 3),
                fmt(r["child_process"]["rss_bytes_per_conversation"] / MB, 3),
                fmt(walk["total"] / MB, 3),
            ]
        )
    for key in result["runs"][0]["in_process"]["walk_bytes_per_conversation"]:
        parts.append([key, *(fmt(r["in_process"]["walk_bytes_per_conversation"][key] / MB, 3) for r in result["runs"])])
    sites = [["top allocation sites, store on (tracemalloc)", "MB per conversation"]]
    for site in result["runs"][-1]["in_process"]["top_allocation_sites"]:
        sites.append([site["site"], fmt(site["bytes_per_conversation"] / MB, 3)])
    return "\n\n".join(format_table(t) for t in (rows, parts, sites))
