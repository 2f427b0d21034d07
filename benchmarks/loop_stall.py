"""What one connection's large frames cost the others: the server's longest event-loop stall and a second
connection's turn latency, for three ways of handling a large request, in one run.

    python -m benchmarks.loop_stall [--rounds 3] [--attack-rounds 3] [--out docs/performance]

`--attack-rounds`: then the hostile review's frames of many JSON values (`attack_frames.py`), one per
phase, with the server switching between `before` (no `max_json_values` count, the depth walks always,
`model_dump` of forwarded fields) and `after` (the shipped code at the default bound), alternating order
each round; the same stall and B figures (`loop-stall-attack.txt`). `--rounds 0` runs those alone (~45 s).

Connection A sends two frames of one kind and waits for each answer. Kinds as in the `load`
suite's `big_frame`: one 3 MB text, 60,000 tiny items in 3.3 MB (refused: `too_many_input_items`,
which only the parse can tell; the server runs with `max_json_values` raised so that this frame is
parsed: with the default, 100,000, its 240,000 values are refused from the text before any parse),
5,000 tiny items (accepted). Meanwhile:

- a ticker task on the server's loop (`sleep(0.001)` in a loop) records the longest gap between its
  wake-ups: what any other connection waits for, measured inside the server;
- connection B, in its own process, runs back-to-back one-token turns the whole time: its turn
  latencies while A sends each kind (and while A sends nothing) give p50 / p99 / max as a client sees
  them (on this shared 2-core machine, B's own scheduling is in those figures too).

The server (`responses-ws serve`, simulated backend) runs in a child process and switches mode on a
signal, alternating the order each round so every mode sees the same machine load:
`yields_off` (no stage yields, `orjson` parse: before large requests yielded), `orjson` (stage
yields on, `orjson`'s one parse call: the previous release), `sliced` (stage yields on, the frame
parsed in slices, `json_slices`: now). Then, in this process, each frame's parse alone: CPU time of
`orjson.loads` and of the sliced parse, and the sliced parse's longest step (CPU time).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from server_shim import json_slices

from .attack_frames import ATTACK_KINDS, ATTACK_MODES, SERVER_MODES, attack_frames
from .common import Subprocess, free_port, machine_info
from .load import COMPLETED, FAILED, MODEL, _open

MODES = ("yields_off", "orjson", "sliced")
FRAMES = 2  # per phase
KINDS = ("text_3mb", "items_60k", "items_5k")

SERVER = """
import asyncio, signal, sys, time
import server_shim.json_slices as json_slices
import server_shim.limits as limits
from server_shim.cli import main
longest, started, out, mode_file = [0.0, 0.0], [False], sys.argv[2], sys.argv[3]
sliced = json_slices.parse_in_slices
async def ticker():
    last, last_cpu = time.perf_counter(), time.thread_time()
    while True:
        await asyncio.sleep(0.001)
        now, cpu = time.perf_counter(), time.thread_time()
        longest[0], longest[1] = max(longest[0], now - last), max(longest[1], cpu - last_cpu)
        last, last_cpu = now, cpu
def reset(*_):
    if not started[0]:
        asyncio.get_running_loop().create_task(ticker()); started[0] = True
    longest[:] = [0.0, 0.0]
def report(*_):
    with open(out, "a") as f: f.write(f"{longest[0] * 1000:.3f} {longest[1] * 1000:.3f}\\n")
def switch(*_):
    mode = open(mode_file).read().strip()
    walks(mode)
    mode = "sliced" if mode in ("before", "after") else mode
    yields = mode != "yields_off"
    limits.LARGE_ITEMS, limits.LARGE_FRAME_BYTES = (256, 256 * 1024) if yields else (10**12, 10**15)
    json_slices.parse_in_slices = sliced if mode == "sliced" else (lambda nbytes, threshold: False)
