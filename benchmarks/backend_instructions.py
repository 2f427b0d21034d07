"""Instructions per chained turn in the router and the simulated backend alone, counted by valgrind (callgrind).

    python -m benchmarks.backend_instructions [CHECKOUT ...] [--turns 500] [--modes router,simulated,null,driver]
        [--keep DIR]
    python -m benchmarks.backend_instructions [CHECKOUT ...] --modes chat

`benchmarks.instructions` counts a whole WebSocket turn, whose count moves by ~10-30k between
runs on a loaded machine (how many frames one read returns, timers that fire): more than a
change to one stage saves. This counts only `Router.stream` over a `SimulatedBackend` (mode
`router`), the simulator alone (`simulated`), or the router over a backend that yields the same
three deltas and does nothing else (`null`), or that backend alone (`driver`: what the loop that
drives them costs, to subtract), in one process with no I/O (mode `chat`: the router over an
`openai_compatible` deployment streaming from `benchmarks.chat_server` in a process of its own, not
counted: the chat backend's conversion, request, SSE parsing and HTTP client per turn, its count
moving a little with how the stream's chunks arrive), on a chained 1-token
conversation: each turn's input is the history's newest batch, its reply the next one, as the
turn pipeline hands them (their footprints given, as the pipeline measures them beforehand: the
count is the backend's and the router's, plus the loop that drives them). Counting starts after 20 warm-up turns and stops after `--turns`
more; the same checkouts give the same counts. Each CHECKOUT (a directory holding a
`server_shim/`, default this one) is counted in the same run. Needs valgrind on PATH; each
count takes about 30 s.
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
from pathlib import Path

WARM_UP_TURNS = 20
MODES = ("router", "simulated", "null", "driver", "chat")


async def _turns(mode: str, turns: int, ready: bool, upstream: str | None = None) -> None:
    """The child: warm up, then (after a line on stdin) `turns` counted turns, then wait for the count to stop."""
    from server_shim.backends.base import BackendRequest, Finish, Routed, TextDelta, Usage
    from server_shim.backends.simulated import SimulatedBackend
    from server_shim.config import RoutingConfig
    from server_shim.health import Health
    from server_shim.history import History
    from server_shim.router import Deployment, Router
    from server_shim.tools import ChatTools

    class Null:
        name = "null"

        async def stream(self, request: BackendRequest):  # type: ignore[no-untyped-def]
            yield TextDelta("simulated ")
            yield Usage(10, 1, 5, estimated=True)
            yield Finish("stop")

    routing = RoutingConfig()
    simulated = SimulatedBackend()
    health = Health(routing.failure_threshold, routing.cooldown_s, routing.ewma_alpha)
    inner = Null() if mode in ("null", "driver") else simulated
    if mode == "chat":
        from server_shim.backends.openai_compatible import OpenAICompatibleBackend

        assert upstream is not None
        inner = OpenAICompatibleBackend(upstream)
    deployment = Deployment(name="sim", backend=inner, models={"*": "*"}, health=health)  # type: ignore[arg-type]
    backend = {"simulated": simulated, "driver": inner}.get(mode) or Router([deployment], routing)
    history, sticky = History(), None

    async def turn(n: int) -> None:
        nonlocal history, sticky
        base = history
        history = base.extend(({"type": "message", "role": "user", "content": "Next step?"},), 0)
        request = BackendRequest(
            model="simulated-1",
            history=history,
            chat_tools=ChatTools(),
            max_output_tokens=1,
            previous_items=len(base),
            deployment=sticky,
        )
        text = []
        async for delta in backend.stream(request):
            if isinstance(delta, TextDelta):
                text.append(delta.text)
            elif isinstance(delta, Routed):
                sticky = delta.deployment
        reply = {"type": "message", "role": "assistant", "id": f"msg_{n}", "status": "completed"}
        reply["content"] = [{"type": "output_text", "text": "".join(text), "annotations": []}]
        history = history.extend((reply,), 0)

    for n in range(WARM_UP_TURNS):
        await turn(n)
    if ready:
        print("READY", flush=True)
        sys.stdin.readline()
    for n in range(turns):
        await turn(WARM_UP_TURNS + n)
    if ready:
        print("DONE", flush=True)
        sys.stdin.readline()


def count(checkout: Path, mode: str, turns: int, keep: Path | None = None) -> float:
    """Instructions per turn of `mode` with `checkout`'s server_shim, instrumented only while the turns run
    (the callgrind output copied to `keep`)."""
    from .common import Subprocess, free_port

    with tempfile.TemporaryDirectory(prefix="responses-ws-backend-instructions-") as scratch:
        if mode != "chat":
            return _count(checkout, mode, turns, Path(scratch), keep, [])
        port = free_port()
        cmd = [sys.executable, "-m", "benchmarks.chat_server", "--port", str(port)]
        ready_url = f"http://127.0.0.1:{port}/health"
        root = Path(__file__).resolve().parent.parent
        with Subprocess(cmd, ready_url=ready_url, log_path=Path(scratch) / "chat.log", cwd=root):
            return _count(checkout, mode, turns, Path(scratch), keep, ["--upstream", f"http://127.0.0.1:{port}/v1"])


def _count(checkout: Path, mode: str, turns: int, scratch: Path, keep: Path | None, extra: list[str]) -> float:
    """The count itself: the child under valgrind, `extra` its further arguments."""
    out = scratch / "cg.out"
    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]
    child = [sys.executable, "-P", str(Path(__file__).resolve()), "--child", mode, "--turns", str(turns), *extra]
    env = dict(os.environ, PYTHONHASHSEED="0", PYTHONPATH=str(checkout))
    with subprocess.Popen(
        cmd + child, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    ) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        try:
            if proc.stdout.readline().strip() != "READY":
                raise RuntimeError("the child did not start")
            subprocess.run(["callgrind_control", "-i", "on", str(proc.pid)], check=True, capture_output=True)
            proc.stdin.write("\n")
            proc.stdin.flush()
            if proc.stdout.readline().strip() != "DONE":
                raise RuntimeError("the child did not finish its turns")
            subprocess.run(["callgrind_control", "-i", "off", str(proc.pid)], check=True, capture_output=True)
            proc.stdin.write("\n")
            proc.stdin.flush()
            _, err = proc.communicate(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
    if keep is not None:
        keep.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(out, keep)
    found = re.search(r"Collected : (\d+)", err)
    if found is None:
        raise RuntimeError(f"no instruction count from valgrind: {err[-2000:]}")
    return int(found.group(1)) / turns


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.backend_instructions", description=__doc__.split("\n")[0]
    )
    parser.add_argument("checkouts", nargs="*", type=Path, default=[Path.cwd()])
    parser.add_argument("--turns", type=int, default=500)
    parser.add_argument(
        "--modes",
        default="router,simulated,null,driver",
        help="router, simulated, null, driver and/or chat, comma-separated",
    )
    parser.add_argument("--keep", type=Path, help="keep each callgrind output in this directory")
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--no-wait", action="store_true", help=argparse.SUPPRESS)  # a child run without valgrind
    parser.add_argument("--upstream", help=argparse.SUPPRESS)  # the chat server's URL, for mode chat
    args = parser.parse_args(argv)
    if args.child:
        asyncio.run(_turns(args.child, args.turns, ready=not args.no_wait, upstream=args.upstream))
        return 0
    for mode in args.modes.split(","):
        for i, checkout in enumerate(args.checkouts):
            keep = None if args.keep is None else args.keep / f"{mode}-{i}.callgrind"
            per_turn = count(checkout.resolve(), mode, args.turns, keep)
            print(f"{mode:>9} {checkout}: {per_turn:,.0f} instructions per turn", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
