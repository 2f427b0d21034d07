"""Suite `client`: the client's CPU per turn of a growing tool loop, as a ratio to a floor client.

One tool-calling loop (every reply is a `function_call`, every turn appends a ~4 KB
`function_call_output`, so the history grows by ~4 KB a turn) is run by each client in turn,
against one floor server in a child process (`floor_server.py`: it answers every request with the
exact frames the shim sent for such a turn, captured first, so every client reads the same events
and no server work varies between them):

- `floor`: raw `websockets`, a pre-encoded frame per turn (the previous response id spliced in),
  no parsing beyond finding and decoding the terminal event: what the wire costs a client;
- `floor_typed`: the floor client that also makes each event the SDK's typed event, by the cheapest
  route known (pydantic-core fed the frame's JSON text, every union of the SDK's event types tagged on
  `type` as `ws_transport.parsing.tagged_schema` tags them; pydantic's plain adapter of the union costs
  ~6x more): what any client handing out typed events pays, the floor for `wrap_stream`;
- `wrap`: `ws_transport.wrap(OpenAI())`, non-streaming `responses.create` with the whole history;
- `wrap_async`: the same with `AsyncOpenAI`;
- `wrap_stream`: `wrap(OpenAI())`, `stream=True`, the SDK's typed events read to `response.completed`;
- `connect`: the SDK's own `OpenAI().responses.connect()`, `previous_response_id` + the new items,
  typed events read to `response.completed`;
- `http`: the plain `OpenAI()` client over HTTP, the whole history every turn.

The SDK clients keep the SDK's output objects in their history, as the SDK's examples do.
Client CPU per turn is `time.process_time()` (every thread of this process: the sync client's
loop thread included) around the call, not wall time: the machine is shared. Figures are the
median over the five turns ending at turns 10, 50 and 100, over the repeats; ratios are to the
floor client's figure at the same turn.
"""

from __future__ import annotations

import asyncio
import functools
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pydantic
from openai import AsyncOpenAI, OpenAI
from openai.types.responses import ResponseCompletedEvent, ResponseStreamEvent
from pydantic_core import SchemaValidator
from websockets.asyncio.client import connect

import ws_transport
from server_shim.demo import TOOLS, follow_up, next_user_message, tool_result
from ws_transport.parsing import tagged_schema

from .common import Subprocess, clean_floats, free_port, machine_info, progress, shim_command, summarize
from .floor import COMPLETED
from .report import fmt, format_table

MODEL = "simulated-1"
PAYLOAD = 4000
MARKS = (10, 50, 100)
WINDOW = 5
CLIENTS = ("floor", "floor_typed", "wrap", "wrap_async", "wrap_stream", "connect", "http")
TARGET_RATIO = 1.5
FLAT_RATIO = 1.25
cpu = time.process_time
Hook = Callable[[int], None] | None
"""Called before each turn with its index (`client_instructions` starts and stops its count there)."""


def request_fields() -> dict[str, Any]:
    return {"model": MODEL, "tools": TOOLS, "store": False}


async def capture(url: str) -> list[str]:
    """The frames the shim sends for the first turn of the loop (a `function_call`)."""
    async with connect(url, max_size=None, compression=None, ping_interval=None) as ws:
        frame = {"type": "response.create", **request_fields(), "input": [next_user_message(0)]}
        await ws.send(orjson.dumps(frame).decode())
        frames: list[str] = []
        while True:
            raw = await ws.recv(decode=True)
            frames.append(raw)
            if raw.startswith(COMPLETED.decode()):
                return frames
            if '"type":"error"' in raw[:40] or '"response.failed"' in raw[:40]:
                raise RuntimeError(f"capture failed: {raw[:300]}")


class FloorFrames:
    """A chained frame with the new items already encoded: only the previous response id is spliced in."""

    def __init__(self, call_id: str) -> None:
        items = [{"type": "function_call_output", "call_id": call_id, "output": tool_result(1, PAYLOAD)}]
        head = {"type": "response.create", **request_fields()}
        self.first = orjson.dumps({**head, "input": [next_user_message(0)]})
        self.prefix = orjson.dumps(head)[:-1] + b',"previous_response_id":"'
        self.suffix = b'","input":' + orjson.dumps(items) + b"}"

    def chained(self, previous: bytes | None) -> bytes:
        return self.first if previous is None else self.prefix + previous + self.suffix