MODES_HERE
signal.signal(signal.SIGUSR1, reset)
signal.signal(signal.SIGUSR2, report)
signal.signal(signal.SIGHUP, switch)
sys.argv = ["responses-ws", "--log-level", "WARNING", "serve", "--port", sys.argv[1]]
sys.exit(main())
"""

SECOND = """
import asyncio, os, sys, time
import orjson
from benchmarks.load import COMPLETED, FAILED, MODEL, _open
async def run(url, out, stop):
    frame = orjson.dumps({"type": "response.create", "model": MODEL, "input": "hi", "store": False,
                          "max_output_tokens": 1})
    async with await _open(url) as ws:
        with open(out, "w", buffering=1) as f:
            while not os.path.exists(stop):
                sent = time.monotonic()
                await ws.send(frame, text=True)
                while not (await ws.recv(decode=False)).startswith((COMPLETED, *FAILED)):
                    pass
                f.write(f"{sent} {time.monotonic()}\\n")
asyncio.run(run(*sys.argv[1:]))
"""


def frames() -> dict[str, bytes]:
    def frame(value: Any) -> bytes:
        return orjson.dumps(
            {"type": "response.create", "model": MODEL, "input": value, "store": False, "max_output_tokens": 1}
        )

    def items(count: int) -> list[dict[str, str]]:
        return [{"type": "message", "role": "user", "content": f"item {n}"} for n in range(count)]

    return {"text_3mb": frame("x" * 3_000_000), "items_60k": frame(items(60_000)), "items_5k": frame(items(5_000))}


async def measure(rounds: int, work: Path, attack_rounds: int = 0) -> dict[str, Any]:
    """`rounds` of the large frames in the three modes, then `attack_rounds` of the attack frames before
    and after `max_json_values` (one frame per phase: before, the largest holds the loop for seconds)."""
    port, out, mode_file, stop = free_port(), work / "stalls.txt", work / "mode", work / "stop"
    kinds, attacks = frames(), attack_frames()
    phases: list[tuple[str, str, float, float]] = []  # kind, mode, start, end (monotonic)
    cmd = [sys.executable, "-c", SERVER.replace("MODES_HERE", SERVER_MODES), str(port), str(out), str(mode_file)]
    url = f"ws://127.0.0.1:{port}/v1/responses"
    env = {**_env(), "RESPONSES_WS_MAX_JSON_VALUES": str(10**7)}  # the 60,000 items parsed, as in the issue
    with Subprocess(cmd, ready_url=f"http://127.0.0.1:{port}/healthz", log_path=work / "server.log", env=env) as server:
        proc = server.proc
        assert proc is not None
        second = await asyncio.create_subprocess_exec(
            sys.executable, "-c", SECOND, url, str(work / "second.txt"), str(stop), env=_env()
        )
        try:
            async with await _open(url) as ws:
                await _first_turn(work / "second.txt", second)
                for n in range(rounds):
                    order = MODES if n % 2 == 0 else MODES[::-1]
                    phases.append(("alone", "-", *(await _alone())))
                    for mode in order:
                        mode_file.write_text(mode)
                        proc.send_signal(signal.SIGHUP)
                        for name, data in kinds.items():
                            phases.append((name, mode, *(await _phase(proc, ws, data))))
                split = len(phases)
                for n in range(attack_rounds):
                    phases.append(("alone", "-", *(await _alone())))
                    for mode in ATTACK_MODES if n % 2 == 0 else ATTACK_MODES[::-1]:
                        mode_file.write_text(mode)
                        proc.send_signal(signal.SIGHUP)
                        for name, data in attacks.items():
                            phases.append((name, mode, *(await _phase(proc, ws, data, frames=1))))
        finally:
            stop.write_text("")
            await asyncio.wait_for(second.wait(), 30)
    stalls = iter(tuple(map(float, line.split())) for line in out.read_text().splitlines())
    turns = [tuple(map(float, line.split())) for line in (work / "second.txt").read_text().splitlines()]
    result = _summary(rounds, phases[:split], stalls, turns, KINDS, MODES) if rounds else {}
    if rounds:
        result["parse"] = {name: parse_cost(data) for name, data in frames().items()}
    if attack_rounds:
        result["attack"] = _summary(attack_rounds, phases[split:], stalls, turns, ATTACK_KINDS, ATTACK_MODES)
    return result


def _env() -> dict[str, str]:
    root = str(Path(__file__).resolve().parent.parent)
    return {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}


async def _first_turn(path: Path, second: Any, timeout_s: float = 60.0) -> None:
    """Wait until B has completed a turn (its process starts and connects in its own time)."""
    deadline = time.monotonic() + timeout_s
    while not (path.exists() and path.read_text().strip()):
        if second.returncode is not None or time.monotonic() > deadline:
            raise RuntimeError("the second connection did not complete a turn")
        await asyncio.sleep(0.1)


async def _alone() -> tuple[float, float]:
    start = time.monotonic()
    await asyncio.sleep(1.0)
    return start, time.monotonic()


async def _phase(proc: Any, ws: Any, data: bytes, frames: int = FRAMES) -> tuple[float, float]:
    proc.send_signal(signal.SIGUSR1)
    await asyncio.sleep(0.2)
    start = time.monotonic()
    for _ in range(frames):
        await ws.send(data, text=True)
        while not (await ws.recv(decode=False)).startswith((COMPLETED, *FAILED)):
            pass
    end = time.monotonic()
    proc.send_signal(signal.SIGUSR2)
    await asyncio.sleep(0.2)
    return start, end


def _summary(
    rounds: int, phases: list[Any], stalls: Any, turns: list[tuple[float, ...]], kinds: Any, modes: Any
) -> dict[str, Any]:
    """Stalls and B's turns by kind and mode; `stalls` is the server's report, one line per phase in order
    (an iterator shared by the calls, taken in the order the phases ran)."""
    result: dict[str, Any] = {
        "rounds": rounds,
        "machine": machine_info(),
        "load_average": os.getloadavg(),
        "stall_ms": {kind: {mode: [] for mode in modes} for kind in kinds},
        "stall_cpu_ms": {kind: {mode: [] for mode in modes} for kind in kinds},
        "second_ms": {"alone": [], **{kind: {mode: [] for mode in modes} for kind in kinds}},
    }
    for kind, mode, start, end in phases:
        latencies = [(done - sent) * 1000 for sent, done in turns if start <= sent <= end]
        if kind == "alone":
            result["second_ms"]["alone"] += latencies
            continue
        wall, cpu = next(stalls)
        result["stall_ms"][kind][mode].append(wall)
        result["stall_cpu_ms"][kind][mode].append(cpu)
        result["second_ms"][kind][mode] += latencies
    for name in ("stall", "stall_cpu"):
        by_kind = result.pop(f"{name}_ms")
        result[name] = {k: {m: _spread(v) for m, v in by_mode.items()} for k, by_mode in by_kind.items()}
    second = result.pop("second_ms")
    result["second"] = {"alone": _percentiles(second.pop("alone"))}
    result["second"].update({k: {m: _percentiles(v) for m, v in by_mode.items()} for k, by_mode in second.items()})
    return result


def _spread(values: list[float]) -> dict[str, Any]:
    return {"median_ms": statistics.median(values), "min_ms": min(values), "max_ms": max(values), "n": len(values)}


def _percentiles(values: list[float]) -> dict[str, Any]:
    ordered = sorted(values) or [0.0]  # (B always completes turns in a phase; 0 would show it did not)
    return {
        "p50_ms": ordered[int(0.5 * len(ordered))],
        "p99_ms": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
        "max_ms": ordered[-1],
        "turns": len(values),
    }


def parse_cost(data: bytes, repeat: int = 5) -> dict[str, Any]:
    """CPU time (ms, median of `repeat`, garbage collector off) of `orjson.loads` and of the sliced parse run
    through, and the sliced parse's number of steps and longest step (what one step holds the loop for)."""
    whole, sliced, longest, steps = [], [], [], 0
    gc.disable()  # the parse's own cost: collections are the server's (its thresholds), seen in the stalls
    for _ in range(repeat):
        start = time.thread_time()
        value = orjson.loads(data)
        whole.append(time.thread_time() - start)
        del value  # (freed outside the timing, as the sliced parse's value below)
        walk, steps, step_max, begun = json_slices.parse_steps(data), 0, 0.0, time.thread_time()
        while True:
            step = time.thread_time()
            try:
                next(walk)
            except StopIteration as done:
                value = done.value
                step_max = max(step_max, time.thread_time() - step)
                break
            step_max = max(step_max, time.thread_time() - step)
            steps += 1
        sliced.append(time.thread_time() - begun)
        longest.append(step_max)
        del value
    gc.enable()
    return {
        "orjson_cpu_ms": statistics.median(whole) * 1000,
        "sliced_cpu_ms": statistics.median(sliced) * 1000,
        "steps": steps,
        "longest_step_cpu_ms": statistics.median(longest) * 1000,
    }


