"""The shim's longest event-loop stall while one connection sends large frames, stage yields off and on.

    python -m benchmarks.loop_stall [--rounds 6] [--out docs/performance]

What another connection waits for, measured inside the server rather than by a client that shares
the machine's CPU: a ticker task on the server's loop (`sleep(0.001)` in a loop) records the
longest gap between its wake-ups while connection A sends three frames of one kind and waits for
each answer. Kinds as in the `load` suite's `big_frame`: one 3 MB text, 60,000 tiny items
(refused: `too_many_input_items`), 5,000 tiny items (accepted). The server runs in a child process
(`responses-ws serve`, simulated backend); signals switch `limits.is_large` off (thresholds out of
reach, as before large requests yielded) and on, alternating the order each round, so both
settings see the same machine load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson

from .common import Subprocess, free_port, machine_info
from .load import COMPLETED, FAILED, MODEL, _open

SERVER = """
import asyncio, signal, sys, time
import server_shim.limits as limits
from server_shim.cli import main
longest, started, out = [0.0], [False], sys.argv[2]
async def ticker():
    last = time.perf_counter()
    while True:
        await asyncio.sleep(0.001)
        now = time.perf_counter(); longest[0] = max(longest[0], now - last); last = now
def reset(*_):
    if not started[0]:
        asyncio.get_running_loop().create_task(ticker()); started[0] = True
    longest[0] = 0.0
def report(*_):
    with open(out, "a") as f: f.write(f"{longest[0] * 1000:.3f}\\n")
def split(on):
    limits.LARGE_ITEMS, limits.LARGE_FRAME_BYTES = (256, 256 * 1024) if on else (10**12, 10**15)
signal.signal(signal.SIGUSR1, reset)
signal.signal(signal.SIGUSR2, report)
signal.signal(signal.SIGHUP, lambda *_: split(True))
signal.signal(signal.SIGWINCH, lambda *_: split(False))
sys.argv = ["responses-ws", "--log-level", "WARNING", "serve", "--port", sys.argv[1]]
sys.exit(main())
"""


def frames() -> dict[str, bytes]:
    def frame(value: Any) -> bytes:
        return orjson.dumps(
            {"type": "response.create", "model": MODEL, "input": value, "store": False, "max_output_tokens": 1}
        )

    def items(count: int) -> list[dict[str, str]]:
        return [{"type": "message", "role": "user", "content": f"item {n}"} for n in range(count)]

    return {"text_3mb": frame("x" * 3_000_000), "items_60k": frame(items(60_000)), "items_5k": frame(items(5_000))}


async def measure(rounds: int, work: Path) -> dict[str, Any]:
    port, out = free_port(), work / "stalls.txt"
    kinds = frames()
    cmd = [sys.executable, "-c", SERVER, str(port), str(out)]
    keys: list[tuple[str, bool]] = []
    with Subprocess(cmd, ready_url=f"http://127.0.0.1:{port}/healthz", log_path=work / "server.log") as server:
        proc = server.proc
        assert proc is not None
        async with await _open(f"ws://127.0.0.1:{port}/v1/responses") as ws:
            for n in range(rounds):
                for on in (False, True) if n % 2 == 0 else (True, False):
                    proc.send_signal(signal.SIGHUP if on else signal.SIGWINCH)
                    for name, data in kinds.items():
                        proc.send_signal(signal.SIGUSR1)
                        await asyncio.sleep(0.2)
                        for _ in range(3):
                            await ws.send(data, text=True)
                            while not (await ws.recv(decode=False)).startswith((COMPLETED, *FAILED)):
                                pass
                        proc.send_signal(signal.SIGUSR2)
                        await asyncio.sleep(0.2)
                        keys.append((name, on))
    stalls = [float(line) for line in out.read_text().split()]
    result: dict[str, Any] = {"rounds": rounds, "machine": machine_info(), "load_average": os.getloadavg()}
    for name in kinds:
        for on in (False, True):
            values = [ms for (kind, split), ms in zip(keys, stalls, strict=True) if kind == name and split == on]
            result[f"{name}_{'split' if on else 'whole'}"] = {
                "median_ms": statistics.median(values),
                "min_ms": min(values),
                "max_ms": max(values),
                "n": len(values),
            }
    return result


def table(result: dict[str, Any]) -> str:
    lines = ["longest loop stall, ms (median / min / max)   stage yields off        stage yields on"]
    for name in ("text_3mb", "items_60k", "items_5k"):
        cells = [result[f"{name}_{mode}"] for mode in ("whole", "split")]
        lines.append(
            f"{name:45s}" + "".join(f"{c['median_ms']:6.1f} /{c['min_ms']:6.1f} /{c['max_ms']:6.1f}   " for c in cells)
        )
    lines.append(f"{result['rounds']} rounds; load average {result['load_average'][0]:.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.loop_stall", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--out", type=Path, help="write loop-stall.json there")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        result = asyncio.run(measure(args.rounds, Path(tmp)))
    print(table(result))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "loop-stall.json").write_text(json.dumps(result, indent=1))
        (args.out / "loop-stall.txt").write_text(table(result) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
