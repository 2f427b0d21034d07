"""What every suite shares: statistics, progress, results, servers, and the timing probes.

Timing model (one turn, one process for client and in-process server, one monotonic clock):

    start ─ client_prepare ─ sent ─ request_wire ─ server_in ─ server ─ server_out ─ response_wire ─ last_byte ─ client_parse ─ end

`sent` is when the SDK hands the encoded request to the transport (httpx transport entry, or the
websockets `send`), `server_in` when the ASGI app receives the whole body or frame, `server_out`
when the app hands the terminal event to the server, `last_byte` when the client transport reads
the last chunk or frame. The backend's own generation time is measured inside the server (time
spent inside the backend's `stream()` only) and is subtracted from the server share, so
`overhead = total - generation` and the parts add up to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import platform
import resource
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import uvicorn

from server_shim.backends.base import ConnectionScoped
from server_shim.ws import FORCE_CLOSE_EXTENSION

perf = time.perf_counter
RESULTS_DIR = Path(__file__).resolve().parent / "results"
REPO_ROOT = Path(__file__).resolve().parent.parent
_T0 = perf()


# ---------------------------------------------------------------------------------------------
# progress and statistics


def progress(message: str) -> None:
    """Progress goes to stderr, so stdout keeps only the final table."""
    print(f"[bench {perf() - _T0:7.1f}s] {message}", file=sys.stderr, flush=True)


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); q in [0, 100]."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def summarize(values: Iterable[float | None]) -> dict[str, float | int | None]:
    """n, median, p90, p99, mean, min, max of the values that are not None."""
    data = [float(v) for v in values if v is not None and not math.isnan(v)]
    if not data:
        return {"n": 0, "median": None, "p90": None, "p99": None, "mean": None, "min": None, "max": None}
    return {
        "n": len(data),
        "median": percentile(data, 50),
        "p90": percentile(data, 90),
        "p99": percentile(data, 99),
        "mean": sum(data) / len(data),
        "min": min(data),
        "max": max(data),
    }


def paired_ratios(numerator: Sequence[float | None], denominator: Sequence[float | None]) -> list[float]:
    """Ratios of samples taken as pairs (same repeat, same turn) in the same run."""
    return [a / b for a, b in zip(numerator, denominator, strict=True) if a is not None and b is not None and b > 0]


def rotated(items: Sequence[Any], shift: int) -> list[Any]:
    """The alternatives in a different order each repeat, so no one always runs first."""
    if not items:
        return []
    shift %= len(items)
    return [*items[shift:], *items[:shift]]


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


# ---------------------------------------------------------------------------------------------
# results


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "load_average_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    with contextlib.suppress(OSError, IndexError, ValueError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu_model"] = line.split(":", 1)[1].strip()
                break
        info["memory_gib"] = round(int(Path("/proc/meminfo").read_text().split()[1]) / 1024 / 1024, 1)
    with contextlib.suppress(Exception):
        info["git_commit"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=5
        ).stdout.strip()
    versions = {}
    for name in ("openai", "websockets", "uvicorn", "starlette", "orjson", "httpx2"):
        with contextlib.suppress(Exception):
            from importlib.metadata import version

            versions[name] = version(name)
    info["versions"] = versions
    return info


def write_json(out_dir: Path, name: str, data: dict[str, Any]) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    path.write_text(json.dumps(data, indent=2, sort_keys=False, default=_json_default, allow_nan=False) + "\n")
    return path


def _json_default(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def clean_floats(value: Any) -> Any:
    """NaN and infinities become None so the JSON stays standard."""
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else value
    if isinstance(value, dict):
        return {k: clean_floats(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean_floats(v) for v in value]
    return value


# ---------------------------------------------------------------------------------------------
# the per-turn recorder and its probes


@dataclass
class Recorder:
    """Timestamps of the turn in progress, written by the client and the in-process server thread.

    Turns run one at a time, so "the latest mark of each name" belongs to the current turn.
    Dict stores are atomic under the GIL; nothing else is shared.
    """

    marks: dict[str, float] = field(default_factory=dict)
    generation_s: float = 0.0
    backend_calls: int = 0
    backend_messages: int | None = None

    def reset(self) -> None:
        self.marks = {}
        self.generation_s = 0.0
        self.backend_calls = 0
        self.backend_messages = None

    def mark(self, name: str) -> None:
        self.marks[name] = perf()

    def mark_first(self, name: str) -> None:
        if name not in self.marks:
            self.marks[name] = perf()

    def breakdown(self) -> dict[str, float | None]:
        """The turn's parts in milliseconds; a part whose marks are missing is None."""
        m = self.marks

        def span(a: str, b: str) -> float | None:
            return (m[b] - m[a]) * 1000.0 if a in m and b in m else None

        total = span("start", "end")
        generation = self.generation_s * 1000.0
        server = span("server_in", "server_out")
        server_parse = span("server_in", "validated")
        return {
            "total_ms": total,
            "generation_ms": generation,
            "overhead_ms": None if total is None else total - generation,
            "client_prepare_ms": span("start", "sent"),
            "request_wire_ms": span("sent", "server_in"),
            "server_ms": None if server is None else server - generation,
            "server_parse_ms": server_parse,
            "response_wire_ms": span("server_out", "last_byte"),
            "client_parse_ms": span("last_byte", "end"),
        }