def table(result: dict[str, Any], kinds: Any = KINDS, modes: Any = MODES) -> str:
    def ms(value: float) -> str:
        return f"{value:6.1f}"

    lines = [f"{'':30s}" + "".join(f"{mode:>27s}" for mode in modes)]
    for name, what in (("stall", "wall clock"), ("stall_cpu", "the loop thread's CPU time")):
        lines.append(f"longest loop stall, {what}, ms (median / min / max of {result['rounds']})")
        for kind in kinds:
            cells = [result[name][kind][mode] for mode in modes]
            lines.append(
                f"{kind:30s}" + "".join(f"{ms(c['median_ms'])} /{ms(c['min_ms'])} /{ms(c['max_ms'])}   " for c in cells)
            )
    lines.append("second connection's turns, ms (p50 / p99 / max, turns)")
    alone = result["second"]["alone"]
    lines.append(f"{'alone':30s}{ms(alone['p50_ms'])} /{ms(alone['p99_ms'])} /{ms(alone['max_ms'])}  {alone['turns']}")
    for kind in kinds:
        cells = [result["second"][kind][mode] for mode in modes]
        lines.append(
            f"{kind:30s}"
            + "".join(f"{ms(c['p50_ms'])} /{ms(c['p99_ms'])} /{ms(c['max_ms'])} {c['turns']:4d} " for c in cells)
        )
    if "parse" in result:
        lines.append("parse alone, CPU ms (median of 5): orjson / sliced, steps, longest step")
        for kind in kinds:
            p = result["parse"][kind]
            lines.append(
                f"{kind:30s}{ms(p['orjson_cpu_ms'])} /{ms(p['sliced_cpu_ms'])}   {p['steps']:4d} steps, "
                f"longest {p['longest_step_cpu_ms']:.2f}"
            )
    lines.append(f"load average {result['load_average'][0]:.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.loop_stall", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the large frames (0: none)")
    parser.add_argument(
        "--attack-rounds",
        type=int,
        default=2,
        help="rounds of the attack frames, before/after max_json_values (0: none)",
    )
    parser.add_argument("--out", type=Path, help="write loop-stall.json/.txt and loop-stall-attack.json/.txt there")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        result = asyncio.run(measure(args.rounds, Path(tmp), args.attack_rounds))
    attack = result.pop("attack", None)
    outputs = []
    if args.rounds:
        outputs.append(("loop-stall", result, table(result)))
    if attack is not None:
        outputs.append(("loop-stall-attack", attack, table(attack, ATTACK_KINDS, ATTACK_MODES)))
    for name, values, text in outputs:
        print(text)
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / f"{name}.json").write_text(json.dumps(values, indent=1))
            (args.out / f"{name}.txt").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
