"""Running the app under uvicorn, with a shutdown that closes WebSockets with 1001 first."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from email.utils import formatdate

import orjson
import uvicorn
from starlette.applications import Starlette
from uvicorn.supervisors import Multiprocess

from . import metrics, tracing
from .allocator import allocator_line, c_allocator
from .app import ShimState, create_app
from .config import ShimConfig
from .http_protocol import HTTP_PROTOCOL, HttpLimits
from .loading import Loaded
from .logs import configure_logging, uvicorn_log_config
from .settings import Settings
from .trim import freeze_startup_heap
from .ws_protocol import ShimWebSocketProtocol

log = logging.getLogger("responses_ws")


class Connections(set[object]):
    """uvicorn's set of open connections, calling `wake` when the first one opens (before it reads anything)."""

    def __init__(self, wake: Callable[[], None]) -> None:
        super().__init__()
        self.wake = wake

    def add(self, connection: object) -> None:
        super().add(connection)
        if len(self) == 1:
            self.wake()


class ShimServer(uvicorn.Server):
    """uvicorn would close open sockets with 1012; drain and send 1001 (going away) before it does.

    uvicorn's main loop ticks ten times a second (the `Date` header once a second, the exit flag); this
    one pauses while no connection is open, until one opens or the exit is asked for: an idle server
    does not wake up, and what each tick made would otherwise land in the memory the last burst of
    clients freed, keeping it from going back to the system (see `trim.py`).
    """

    def __init__(self, config: uvicorn.Config, shim: ShimState) -> None:
        self._exit = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._woken = asyncio.Event()
        super().__init__(config)
        self.shim = shim
        self.server_state.connections = Connections(self._first_connection)  # type: ignore[assignment]

    @property  # type: ignore[override]
    def should_exit(self) -> bool:
        return self._exit

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        """Set by a signal handler or from another thread (tests): wake a paused main loop."""
        self._exit = value
        if value:
            self._wake()

    def _first_connection(self) -> None:
        """The `Date` header renewed at once (it was not while paused), then the main loop woken."""
        date = [(b"date", formatdate(time.time(), usegmt=True).encode())] if self.config.date_header else []
        self.server_state.default_headers = date + self.config.encoded_headers
        self._wake()

    def _wake(self) -> None:
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nothing to wake
                self._loop.call_soon_threadsafe(self._woken.set)

    async def main_loop(self) -> None:
        self._loop = asyncio.get_running_loop()
        counter = 0
        while not await self.on_tick(counter):
            if self.server_state.connections or self.config.callback_notify is not None:  # a supervisor's heartbeat
                await asyncio.sleep(0.1)
                counter = (counter + 1) % 864_000
            else:
                self._woken.clear()
                if not self.server_state.connections and not self._exit:
                    await self._woken.wait()
                counter = 0  # tick 0 renews the Date header at once

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await self.shim.close_connections()
        await super().shutdown(sockets)


WORKER_ENV = "RESPONSES_WS_WORKER_SETUP"
"""How `serve --workers N` hands the parent's settings and config to each worker process."""


class ShimUvicornConfig(uvicorn.Config):
    """uvicorn's config plus what the shim's protocols read: the app's frame limit (WebSocket) and the HTTP
    deadlines and connection cap (`http_protocol.py`); picklable for workers, each counting its own."""

    def __init__(
        self, app: Starlette | str, *, max_frame_bytes: int, http_limits: HttpLimits, **kwargs: object
    ) -> None:
        super().__init__(app, **kwargs)  # type: ignore[arg-type]
        self.max_frame_bytes = max_frame_bytes
        self.http_limits = http_limits


def uvicorn_config(app: Starlette | str, settings: Settings, **kwargs: object) -> uvicorn.Config:
    return ShimUvicornConfig(
        app,
        max_frame_bytes=settings.max_frame_bytes,
        http_limits=HttpLimits(
            header_timeout_s=settings.http_header_timeout_s,
            body_timeout_s=settings.http_body_timeout_s,
            send_timeout_s=settings.send_timeout_s,
            max_connections=settings.max_http_connections,
        ),
        host=settings.host,
        port=settings.port,
        http=HTTP_PROTOCOL,
        ws=ShimWebSocketProtocol,
        ws_max_size=max(2 * settings.max_frame_bytes, 16 * 1024 * 1024),
        ws_per_message_deflate=False,
        lifespan="on",
        timeout_graceful_shutdown=int(settings.drain_timeout_s) + 5,
        **kwargs,  # type: ignore[arg-type]
    )


