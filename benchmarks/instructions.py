"""Instructions per chained WebSocket turn in the shim's process, counted by valgrind (callgrind).

    python -m benchmarks.instructions [CHECKOUT ...] [--turns 300] [--tokens 1] [--connections 1]

CPU time on a shared machine moves with the load by more than most single changes save; an
instruction count does not. Each CHECKOUT (a directory holding a `server_shim/`, default this
one) is served by `responses-ws serve` under `valgrind --tool=callgrind`, instrumented only while
the turns run (after 20 warm-up turns): the floor suite's lean client sends chained
`response.create` frames, and the count over them is divided by the turns. The usage ledger
gets a file of its own per checkout and is flushed only at exit, so the count does not depend on
how long the run took. Needs valgrind on PATH; a run takes about 30 s.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import subprocess
import tempfile
from pathlib import Path

from .common import Subprocess, free_port, shim_command
from .floor import Frames, measure

WARM_UP_TURNS = 20


def count(checkout: Path, *, connections: int, turns: int, tokens: int) -> float:
    """Instructions per turn of the shim served from `checkout`."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="responses-ws-instructions-") as scratch:
        env = dict(
            os.environ,
            PYTHONPATH=str(checkout),
            PYTHONHASHSEED="0",
            RESPONSES_WS_USAGE_PATH=str(Path(scratch) / "usage.db"),
            RESPONSES_WS_USAGE_FLUSH_INTERVAL_S="100000",
        )
        cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={scratch}/cg.out"]
        log = Path(scratch) / "serve.log"
        url = f"ws://127.0.0.1:{port}/v1/responses"
        ready = f"http://127.0.0.1:{port}/healthz"
        shim = Subprocess(
            cmd + shim_command(port), ready_url=ready, log_path=log, env=env, cwd=checkout, ready_timeout_s=300
        )
        with shim:
            asyncio.run(measure(url, shim.pid, Frames(tokens), connections, WARM_UP_TURNS))
            subprocess.run(["callgrind_control", "-i", "on", str(shim.pid)], check=True, capture_output=True)
            asyncio.run(measure(url, shim.pid, Frames(tokens), connections, turns))
            subprocess.run(["callgrind_control", "-i", "off", str(shim.pid)], check=True, capture_output=True)
            assert shim.proc is not None
            shim.proc.send_signal(signal.SIGINT)  # a clean exit, after which valgrind prints its count
            shim.proc.wait(timeout=600)
        found = re.search(r"Collected : (\d+)", log.read_text(errors="replace"))
        if found is None:
            raise RuntimeError(f"no instruction count from valgrind: {shim.log_tail()}")
    return int(found.group(1)) / (connections * turns)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.instructions", description=__doc__.split("\n")[0])
    parser.add_argument("checkouts", nargs="*", type=Path, default=[Path.cwd()])
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--tokens", type=int, default=1, help="output tokens per turn")
    parser.add_argument("--connections", type=int, default=1)
    args = parser.parse_args(argv)
    for checkout in args.checkouts:
        per_turn = count(checkout.resolve(), connections=args.connections, turns=args.turns, tokens=args.tokens)
        print(f"{checkout}: {per_turn:,.0f} instructions per turn", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