async def floor_client(
    url: str, frames: FloorFrames, turns: int, before: Hook = None, *, typed: bool = False
) -> list[float]:
    """The floor client; `typed`: each event also validated into the SDK's typed event (`floor_typed`)."""
    validate = typed_events() if typed else None
    samples = []
    async with connect(url, max_size=None, compression=None, ping_interval=None) as ws:
        previous = None
        for turn in range(turns):
            if before is not None:
                before(turn)
            start = cpu()
            await ws.send(frames.chained(previous), text=True)
            while True:
                raw = await ws.recv(decode=False)
                if validate is None:
                    if raw.startswith(COMPLETED):
                        previous = orjson.loads(raw)["response"]["id"].encode()
                        break
                elif isinstance(event := validate(raw), ResponseCompletedEvent):
                    previous = event.response.id.encode()
                    break
            samples.append(cpu() - start)
    return samples


def typed_events() -> Callable[[bytes], Any]:
    """The SDK's typed stream event of a frame's JSON text: pydantic-core, one variant tried per union."""
    validator = SchemaValidator(tagged_schema(pydantic.TypeAdapter(ResponseStreamEvent).core_schema))
    return functools.partial(validator.validate_json, strict=True)


def wrap_client(base_url: str, turns: int, *, stream: bool, before: Hook = None) -> list[float]:
    samples = []
    with ws_transport.wrap(OpenAI(base_url=base_url, api_key="bench", max_retries=0)) as client:
        history: list[Any] = [next_user_message(0)]
        for turn in range(turns):
            if before is not None:
                before(turn)
            start = cpu()
            if stream:
                with client.responses.create(input=history, stream=True, **request_fields()) as events:
                    response = next(e.response for e in events if e.type == "response.completed")
            else:
                response = client.responses.create(input=history, **request_fields())
            samples.append(cpu() - start)
            history += [*response.output, *follow_up(response.output, turn + 1, PAYLOAD)]
    return samples


async def wrap_async_client(base_url: str, turns: int, before: Hook = None) -> list[float]:
    samples = []
    async with ws_transport.wrap(AsyncOpenAI(base_url=base_url, api_key="bench", max_retries=0)) as client:
        history: list[Any] = [next_user_message(0)]
        for turn in range(turns):
            if before is not None:
                before(turn)
            start = cpu()
            response = await client.responses.create(input=history, **request_fields())
            samples.append(cpu() - start)
            history += [*response.output, *follow_up(response.output, turn + 1, PAYLOAD)]
    return samples


def connect_client(base_url: str, turns: int) -> list[float]:
    samples = []
    with (
        OpenAI(base_url=base_url, api_key="bench", max_retries=0) as client,
        client.responses.connect() as conn,
    ):
        new_items: list[Any] = [next_user_message(0)]
        previous: str | None = None
        for turn in range(turns):
            start = cpu()
            conn.response.create(input=new_items, previous_response_id=previous, **request_fields())
            response = next(e.response for e in conn if e.type == "response.completed")
            samples.append(cpu() - start)
            previous, new_items = response.id, follow_up(response.output, turn + 1, PAYLOAD)
    return samples


def http_client(base_url: str, turns: int) -> list[float]:
    samples = []
    with OpenAI(base_url=base_url, api_key="bench", max_retries=0) as client:
        history: list[Any] = [next_user_message(0)]
        for turn in range(turns):
            start = cpu()
            response = client.responses.create(input=history, **request_fields())
            samples.append(cpu() - start)
            history += [*response.output, *follow_up(response.output, turn + 1, PAYLOAD)]
    return samples


def runners(port: int, call_id: str, turns: int) -> dict[str, Callable[[], list[float]]]:
    base_url = f"http://127.0.0.1:{port}/v1"
    ws_url = f"ws://127.0.0.1:{port}/v1/responses"
    return {
        "floor": lambda: asyncio.run(floor_client(ws_url, FloorFrames(call_id), turns)),
        "floor_typed": lambda: asyncio.run(floor_client(ws_url, FloorFrames(call_id), turns, typed=True)),
        "wrap": lambda: wrap_client(base_url, turns, stream=False),
        "wrap_async": lambda: asyncio.run(wrap_async_client(base_url, turns)),
        "wrap_stream": lambda: wrap_client(base_url, turns, stream=True),
        "connect": lambda: connect_client(base_url, turns),
        "http": lambda: http_client(base_url, turns),
    }


def _at(samples: list[list[float]], mark: int) -> list[float]:
    return [s * 1000 for run in samples for s in run[max(0, mark - WINDOW) : mark]]


