"""Instructions per chained WebSocket turn in the shim's process and in the floor server's, counted by valgrind (callgrind).

    python -m benchmarks.instructions [CHECKOUT ...] [--turns 300] [--tokens 1] [--connections 1] [--keep DIR]
    python -m benchmarks.instructions [CHECKOUT ...] --first --connections 128

CPU time on a shared machine moves with the load by more than most single changes save; an
instruction count does not. Each CHECKOUT (a directory holding a `server_shim/`, default this
one) is served by `responses-ws serve` under `valgrind --tool=callgrind`, instrumented only while
the turns run (after as many warm-up turns, and the trim that follows their connections' close): the
floor suite's lean client sends chained `response.create` frames, and the count over them is divided by
the turns. The usage ledger gets a file of its own per checkout, written by record count, never by time
(so the count does not depend on how long the run took): one batch of the warm-up's records, written
before the count starts, and one of the counted turns', inside it (the count ends once they are in the
file), so each turn's SQLite row is counted with it. Then the floor server (`benchmarks/floor_server.py`, replaying the frames
the first checkout's shim sent for such a turn) is counted the same way, and each checkout's
count is printed as a ratio to it: the deterministic counterpart of the floor suite's CPU ratio.
`--keep DIR` keeps each callgrind output (`DIR/shim-<i>.callgrind`, `DIR/floor.callgrind`) for `callgrind_annotate`.
Needs valgrind on PATH; a run takes about a minute.

`--first` counts what the `load` suite's start costs instead: `--connections` fresh connections, opened before the
count, send their first turn (unchained) all at once, then, once every one is answered, their second turn (chained
to it) all at once; each phase is counted into a callgrind dump of its own and divided by the connections, so a
connection's first turn is set against a chained turn of the same herd (the warm-up: two such herds; the ledger
written once per phase, inside its count). `--keep DIR` keeps
`DIR/shim-<i>.callgrind.first` and `.chained`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
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
from typing import Any

import orjson

from .common import Subprocess, free_port, shim_command
from .floor import Frames, _open, _turn, capture

WARM_UP_HERDS = 2
"""`--first`: herds run before the count (each one's phases a batch of usage records, written before the next)."""
AFTER_WARM_UP_S = 4.0
"""Wait after the warm-up connections close: the shim trims once per burst of closes (`trim.py`: a full
collection, the attribute cache emptied, a second after the last close), a cost per burst, not per turn."""
Server = Callable[[int, Path], list[str]]  # (port, scratch directory) -> the command serving on that port


class Counted:
    """A server started under callgrind, instrumentation off: `on()`, `dump()` (the events since the last dump or
    `on()`, into a file of their own), `off()`; on leaving, a clean exit and valgrind's total (`collected`)."""

    def __init__(self, server: Server, cwd: Path, env: dict[str, str], scratch: Path) -> None:
        self.port = free_port()
        self.url = f"ws://127.0.0.1:{self.port}/v1/responses"
        self.out = scratch / "cg.out"
        self.log = scratch / "serve.log"
        cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={self.out}"]
        self.proc = Subprocess(
            cmd + server(self.port, scratch),
            ready_url=f"http://127.0.0.1:{self.port}/healthz",
            log_path=self.log,
            env=dict(os.environ, PYTHONHASHSEED="0", **env),
            cwd=cwd,
            ready_timeout_s=300,
        )
        self.collected = 0

    def __enter__(self) -> Counted:
        self.proc.start()
        return self

    def _control(self, *flags: str) -> None:
        subprocess.run(["callgrind_control", *flags, str(self.proc.pid)], check=True, capture_output=True)

    def on(self) -> None:
        self._control("-i", "on")

    def dump(self) -> None:
        self._control("-d")

    def off(self) -> None:
        self._control("-i", "off")

    def dumped(self, n: int) -> int:
        """The events of the `n`th dump (from 1)."""
        found = re.search(r"^totals: (\d+)", Path(f"{self.out}.{n}").read_text(errors="replace"), re.MULTILINE)
        if found is None:
            raise RuntimeError(f"no totals in callgrind dump {n}")
        return int(found.group(1))

    def __exit__(self, *exc: object) -> None:
        proc = self.proc.proc
        assert proc is not None
        proc.send_signal(signal.SIGINT)  # a clean exit, after which valgrind prints its count
        try:
            proc.wait(timeout=600)
        finally:
            self.proc.stop()
        found = re.search(r"Collected : (\d+)", self.log.read_text(errors="replace"))
        if found is None and exc[0] is None:
            raise RuntimeError(f"no instruction count from valgrind: {self.proc.log_tail()}")
        self.collected = int(found.group(1)) if found else 0


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
    with tempfile.TemporaryDirectory(prefix="responses-ws-instructions-") as scratch:
        with Counted(server, cwd, env, Path(scratch)) as served:
            asyncio.run(drive(served.url, Frames(tokens), connections, [turns], lambda _: None))
            _after_warm_up(rows, connections * turns)

            def mark(phase: int) -> None:
                if phase == 0:
                    served.on()
                    return
                if rows is not None:
                    wait_for_rows(rows, 2 * connections * turns)
                served.off()

            asyncio.run(drive(served.url, Frames(tokens), connections, [turns], mark))
            if after is not None:
                after(served.url)
        if keep is not None:
            keep.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(served.out, keep)
    return served.collected / (connections * turns)


def _after_warm_up(rows: Callable[[], int] | None, written: int) -> None:
    """The trim after the warm-up's burst of closes, and its usage records all written, before the count starts."""
    time.sleep(AFTER_WARM_UP_S)  # the shim's after-burst trim (1 s after the warm-up's closes) runs first
    if rows is not None:
        wait_for_rows(rows, written)


async def drive(url: str, frames: Frames, connections: int, phases: list[int], mark: Callable[[int], None]) -> None:
    """`connections` connections, opened first (`mark(0)`); then in each phase `i`, every connection's next
    `phases[i]` chained turns, all connections at once (each one's first turn unchained; its chain goes on from
    phase to phase), and `mark(i + 1)` once every one is answered; then they close (after the last mark: the
    shim's trim after a burst of closes is never counted)."""
    sockets = await asyncio.gather(*(_open(url) for _ in range(connections)))
    chains: list[bytes | None] = [None] * connections

    async def chain(i: int, turns: int) -> None:
        for _ in range(turns):
            chains[i], _ = await _turn(sockets[i], frames.chained(chains[i]))

    try:
        mark(0)
        for phase, turns in enumerate(phases, 1):
            await asyncio.gather(*(chain(i, turns) for i in range(connections)))
            mark(phase)
    finally:
        await asyncio.gather(*(ws.close() for ws in sockets))


def count_first(
    server: Server,
    cwd: Path,
    *,
    connections: int,
    tokens: int,
    env: dict[str, str],
    keep: Path | None = None,
    after: Callable[[str], None] | None = None,
    rows: Callable[[], int] | None = None,
) -> tuple[float, float]:
    """Instructions per first turn on a fresh connection and per second (chained) turn, `connections` at once
    (`drive` in two phases of one turn: a herd), each phase counted into a callgrind dump of its own (copied
    to `keep`.first and `keep`.chained)."""
    warm_up = 2 * connections * WARM_UP_HERDS

    def rows_of(phase: int, before: int) -> None:
        if rows is not None:
            wait_for_rows(rows, before + phase * connections)

    with tempfile.TemporaryDirectory(prefix="responses-ws-instructions-") as scratch:
        with Counted(server, cwd, env, Path(scratch)) as served:
            for before in range(0, warm_up, 2 * connections):
                herd = functools.partial(rows_of, before=before)
                asyncio.run(drive(served.url, Frames(tokens), connections, [1, 1], herd))
            _after_warm_up(rows, warm_up)

            def mark(phase: int) -> None:
                rows_of(phase, warm_up)
                if phase == 0:
                    served.on()
                else:
                    served.dump()

            asyncio.run(drive(served.url, Frames(tokens), connections, [1, 1], mark))
            served.off()
            if after is not None:
                after(served.url)
        first, chained = served.dumped(1), served.dumped(2)
        if keep is not None:
            keep.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f"{served.out}.1", f"{keep}.first")
            shutil.copyfile(f"{served.out}.2", f"{keep}.chained")
    return first / connections, chained / connections


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
    parser.add_argument(
        "--first",
        action="store_true",
        help="count each connection's first turn (fresh, unchained, all --connections at once) and its second "
        "(chained) apart, instead of --turns chained turns",
    )
    parser.add_argument("--keep", type=Path, help="keep each callgrind output in this directory")
    args = parser.parse_args(argv)
    replies: dict[str, list[str]] = {}

    def remember(url: str) -> None:
        if not replies:
            replies.update(asyncio.run(capture(url)))

    def counted(server: Server, cwd: Path, env: dict[str, str], keep: Path | None, **more: Any) -> tuple[float, ...]:
        shape = {"connections": args.connections, "tokens": args.tokens, "env": env, "keep": keep, **more}
        if args.first:
            return count_first(server, cwd, **shape)
        return (count(server, cwd, turns=args.turns, **shape),)

    counts = {}
    with tempfile.TemporaryDirectory(prefix="responses-ws-instructions-") as scratch:
        for i, checkout in enumerate(args.checkouts):
            checkout = checkout.resolve()
            own = Path(scratch) / str(i)
            own.mkdir()
            keep = None if args.keep is None else args.keep / f"shim-{i}.callgrind"
            env = shim_env(checkout, own, _batch(args.connections, args.turns, args.first))
            counts[checkout] = counted(shim, checkout, env, keep, after=remember, rows=usage_rows(own / "usage.db"))
            print(f"{checkout}: {_per_turn(counts[checkout])}", flush=True)
        events = Path(scratch) / "floor-events.json"
        events.write_bytes(orjson.dumps(replies))

        def floor(port: int, _: Path) -> list[str]:
            return [sys.executable, "-m", "benchmarks.floor_server", str(port), str(events)]

        here = Path(__file__).resolve().parent.parent
        keep = None if args.keep is None else args.keep / "floor.callgrind"
        floor_counts = counted(floor, here, {"PYTHONPATH": str(here)}, keep)
    print(f"floor server: {_per_turn(floor_counts)}", flush=True)
    for checkout, per_turn in counts.items():
        ratios = ", ".join(f"{mine / theirs:.2f}x" for mine, theirs in zip(per_turn, floor_counts, strict=True))
        print(f"{checkout}: {ratios} the floor's instructions per turn", flush=True)
    return 0


def _batch(connections: int, turns: int, first: bool) -> int:
    """The usage ledger's records per write: all the records of a run of turns that nothing follows until they are
    written (the warm-up, the counted turns; with `--first`, each phase of a herd). A batch that a run's later
    records follow at once may take some of them too (the ledger writes what is queued when its flusher wakes, a
    few loop iterations after the batch filled), and leave a remainder that no batch writes."""
    return connections if first else connections * turns


def _per_turn(counts: tuple[float, ...]) -> str:
    if len(counts) == 1:
        return f"{counts[0]:,.0f} instructions per turn"
    first, chained = counts
    return (
        f"{first:,.0f} instructions per first turn, {chained:,.0f} per second (chained) turn ({first / chained:.2f}x)"
    )


if __name__ == "__main__":
    raise SystemExit(main())