BREAKDOWN_PARTS = ("client_prepare_ms", "request_wire_ms", "server_ms", "response_wire_ms", "client_parse_ms")


class TimedBackend:
    """Wraps a backend; adds the time spent inside its `stream()` to the recorder's generation time.

    Only the backend's own steps count (each `__anext__`), not the time the consumer spends
    between deltas, so a paced backend still reports its schedule and a zero-latency one ~0.
    `stream_wall` keeps the first-to-last delta span for suites that want the pacing window.
    """

    def __init__(self, inner: Any, recorder: Recorder) -> None:
        self.inner = inner
        self.recorder = recorder
        self.name = getattr(inner, "name", "backend")
        self.stream_walls: list[float] = []

    async def models(self) -> list[str]:
        return await self.inner.models()

    async def release(self, connection_id: str) -> None:
        if isinstance(self.inner, ConnectionScoped):
            await self.inner.release(connection_id)

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def stream(self, request: Any) -> AsyncGenerator[Any, None]:
        recorder = self.recorder
        recorder.backend_calls += 1
        recorder.backend_messages = len(request.history)  # items; one message each in these loops
        recorder.mark("backend_start")
        first = perf()
        inner = self.inner.stream(request)
        try:
            while True:
                t0 = perf()
                try:
                    delta = await inner.__anext__()
                except StopAsyncIteration:
                    recorder.generation_s += perf() - t0
                    break
                recorder.generation_s += perf() - t0
                yield delta
        finally:
            recorder.mark("backend_end")
            self.stream_walls.append(perf() - first)
            with contextlib.suppress(Exception):
                await inner.aclose()  # type: ignore[attr-defined]


_COMPLETED_PREFIXES = ('{"type":"response.completed"', '{"type":"response.incomplete"', '{"type":"response.failed"')
_COMPLETED_PREFIXES_BYTES = tuple(prefix.encode() for prefix in _COMPLETED_PREFIXES)
_SSE_TERMINAL = (b"event: response.completed", b"event: response.incomplete", b"event: response.failed")


