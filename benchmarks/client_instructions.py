"""Instructions per turn of the `client` suite's clients, counted by valgrind (callgrind).

    python -m benchmarks.client_instructions [CHECKOUT ...] [--turns 100] [--warm-up 20] [--clients floor,floor_typed,wrap,wrap_async,wrap_stream]

The `client` suite's CPU times move with the load of a shared machine by more than most single
changes save; an instruction count does not. The suite's tool loop (every reply a
`function_call`, a ~4 KB tool output appended each turn) runs once per client against
`floor_server.py` (native speed, a child process) replaying the shim's frames of such a turn;
each client runs in its own process under `valgrind --tool=callgrind`, counted only over the
turns after the warm-up (started and stopped with `callgrind_control` between turns), every
thread of the process included (the sync client's loop thread). The count is divided by the
turns and shown as a ratio to the floor client's, and to the typed floor client's (`floor_typed`:
the floor client that also makes each event the SDK's typed event, the floor of a streamed call,
whose every event is handed out typed). Needs valgrind on PATH; ~1-2 minutes a client.

Each CHECKOUT (a directory holding a `ws_transport/`, default this one) has its `ws_transport`
clients counted in the same run, so a change is compared with its base side by side (e.g. a
`git archive` of `main` unpacked in /tmp): the loop, the floor server and the floor client are this
checkout's, only the product modules (`ws_transport`, `chat_mapping`, `server_shim`) are imported
from the checkout. The floor clients are counted once.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO

import orjson

from .client_cpu import FloorFrames, _call_id, capture, floor_client, wrap_async_client, wrap_client
from .common import Subprocess, free_port, shim_command
from .report import format_table

CLIENTS = ("floor", "floor_typed", "wrap", "wrap_async", "wrap_stream")
FLOORS = ("floor", "floor_typed")
"""Clients of this checkout only, counted once whatever the checkouts."""
HERE = Path(__file__).resolve().parent.parent
BOOT = """import sys
checkout, here = sys.argv[1], sys.argv[2]
sys.path[:0] = [checkout]
import chat_mapping, server_shim.demo, ws_transport  # the product under test, from the checkout
if not ws_transport.__file__.startswith(checkout + "/"):
    sys.exit(f"ws_transport was imported from {ws_transport.__file__}, not from {checkout}")
sys.path[0] = here
from benchmarks.client_instructions import main
sys.exit(main(sys.argv[3:]))
"""
"""The counted child: the checkout's product modules imported first, then this checkout's loop."""


def run_child(name: str, port: int, call_id: str, warm_up: int, turns: int) -> None:
    """In the counted process: the client's loop, stopping at the marks until the parent says go."""

    def gate(turn: int) -> None:
        if turn in (warm_up, warm_up + turns):
            print("mark", flush=True)
            sys.stdin.readline()

    base_url, ws_url = f"http://127.0.0.1:{port}/v1", f"ws://127.0.0.1:{port}/v1/responses"
    total = warm_up + turns + 1  # the mark after the last counted turn is a turn's start
    if name in FLOORS:
        asyncio.run(floor_client(ws_url, FloorFrames(call_id), total, before=gate, typed=name == "floor_typed"))
    elif name in ("wrap", "wrap_stream"):
        wrap_client(base_url, total, stream=name == "wrap_stream", before=gate)
    else:
        asyncio.run(wrap_async_client(base_url, total, before=gate))


def count(
    name: str, port: int, call_id: str, warm_up: int, turns: int, checkout: Path = HERE, keep: Path | None = None
) -> float:
    """Instructions per turn of client `name` with `checkout`'s product (its callgrind profile kept in `keep`)."""
    with tempfile.TemporaryDirectory(prefix="responses-ws-client-instructions-") as scratch:
        log = Path(scratch) / "valgrind.log"
        cmd = [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={scratch}/cg.out",
            f"--log-file={log}",
            sys.executable,
            "-c",
            BOOT,
            str(checkout),
            str(HERE),
            "--child",
            name,
            str(port),
            call_id,
            str(warm_up),
            str(turns),
        ]
        env = dict(os.environ, PYTHONHASHSEED="0")
        popen = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "text": True, "env": env, "cwd": scratch}
        with subprocess.Popen(cmd, **popen) as proc:  # type: ignore[call-overload]
            assert proc.stdin is not None and proc.stdout is not None
            for switch in ("on", "off"):
                _wait_mark(proc.stdout, log)
                subprocess.run(["callgrind_control", "-i", switch, str(proc.pid)], check=True, capture_output=True)
                proc.stdin.write("go\n")
                proc.stdin.flush()
            proc.wait(timeout=600)
        found = re.search(r"Collected : (\d+)", log.read_text(errors="replace"))
        if found is None:
            raise RuntimeError(f"no instruction count from valgrind for {name}: {log.read_text()[-2000:]}")
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            shutil.copy(Path(scratch) / "cg.out", keep / f"callgrind.{label(name, checkout)}.out")
    return int(found.group(1)) / turns