def serve(loaded: Loaded, *, log_level: str = "info", workers: int = 1) -> int:
    """Bind first (a port in use is one clear line, before anything starts), say what runs, then serve."""
    settings = loaded.settings
    configure_logging(log_level.upper(), settings.log_format)
    try:
        sock = bind(settings.host, settings.port)
    except OSError as exc:
        log.error("cannot listen on %s:%s: %s", settings.host, settings.port, exc.strerror or exc)
        return 1
    for line in startup_summary(loaded, sock.getsockname()[1], workers):
        log.info("%s", line)
    for warning in loaded.warnings:
        log.warning("%s", warning)
    if settings.otel:
        tracing.enable()
        log.info("OpenTelemetry: a span per turn and per stage, exported over OTLP/HTTP (OTEL_* variables)")
    if workers > 1:
        serve_workers(loaded, sock, log_level=log_level, workers=workers)
        return 0
    app = create_app(settings, config=loaded.config, keys=loaded.keys)
    tune_interpreter()
    config = uvicorn_config(app, settings, log_level=log_level, log_config=uvicorn_log_config())
    server = ShimServer(config, app.state.shim)
    with contextlib.suppress(KeyboardInterrupt):  # uvicorn re-raises SIGINT after its graceful shutdown
        asyncio.run(server.serve(sockets=[sock]))
    return 0


GIL_SWITCH_S = 0.0005
"""How long a thread keeps the GIL while another waits for it (CPython's default: 5 ms). The usage ledger
writes its SQLite rows in a thread: each time the event loop gives the GIL up for a system call (epoll, a
socket write), that thread could keep it up to 5 ms, and every turn in flight waited. At 128 busy
connections (`python -m benchmarks load --clients 128`, three runs each, side by side): p99 61.7 -> 47.4 ms."""


def tune_interpreter() -> None:
    """A serving process's interpreter: the start-up heap frozen, the GIL handed over sooner (`GIL_SWITCH_S`)."""
    freeze_startup_heap()
    sys.setswitchinterval(GIL_SWITCH_S)


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (IPv4 or IPv6, as the host resolves); raises OSError."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def startup_summary(loaded: Loaded, port: int, workers: int = 1) -> list[str]:
    """What an operator needs to see once: where it listens, what it routes to, whether auth is on."""
    settings = loaded.settings
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    processes = f", {workers} worker processes" if workers > 1 else ""
    lines = [f"listening on http://{host}:{port} (WebSocket ws://{host}:{port}/v1/responses{processes})"]
    source = f"from {loaded.path}" if loaded.from_file else "from the backend setting"
    for d in loaded.config.deployments:
        target = f" at {d.base_url}" if d.base_url else ""
        models = ", ".join(f"{alias}->{model}" if alias != model else alias for alias, model in d.models.items())
        lines.append(f"deployment {d.name!r} ({d.kind}{target}) serves models {models} [{source}]")
    lines.append(loaded.auth_summary())
    lines.append(allocator_line(c_allocator()))
    return lines


def serve_workers(loaded: Loaded, sock: socket.socket, *, log_level: str, workers: int) -> None:
    """N processes accepting on one socket, uvicorn's own way; each builds the app from the parent's setup.

    Connection caches are per process; a client whose new connection lands on another worker
    continues from the response store, so that store must be shared (Redis) for it to work.
    Metrics are summed over the workers through prometheus-client's multiprocess directory.
    """
    settings = loaded.settings
    if settings.store == "memory":
        log.warning(
            "--workers %d with the memory store: stored responses are per worker, so a connection that lands on "
            "another worker cannot continue them; use --store redis://HOST:PORT/DB to share them",
            workers,
        )
    setup = {
        "settings": settings.model_dump(mode="json"),
        "config": loaded.config.model_dump(mode="json"),
        "log_level": log_level.upper(),
    }
    os.environ[WORKER_ENV] = orjson.dumps(setup).decode()
    uv_config = uvicorn_config(
        f"{__name__}:worker_app",
        settings,
        factory=True,
        workers=workers,
        log_level=log_level,
        log_config=uvicorn_log_config(),
    )
    with metrics.multiprocess_dir(), contextlib.suppress(KeyboardInterrupt):
        Multiprocess(uv_config, sockets=[sock]).run()


def worker_app() -> Starlette:
    """The app of one `--workers` process (uvicorn calls this factory in each child)."""
    setup = orjson.loads(os.environ[WORKER_ENV])
    settings = Settings.model_validate(setup["settings"])
    configure_logging(setup["log_level"], settings.log_format)
    if settings.otel:
        tracing.enable()
    metrics.on_worker_exit()
    app = create_app(settings, config=ShimConfig.model_validate(setup["config"]))
    tune_interpreter()
    return app


class BackgroundServer:
    """A real uvicorn server on a free loopback port in a thread: for the demo, tests and benchmarks."""

    def __init__(self, app: Starlette, settings: Settings | None = None) -> None:
        settings = (settings or Settings()).model_copy(update={"port": _free_port(), "host": "127.0.0.1"})
        self.app = app
        self.settings = settings
        self.server = ShimServer(uvicorn_config(app, settings, log_level="warning"), app.state.shim)
        self._thread = threading.Thread(target=self.server.run, name="responses-ws-server", daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.settings.port}/v1"

    @property
    def shim(self) -> ShimState:
        return self.app.state.shim

    def start(self) -> BackgroundServer:
        self._thread.start()
        while not self.server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the server thread died during start-up")
            threading.Event().wait(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=30)

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