class TimingMiddleware:
    """ASGI probe: `server_in` when the body or frame has arrived, `server_out` at the terminal event.

    The terminal event is the `response.completed` (or incomplete/failed) frame or SSE chunk, or a
    Chat Completions stream's `data: [DONE]`; a plain JSON body ends at its last chunk. The empty
    closing chunk of a stream can land after the client has started its next turn, so it only
    marks when nothing did, and the next turn's terminal event overwrites it.
    """

    def __init__(self, app: Any, recorder: Recorder) -> None:
        self.app = app
        self.recorder = recorder

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        recorder = self.recorder
        scope = self._timed_send_texts(scope)

        async def timed_receive() -> dict:
            message = await receive()
            kind = message["type"]
            if (kind == "http.request" and not message.get("more_body")) or kind == "websocket.receive":
                recorder.mark("server_in")
            return message

        async def timed_send(message: dict) -> None:
            kind = message["type"]
            if kind == "http.response.body":
                body = message.get("body", b"")
                if body.startswith(_SSE_TERMINAL) or body.endswith(b"data: [DONE]\n\n"):
                    recorder.mark("server_out")
                elif not message.get("more_body"):
                    recorder.mark_first("server_out")
            elif kind == "websocket.send":
                text = message.get("text")
                if text is not None and text.startswith(_COMPLETED_PREFIXES):
                    recorder.mark("server_out")
            await send(message)

        await self.app(scope, timed_receive, timed_send)

    def _timed_send_texts(self, scope: dict) -> dict:
        """The scope with the shim's direct frame writer (its fast path past ASGI `send`) probed too."""
        extensions = scope.get("extensions") or {}
        protocol = extensions.get(FORCE_CLOSE_EXTENSION)
        if scope["type"] != "websocket" or not protocol or protocol.get("send_texts") is None:
            return scope  # no direct writer, or the app turned it off (a middleware wraps `send`: this one)
        send_texts, recorder = protocol["send_texts"], self.recorder

        def timed_send_texts(frames: list[bytes]) -> None:
            if any(data.startswith(_COMPLETED_PREFIXES_BYTES) for data in frames):
                recorder.mark("server_out")
            send_texts(frames)

        probed = {**protocol, "send_texts": timed_send_texts}
        return {**scope, "extensions": {**extensions, FORCE_CLOSE_EXTENSION: probed}}


def validation_probe(recorder: Recorder) -> Any:
    """A shim validator that only marks when the turn's new items were parsed and checked."""

    def probe(new_items: Any, previous: Any, request: Any) -> None:
        recorder.mark("validated")

    return probe


class _TimedStream(httpx2.AsyncByteStream):
    def __init__(self, inner: Any, recorder: Recorder) -> None:
        self.inner = inner
        self.recorder = recorder

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.inner:
            self.recorder.mark("last_byte")
            yield chunk

    async def aclose(self) -> None:
        await self.inner.aclose()


class TimingTransport(httpx2.AsyncBaseTransport):
    """Client probe for HTTP: `sent` when the SDK hands over the built request, `last_byte` per chunk."""

    def __init__(self, recorder: Recorder, inner: httpx2.AsyncBaseTransport | None = None) -> None:
        self.recorder = recorder
        self.inner = inner or httpx2.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        self.recorder.mark("sent")
        response = await self.inner.handle_async_request(request)
        response.stream = _TimedStream(response.stream, self.recorder)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


def timed_http_client(recorder: Recorder | None, timeout_s: float = 120.0) -> httpx2.AsyncClient:
    transport = TimingTransport(recorder) if recorder is not None else httpx2.AsyncHTTPTransport()
    return httpx2.AsyncClient(transport=transport, timeout=httpx2.Timeout(timeout_s, connect=10.0))


class TimedWebSocket:
    """Client probe for WebSocket: stands in for the SDK's websockets connection."""

    def __init__(self, inner: Any, recorder: Recorder) -> None:
        self._inner = inner
        self._recorder = recorder

    async def send(self, data: Any, *args: Any, **kwargs: Any) -> None:
        self._recorder.mark("sent")
        await self._inner.send(data, *args, **kwargs)

    async def recv(self, *args: Any, **kwargs: Any) -> Any:
        message = await self._inner.recv(*args, **kwargs)
        self._recorder.mark("last_byte")
        return message

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def probe_websocket(connection: Any, recorder: Recorder) -> None:
    """Put the probe between an SDK `AsyncResponsesConnection` and its socket."""
    connection._connection = TimedWebSocket(connection._connection, recorder)