def _wait_mark(stdout: IO[str], log: Path) -> None:
    line = stdout.readline()
    if line.strip() != "mark":
        raise RuntimeError(f"the counted client stopped early: {line!r} {log.read_text(errors='replace')[-2000:]}")


def label(name: str, checkout: Path) -> str:
    """A client's name, with its checkout's when it is not this one."""
    return name if checkout == HERE or name in FLOORS else f"{name}@{checkout.name}"


def measure(
    clients: list[str],
    warm_up: int,
    turns: int,
    progress: Callable[[str], None],
    keep: Path | None = None,
    checkouts: list[Path] | None = None,
) -> dict[str, float]:
    """Capture a turn's frames from the shim, serve them from the floor server, count each client
    (the floor client once, the others once per checkout)."""
    with tempfile.TemporaryDirectory(prefix="responses-ws-client-instructions-") as scratch:
        shim_port, floor_port = free_port(), free_port()
        ready = f"http://127.0.0.1:{shim_port}/healthz"
        with Subprocess(shim_command(shim_port), ready_url=ready, log_path=Path(scratch) / "shim.log"):
            frames = asyncio.run(capture(f"ws://127.0.0.1:{shim_port}/v1/responses"))
        events = Path(scratch) / "events.json"
        events.write_bytes(orjson.dumps({"1": frames}))
        floor_cmd = [sys.executable, "-m", "benchmarks.floor_server", str(floor_port), str(events)]
        ready = f"http://127.0.0.1:{floor_port}/healthz"
        counts = {}
        with Subprocess(floor_cmd, ready_url=ready, log_path=Path(scratch) / "floor.log"):
            for checkout in checkouts or [HERE]:
                for name in clients:
                    if name in FLOORS and name in counts:
                        continue
                    key = label(name, checkout)
                    counts[key] = count(name, floor_port, _call_id(frames[-1]), warm_up, turns, checkout, keep)
                    progress(f"{key}: {counts[key]:,.0f} instructions per turn")
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.client_instructions", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--turns", type=int, default=100, help="counted turns, after the warm-up")
    parser.add_argument("--warm-up", type=int, default=20)
    parser.add_argument("checkouts", nargs="*", type=Path, default=[HERE], help="directories holding a ws_transport/")
    parser.add_argument("--clients", default=",".join(CLIENTS))
    parser.add_argument("--keep", type=Path, help="keep each client's callgrind profile in this folder")
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        name, port, call_id, warm_up, turns = args.child
        run_child(name, int(port), call_id, int(warm_up), int(turns))
        return 0
    clients = args.clients.split(",")
    checkouts = [checkout.resolve() for checkout in args.checkouts]
    names = {checkout.name for checkout in checkouts if checkout != HERE}
    if len(names) != len(checkouts) - (HERE in checkouts):
        parser.error("give the checkouts directory names of their own")
    counts = measure(
        clients, args.warm_up, args.turns, lambda line: print(line, file=sys.stderr, flush=True), args.keep, checkouts
    )
    floors = [name for name in FLOORS if counts.get(name)]
    rows = [["client", "instructions per turn", *(f"x {name}" for name in floors)]]
    for name, per_turn in counts.items():
        rows.append([name, f"{per_turn:,.0f}", *(f"{per_turn / counts[floor]:.2f}" for floor in floors)])
    print(format_table(rows))
    print(f"turns {args.warm_up + 1}-{args.warm_up + args.turns} of the loop, valgrind --tool=callgrind")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
