"""Instructions per chained WebSocket turn in the shim's process and in the floor server's, counted by valgrind (callgrind).

    python -m benchmarks.instructions [CHECKOUT ...] [--turns 300] [--tokens 1] [--connections 1] [--keep DIR]

CPU time on a shared machine moves with the load by more than most single changes save; an
instruction count does not. Each CHECKOUT (a directory holding a `server_shim/`, default this
one) is served by `responses-ws serve` under `valgrind --tool=callgrind`, instrumented only while
the turns run (after 20 warm-up turns and the trim that follows their connection's close): the
floor suite's lean client sends chained
`response.create` frames, and the count over them is divided by the turns. The usage ledger
gets a file of its own per checkout, written by record count, never by time (so the count does not
depend on how long the run took): a batch every `gcd(warm-up turns, counted turns)` records, the
warm-up's batches written before the count starts and the counted turns' rows inside it (the count
ends once they are all in the file), so each turn's SQLite row is counted with it. Then the floor server (`benchmarks/floor_server.py`, replaying the frames
the first checkout's shim sent for such a turn) is counted the same way, and each checkout's
count is printed as a ratio to it: the deterministic counterpart of the floor suite's CPU ratio.
`--keep DIR` keeps each callgrind output (`DIR/shim-<i>.callgrind`, `DIR/floor.callgrind`) for `callgrind_annotate`.
Needs valgrind on PATH; a run takes about a minute.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import orjson

from .common import Subprocess, free_port, shim_command
from .floor import Frames, capture, measure

WARM_UP_TURNS = 20
AFTER_WARM_UP_S = 4.0
"""Wait after the warm-up connections close: the shim trims once per burst of closes (`trim.py`: a full
collection, the attribute cache emptied, a second after the last close), a cost per burst, not per turn."""
Server = Callable[[int, Path], list[str]]  # (port, scratch directory) -> the command serving on that port


def count(
    server: Server,
    cwd: Path,
    *,
    connections: int,
    turns: int,
    tokens: int,
    env: dict[str, str],
    keep: Path | None = None,
    after: Callable[[str], None] | None = None,
    rows: Callable[[], int] | None = None,
) -> float:
    """Instructions per turn of the server `server` starts under callgrind (its output copied to `keep`).

    `after(url)` runs once the counted turns are done, before the server stops; `rows()`, when given,
    says how many usage records the server has written: the count starts once the warm-up's are all
    written and ends once the counted turns' are.
    """
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="responses-ws-instructions-") as scratch:
        out = Path(scratch) / "cg.out"
        cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]
        log = Path(scratch) / "serve.log"
        url = f"ws://127.0.0.1:{port}/v1/responses"
        ready = f"http://127.0.0.1:{port}/healthz"
        proc = Subprocess(
            cmd + server(port, Path(scratch)),
            ready_url=ready,
            log_path=log,
            env=dict(os.environ, PYTHONHASHSEED="0", **env),
            cwd=cwd,
            ready_timeout_s=300,
        )
        with proc:
            asyncio.run(measure(url, proc.pid, Frames(tokens), connections, WARM_UP_TURNS))
            time.sleep(AFTER_WARM_UP_S)  # the shim's after-burst trim (1 s after the warm-up's closes) runs first
            if rows is not None:
                wait_for_rows(rows, connections * WARM_UP_TURNS)
            subprocess.run(["callgrind_control", "-i", "on", str(proc.pid)], check=True, capture_output=True)
            asyncio.run(measure(url, proc.pid, Frames(tokens), connections, turns))
            if rows is not None:
                waited = wait_for_rows(rows, connections * (WARM_UP_TURNS + turns))
                if waited > 0.8:
                    print(f"the usage rows took {waited:.1f} s: the shim's after-close trim may be counted", flush=True)
            subprocess.run(["callgrind_control", "-i", "off", str(proc.pid)], check=True, capture_output=True)
            if after is not None:
                after(url)
            assert proc.proc is not None
            proc.proc.send_signal(signal.SIGINT)  # a clean exit, after which valgrind prints its count
            proc.proc.wait(timeout=600)
        found = re.search(r"Collected : (\d+)", log.read_text(errors="replace"))
        if found is None:
            raise RuntimeError(f"no instruction count from valgrind: {proc.log_tail()}")
        if keep is not None:
            keep.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(out, keep)
    return int(found.group(1)) / (connections * turns)


def wait_for_rows(rows: Callable[[], int], expected: int, timeout_s: float = 60.0) -> float:
    """Seconds until `rows()` reaches `expected`."""
    start = time.monotonic()
    while rows() < expected:
        if time.monotonic() - start > timeout_s:
            raise RuntimeError(f"the shim wrote {rows()} usage rows of {expected} in {timeout_s:.0f} s")
        time.sleep(0.01)
    return time.monotonic() - start


def usage_rows(path: Path) -> Callable[[], int]:
    def rows() -> int:
        if not path.exists():
            return 0
        with contextlib.closing(sqlite3.connect(path, timeout=30)) as db:
            try:
                return int(db.execute("SELECT count(*) FROM usage").fetchone()[0])
            except sqlite3.OperationalError:  # the table is not made yet
                return 0

    return rows


def shim(port: int, scratch: Path) -> list[str]:
    return shim_command(port)


def shim_env(checkout: Path, scratch: Path, batch: int) -> dict[str, str]:
    """The ledger written every `batch` records and never by time; Python's own allocator unless `PYTHONMALLOC`
    says otherwise: a bare `serve` would run itself again on the C allocator (`exec`), which valgrind does not
    follow, and the counts stay comparable with checkouts from before it did (`PYTHONMALLOC=malloc` counts that)."""
    return {
        "PYTHONMALLOC": os.environ.get("PYTHONMALLOC") or "pymalloc",
        "PYTHONPATH": str(checkout),
        "RESPONSES_WS_USAGE_PATH": str(scratch / "usage.db"),
        "RESPONSES_WS_USAGE_FLUSH_INTERVAL_S": "100000",
        "RESPONSES_WS_USAGE_FLUSH_RECORDS": str(batch),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.instructions", description=__doc__.split("\n")[0])
    parser.add_argument("checkouts", nargs="*", type=Path, default=[Path.cwd()])
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--tokens", type=int, default=1, help="output tokens per turn")
    parser.add_argument("--connections", type=int, default=1)
    parser.add_argument("--keep", type=Path, help="keep each callgrind output in this directory")
    args = parser.parse_args(argv)
    shape = {"connections": args.connections, "turns": args.turns, "tokens": args.tokens}
    replies: dict[str, list[str]] = {}
    batch = args.connections * math.gcd(WARM_UP_TURNS, args.turns)

    def remember(url: str) -> None:
        if not replies:
            replies.update(asyncio.run(capture(url)))

    counts = {}
    with tempfile.TemporaryDirectory(prefix="responses-ws-instructions-") as scratch:
        for i, checkout in enumerate(args.checkouts):
            checkout = checkout.resolve()
            own = Path(scratch) / str(i)
            own.mkdir()
            keep = None if args.keep is None else args.keep / f"shim-{i}.callgrind"
            env = shim_env(checkout, own, batch)
            rows = usage_rows(own / "usage.db")
            per_turn = count(shim, checkout, env=env, keep=keep, after=remember, rows=rows, **shape)
            counts[checkout] = per_turn
            print(f"{checkout}: {per_turn:,.0f} instructions per turn", flush=True)
        events = Path(scratch) / "floor-events.json"
        events.write_bytes(orjson.dumps(replies))

        def floor(port: int, _: Path) -> list[str]:
            return [sys.executable, "-m", "benchmarks.floor_server", str(port), str(events)]

        here = Path(__file__).resolve().parent.parent
        keep = None if args.keep is None else args.keep / "floor.callgrind"
        floor_per_turn = count(floor, here, env={"PYTHONPATH": str(here)}, keep=keep, **shape)
    print(f"floor server: {floor_per_turn:,.0f} instructions per turn", flush=True)
    for checkout, per_turn in counts.items():
        print(f"{checkout}: {per_turn / floor_per_turn:.2f}x the floor's instructions per turn", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