def _measure(out_dir: Path, turns: int, repeats: int) -> dict[str, Any]:
    logs = out_dir / "logs"
    shim_port, floor_port = free_port(), free_port()
    with Subprocess(
        shim_command(shim_port), ready_url=f"http://127.0.0.1:{shim_port}/healthz", log_path=logs / "client-shim.log"
    ):
        frames = asyncio.run(capture(f"ws://127.0.0.1:{shim_port}/v1/responses"))
    events_path = out_dir / "client-events.json"
    events_path.write_bytes(orjson.dumps({"1": frames}))
    call_id = _call_id(frames[-1])
    floor_cmd = [sys.executable, "-m", "benchmarks.floor_server", str(floor_port), str(events_path)]
    samples: dict[str, list[list[float]]] = {name: [] for name in CLIENTS}
    with Subprocess(floor_cmd, ready_url=f"http://127.0.0.1:{floor_port}/healthz", log_path=logs / "client-floor.log"):
        run = runners(floor_port, call_id, turns)
        warm = runners(floor_port, call_id, 3)
        for name in CLIENTS:
            warm[name]()
        for repeat in range(repeats):
            order = CLIENTS if repeat % 2 == 0 else CLIENTS[::-1]
            for name in order:
                samples[name].append(run[name]())
            progress(f"client: repeat {repeat + 1}/{repeats} done")
    return {"events_per_turn": len(frames), "samples": samples}


def _call_id(completed: str) -> str:
    match = re.search(r'"call_id":"([^"]+)"', completed)
    if match is None:
        raise RuntimeError("the captured turn has no function_call: the loop needs one")
    return match.group(1)


def run(out_dir: Path, *, quick: bool = False, repeats: int | None = None) -> dict[str, Any]:
    turns = 12 if quick else max(MARKS)
    repeats = repeats or (1 if quick else 3)
    marks = [m for m in MARKS if m <= turns]
    measured = _measure(out_dir, turns, repeats)
    samples = measured["samples"]
    clients: dict[str, Any] = {}
    for name in CLIENTS:
        clients[name] = {str(m): summarize(_at(samples[name], m)) for m in marks}
    for name in CLIENTS:
        for m in marks:
            floor, this = clients["floor"][str(m)]["median"], clients[name][str(m)]["median"]
            clients[name][str(m)]["x_floor"] = this / floor if floor and this is not None else None
    result: dict[str, Any] = {
        "suite": "client",
        "machine": machine_info(),
        "events_per_turn": measured["events_per_turn"],
        "clients": clients,
        "config": {
            "quick": quick,
            "turns": turns,
            "repeats": repeats,
            "marks": marks,
            "window": WINDOW,
            "tool_result_bytes": PAYLOAD,
            "server": "benchmarks/floor_server.py replaying the shim's frames of one function_call turn",
            "cpu": "time.process_time() of the client process around each call (all its threads), not wall time",
        },
    }
    result["targets"] = _targets(clients, marks)
    return clean_floats(result)


def _targets(clients: dict[str, Any], marks: list[int]) -> list[dict[str, Any]]:
    last, first = str(marks[-1]), str(marks[0])
    targets = []
    for name in ("wrap", "wrap_async"):
        ratio = clients[name][last]["x_floor"]
        targets.append(
            {
                "target": f"{name}: client CPU per turn at turn {last} within {TARGET_RATIO}x the floor client",
                "measured": ratio,
                "op": "<=",
                "threshold": TARGET_RATIO,
                "met": None if ratio is None else ratio <= TARGET_RATIO,
            }
        )
        late, early = clients[name][last]["median"], clients[name][first]["median"]
        growth = late / early if late is not None and early else None
        targets.append(
            {
                "target": f"{name}: flat in history length (turn {last} / turn {first})",
                "measured": growth,
                "op": "<=",
                "threshold": FLAT_RATIO,
                "met": None if growth is None else growth <= FLAT_RATIO,
            }
        )
    stream, typed = clients["wrap_stream"][last]["median"], clients["floor_typed"][last]["median"]
    ratio = stream / typed if stream is not None and typed else None
    targets.append(
        {
            "target": f"wrap_stream: client CPU per turn at turn {last} within {TARGET_RATIO}x the typed floor client "
            "(floor_typed: every event made the SDK's typed event, as a stream hands each on)",
            "measured": ratio,
            "op": "<=",
            "threshold": TARGET_RATIO,
            "met": None if ratio is None else ratio <= TARGET_RATIO,
        }
    )
    return targets


def table(result: dict[str, Any]) -> str:
    marks = result["config"]["marks"]
    rows = [["client: client CPU ms/turn", *(f"turn {m}" for m in marks), *(f"x floor @{m}" for m in marks)]]
    for name, by_mark in result["clients"].items():
        rows.append(
            [
                name,
                *(fmt(by_mark[str(m)]["median"], 3) for m in marks),
                *(fmt(by_mark[str(m)]["x_floor"], 2) for m in marks),
            ]
        )
    return format_table(rows) + f"\nevents per turn: {result['events_per_turn']}"
