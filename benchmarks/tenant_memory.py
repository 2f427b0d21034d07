"""What one tenant's heavy load makes the server hold, and whether another tenant is still served, per checkout.

    python -m benchmarks.tenant_memory [--checkout DIR ...] [--out docs/performance]

Each checkout's server (`responses-ws serve`, simulated backend, keys `k1` and `k2` of tenants alice
and bob) runs in a child process started from that directory, once per case; RSS is sampled every
50 ms. Cases, after the attack probes p46, p36 and p22 (bounded: each well under a minute here):

- `queued`: 4 connections of k1, each starts a 40 s response, then pipelines for 25 s up to 63
  frames of ~0.45 MB (an unknown field of 40,000 keys) without reading; the server stops reading at
  `max_queued_bytes` (16 MiB of frames per connection). Peak RSS, and frames each got through.
- `caches`: 24 connections of k1, each 3 chained turns of a 2 MB input (`store: false`), all held
  open; `RESPONSES_WS_CACHE_BUDGET_BYTES` 64 MiB (a checkout without the budget ignores it). Peak RSS,
  `responses_ws_cache_bytes`, and whether k2's turn on a new connection completes.
- `store`: k2 stores one response, then k1 stores 40 responses of 1 MB input (`store_max_bytes`
  16 MiB). Whether k2's response is still there (GET, then chaining from it).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx2
import orjson
from websockets.asyncio.client import connect

from .common import Subprocess, free_port, machine_info, rss_bytes

MODEL = "simulated-1"
SEND_S = 25.0
"""How long the `queued` case pipelines frames (each is parsed on arrival: the server reads them slowly)."""
MB = 1024 * 1024
KEYS = "alice k1-budgets\nbob k2-budgets\n"


def _frame(**fields: Any) -> bytes:
    return orjson.dumps({"type": "response.create", "model": MODEL, "store": False, **fields})


class _Peak:
    """The server's RSS sampled every 50 ms while a case runs."""

    def __init__(self, pid: int) -> None:
        self.pid, self.idle, self.peak = pid, rss_bytes(pid), 0
        self._task = asyncio.get_running_loop().create_task(self._sample())

    async def _sample(self) -> None:
        while True:
            self.peak = max(self.peak, rss_bytes(self.pid))
            await asyncio.sleep(0.05)

    def stop(self) -> dict[str, float]:
        self._task.cancel()
        return {"rss_idle_mb": self.idle / MB, "rss_peak_mb": self.peak / MB}


async def _terminal(ws: Any, timeout: float = 60) -> dict[str, Any]:
    while True:
        event = orjson.loads(await asyncio.wait_for(ws.recv(), timeout))
        if event["type"] in ("response.completed", "response.failed", "response.incomplete", "error"):
            return event


async def _queued(url: str, pid: int) -> dict[str, Any]:
    big = _frame(input="x", max_output_tokens=1, zzz={f"k{j}": "" for j in range(40_000)})
    peak = _Peak(pid)
    sockets = [
        await connect(url, max_size=None, additional_headers={"Authorization": "Bearer k1-budgets"}) for _ in range(4)
    ]
    deadline = time.perf_counter() + SEND_S

    async def pipeline(ws: Any) -> int:
        await ws.send(_frame(input="x", max_output_tokens=40_000), text=True)  # 40 s at 1,000 tokens/s
        for count in range(63):
            try:
                await asyncio.wait_for(ws.send(big, text=True), max(0.1, deadline - time.perf_counter()))
            except TimeoutError:
                return count  # backpressure (the server stopped reading), or the time is up
        return 63

    sent = await asyncio.gather(*(pipeline(ws) for ws in sockets))
    await asyncio.sleep(1)
    result = {**peak.stop(), "frames_sent": sent, "frame_kb": len(big) // 1024}
    for ws in sockets:
        ws.transport.abort()
    return result


async def _caches(url: str, base: str, pid: int) -> dict[str, Any]:
    peak = _Peak(pid)
    sockets = []
    for _ in range(24):
        ws = await connect(url, max_size=None, additional_headers={"Authorization": "Bearer k1-budgets"})
        sockets.append(ws)
        previous = None
        for _ in range(3):
            fields = {"previous_response_id": previous} if previous else {}
            await ws.send(_frame(input="c" * 2 * MB, max_output_tokens=1, **fields), text=True)
            event = await _terminal(ws)
            previous = event["response"]["id"] if event["type"] == "response.completed" else None
    async with connect(url, additional_headers={"Authorization": "Bearer k2-budgets"}) as other:
        await other.send(_frame(input="bob", max_output_tokens=1), text=True)
        served = (await _terminal(other))["type"]
    async with httpx2.AsyncClient(base_url=base) as http:
        text = (await http.get("/metrics", headers={"Authorization": "Bearer k1-budgets"})).text
    cached = sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith("responses_ws_cache_bytes "))
    result = {**peak.stop(), "cache_bytes_mb": cached / MB, "other_tenant": served}
    for ws in sockets:
        await ws.close()
    return result


