"""llama.cpp alone, no shim: per-request latency and server CPU by thread count.

    python -m benchmarks.llama_stall [--threads 1,2] [--requests 40] [--rounds 1]

Run it beside a CPU hog (`timeout 120 python -c 'while True: pass' &`, twice on 2 cores) to see
what `agent-llama` saw as WebSocket stalls: llama.cpp's threads spin while they wait for each
other, so with as many threads as cores and other work on them, one descheduled thread holds the
rest and a single request takes seconds; the server's CPU time per request grows with the
spinning. Each request streams a chat completion from llama-cpp-python's server on loopback
(the tiny model of the tests), with a history that grows by a short exchange per request.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import httpx2

from .common import cpu_seconds, percentile
from .llama_server import LlamaServer
from .tiny_model import write_tiny_model


def measure(model: Path, log: Path, threads: int, requests: int) -> dict[str, float]:
    """One server with `threads` threads; `requests` streamed requests one after another."""
    with LlamaServer(model, log, n_ctx=16384, n_threads=threads) as server, httpx2.Client(timeout=120) as http:
        assert server.process is not None
        messages = [{"role": "user", "content": "Look up record 0."}]
        times = []
        cpu0 = cpu_seconds(server.process.pid)
        for _ in range(requests):
            body = {"model": server.alias, "messages": messages, "max_tokens": 32, "temperature": 0, "stream": True}
            t0 = time.perf_counter()
            with http.stream("POST", f"{server.base_url}/chat/completions", json=body) as reply:
                for _ in reply.iter_lines():
                    pass
            times.append((time.perf_counter() - t0) * 1000)
            messages += [{"role": "assistant", "content": "abc " * 10}, {"role": "user", "content": "x" * 100}]
        cpu_ms = (cpu_seconds(server.process.pid) - cpu0) * 1000
    return {
        "p50_ms": statistics.median(times),
        "p90_ms": percentile(times, 90),
        "max_ms": max(times),
        "over_1s": sum(t > 1000 for t in times),
        "total_s": sum(times) / 1000,
        "server_cpu_ms_per_request": cpu_ms / requests,
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.llama_stall", description=__doc__.split("\n")[0])
    parser.add_argument("--threads", default="1,2", help="thread counts to compare, in turn (default 1,2)")
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=1, help="times to run each thread count, alternating")
    args = parser.parse_args()
    counts = [int(n) for n in args.threads.split(",")]
    print(f"load average {os.getloadavg()[0]:.2f}; {args.requests} streamed requests per server")
    with tempfile.TemporaryDirectory() as tmp:
        model = write_tiny_model(Path(tmp) / "tiny.gguf")
        for _ in range(args.rounds):
            for threads in counts:
                r = measure(model, Path(tmp) / "server.log", threads, args.requests)
                print(
                    f"threads={threads}: p50 {r['p50_ms']:.0f} ms, p90 {r['p90_ms']:.0f} ms, max {r['max_ms']:.0f} ms, "
                    f"{r['over_1s']} over 1 s, total {r['total_s']:.1f} s, "
                    f"server CPU {r['server_cpu_ms_per_request']:.0f} ms/request"
                )
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