# ---------------------------------------------------------------------------------------------
# servers


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ThreadServer:
    """Any ASGI app under uvicorn on a free loopback port, in a thread of this process."""

    def __init__(self, app: Any, *, start_timeout_s: float = 30.0) -> None:
        self.port = free_port()
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.start_timeout_s = start_timeout_s
        self._thread = threading.Thread(target=self.server.run, name="bench-server", daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> ThreadServer:
        self._thread.start()
        deadline = perf() + self.start_timeout_s
        while not self.server.started:
            if not self._thread.is_alive() or perf() > deadline:
                raise RuntimeError("benchmark server thread did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=30)


CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def process_tree(pid: int) -> list[int]:
    """pid and its descendants (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            stat = (entry / "stat").read_text()
            ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(children.get(current, ()))
    return tree


def cpu_seconds(pid: int, *, tree: bool = True) -> float:
    """User + system CPU time of a process (and its descendants), all threads.

    From /proc/PID/task/*/schedstat (nanoseconds): /proc/PID/stat counts clock ticks (10 ms), too
    coarse for a short run, which could read 0. Falls back to the ticks where schedstat is missing.
    """
    return sum(_process_cpu_seconds(p) for p in (process_tree(pid) if tree else [pid]))


def _process_cpu_seconds(pid: int) -> float:
    try:
        return (
            sum(int((task / "schedstat").read_text().split()[0]) for task in Path(f"/proc/{pid}/task").iterdir()) / 1e9
        )
    except (OSError, ValueError, IndexError):
        pass
    with contextlib.suppress(OSError, IndexError, ValueError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2 :].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return 0.0


def rss_bytes(pid: int) -> int:
    """Resident set size of one process, from /proc/PID/status."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def raise_fd_limit(wanted: int) -> tuple[int, int]:
    """Raise this process's soft open-file limit toward `wanted` (children inherit it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


class Subprocess:
    """A server in a child process: logs to a file, ready when a URL answers 200, always stopped."""

    def __init__(
        self,
        cmd: Sequence[str],
        *,
        ready_url: str,
        log_path: Path,
        env: dict[str, str] | None = None,
        ready_timeout_s: float = 60.0,
        cwd: Path | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.cmd = list(cmd)
        self.ready_url = ready_url
        self.log_path = log_path
        self.env = env
        self.ready_timeout_s = ready_timeout_s
        self.cwd = cwd
        self.headers = headers or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.ready_s: float | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> Subprocess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("wb")
        start = perf()
        self.proc = subprocess.Popen(
            self.cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=self.cwd, start_new_session=True
        )
        log.close()
        deadline = start + self.ready_timeout_s
        with httpx2.Client(timeout=2.0) as client:
            while perf() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"{self.cmd[0]} exited with {self.proc.returncode}; see {self.log_path}")
                with contextlib.suppress(httpx2.HTTPError):
                    if client.get(self.ready_url, headers=self.headers).status_code == 200:
                        self.ready_s = perf() - start
                        return self
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"{self.cmd[0]} not ready after {self.ready_timeout_s:.0f} s; see {self.log_path}")

    def log_tail(self, chars: int = 2000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-chars:]
        return ""

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=15)

    def __enter__(self) -> Subprocess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def shim_command(port: int, *, backend: str | None = None) -> list[str]:
    """`responses-ws serve` in a child process (through the module, so any venv layout works)."""
    cmd = [sys.executable, "-m", "server_shim.cli", "--log-level", "WARNING", "serve", "--port", str(port)]
    if backend:
        cmd += ["--backend", backend]
    return cmd


async def bounded(awaitable: Any, timeout_s: float, what: str) -> Any:
    try:
        async with asyncio.timeout(timeout_s):
            return await awaitable
    except TimeoutError:
        raise TimeoutError(f"{what} took more than {timeout_s:g} s") from None