async def _store(base: str, pid: int) -> dict[str, Any]:
    peak = _Peak(pid)
    async with httpx2.AsyncClient(base_url=base + "/v1", timeout=60) as http:
        bob, alice = {"Authorization": "Bearer k2-budgets"}, {"Authorization": "Bearer k1-budgets"}
        kept = (await http.post("/responses", json={"model": MODEL, "input": "bob's state"}, headers=bob)).json()["id"]
        for _ in range(40):
            body = {"model": MODEL, "input": "a" * MB, "max_output_tokens": 1}
            await http.post("/responses", json=body, headers=alice)
        found = (await http.get(f"/responses/{kept}", headers=bob)).status_code
        chained = await http.post(
            "/responses", json={"model": MODEL, "input": "?", "previous_response_id": kept}, headers=bob
        )
    return {**peak.stop(), "other_tenant_get": found, "other_tenant_chain": chained.status_code}


async def _case(checkout: Path, case: str, tmp: Path) -> dict[str, Any]:
    port = free_port()
    keys = tmp / "keys"
    keys.write_text(KEYS)
    env = {
        **os.environ,
        "RESPONSES_WS_API_KEYS_FILE": str(keys),
        "RESPONSES_WS_SIMULATED_TOKENS_PER_S": "1000",
        "RESPONSES_WS_CACHE_BUDGET_BYTES": str(64 * MB),
        "RESPONSES_WS_STORE_MAX_BYTES": str(16 * MB),
        "RESPONSES_WS_USAGE_LEDGER": "off",
    }
    cmd = [sys.executable, "-m", "server_shim.cli", "--log-level", "WARNING", "serve", "--port", str(port)]
    base = f"http://127.0.0.1:{port}"
    url = f"ws://127.0.0.1:{port}/v1/responses"
    with Subprocess(cmd, ready_url=base + "/healthz", log_path=tmp / f"{case}.log", env=env, cwd=checkout) as server:
        await asyncio.sleep(0.5)
        started = time.perf_counter()
        if case == "queued":
            result = await _queued(url, server.pid)
        elif case == "caches":
            result = await _caches(url, base, server.pid)
        else:
            result = await _store(base, server.pid)
        result["seconds"] = time.perf_counter() - started
        return result


async def run(checkouts: list[Path]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for checkout in checkouts:
            for case in ("queued", "caches", "store"):
                results.setdefault(str(checkout), {})[case] = await _case(checkout, case, Path(tmp))
    return results


def report(results: dict[str, Any]) -> str:
    lines = []
    for checkout, cases in results.items():
        lines.append(f"checkout {checkout}")
        for case, values in cases.items():
            shown = ", ".join(f"{k} {v:.0f}" if isinstance(v, float) else f"{k} {v}" for k, v in values.items())
            lines.append(f"  {case}: {shown}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkout", action="append", type=Path, help="a checkout to run (repeatable; default: .)")
    parser.add_argument("--out", type=Path, default=Path("docs/performance"))
    args = parser.parse_args()
    checkouts = [path.resolve() for path in args.checkout or [Path(".")]]
    results = asyncio.run(run(checkouts))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "tenant-memory.json").write_bytes(
        orjson.dumps({"machine": machine_info(), "results": results}, option=orjson.OPT_INDENT_2)
    )
    text = report(results)
    (args.out / "tenant-memory.txt").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
