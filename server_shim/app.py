"""`create_app(settings)`: the Starlette app with its routes and shared state."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from starlette.applications import Starlette
from starlette.routing import Route, WebSocketRoute
from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocket

from . import chat_http, extensions, http, metrics, resources
from .admission import ConnectionGate, TenantLimiter, tenant_connection_cap
from .auth import BearerAuth, deny
from .backends.base import (
    Backend,
    ConnectionScoped,
    ContextWindows,
    HasBackgroundWork,
    HostedToolPolicy,
    ServesModels,
)
from .browsers import BrowserGuard
from .budgets import CacheBudget, default_cache_budget
from .check_config import checks_by_model
from .checks import Check
from .compaction import compaction_key
from .config import ShimConfig
from .deployments import build_router
from .ledger import Ledger
from .limits import RequestLimits
from .observe import ANONYMOUS, turn_finished
from .passes import PassStarts
from .postinference import PostInference
from .safety import Classifier, Validator
from .settings import Settings
from .state import ConnectionCache, MemoryResponseStore, ResponseStore
from .tenants import ApiKey, load_keys, scope_tenant
from .tokens import counters_by_model
from .trim import Count, Counts, Trimmer, settle_hooks
from .turn import Turn
from .turn_plan import TurnEnv
from .turn_settings import SharedDerivations
from .ws import CLOSE_GOING_AWAY, FORCE_CLOSE_EXTENSION, ResponsesConnection

if TYPE_CHECKING:
    import pluggy

log = logging.getLogger(__name__)


class ShimStats(Counts):
    """Counters a test or an operator can read: what arrived, not what clients meant to send."""

    turns = Count()
    input_items_received = Count()
    bytes_received = Count()
    websocket_connections = Count()


_TURNS, _ITEMS_RECEIVED = ShimStats.turns.index, ShimStats.input_items_received.index


@dataclass
class ShimState:
    settings: Settings
    env: TurnEnv
    connections: set[ResponsesConnection] = field(default_factory=set)
    stats: ShimStats = field(default_factory=ShimStats)
    gate: ConnectionGate = field(default_factory=lambda: ConnectionGate(max_connections=1024))
    limiter: TenantLimiter = field(default_factory=TenantLimiter)
    cache_budget: CacheBudget = field(default_factory=lambda: CacheBudget(default_cache_budget()))
    clock: Callable[[], float] = time.monotonic
    """Monotonic seconds, for the admission decisions (tests pass their own)."""
    trimmer: Trimmer = field(default_factory=Trimmer)
    store_answered: bool = False
    """Whether the store has answered once: `/readyz` waits for that, as for a deployment (a later outage
    does not make it unready). A store that never answers is more likely a wrong URL than an outage."""
    _draining: asyncio.Task[None] | None = field(default=None, repr=False)
    derivations: SharedDerivations = field(default_factory=SharedDerivations)
    """Settings derived lately on any connection (`turn_settings`): a connection's first turn reuses them."""
    _passes: PassStarts | None = field(default=None, repr=False)
    release: Callable[[str], Awaitable[None]] | None = field(init=False, repr=False)
    """The backend's `release` of a closed connection's state where it keeps some (`ConnectionScoped`), looked up
    once: an `isinstance` against a runtime-checkable protocol walks the protocol's attributes on every call."""

    def __post_init__(self) -> None:
        backend = self.env.backend
        self.release = backend.release if isinstance(backend, ConnectionScoped) else None

    def pass_starts(self, loop: asyncio.AbstractEventLoop) -> PassStarts:
        """The lanes started per pass of `loop`, counted for all connections together (`passes`)."""
        passes = self._passes
        if passes is None or passes.loop is not loop:
            passes = self._passes = PassStarts(loop)
        return passes

    def connection_cache(self, tenant: str | None) -> ConnectionCache:
        """A new connection's cache, bounded on its own and by the server's budget for all of them."""
        limits = self.settings
        return ConnectionCache(
            limits.cache_max_responses, limits.cache_max_bytes, tenant=tenant, budget=self.cache_budget
        )

    def record_turn(self, turn: Turn) -> None:
        cells = self.stats.cells  # the counters' array itself: a `Count` read or set is a descriptor call
        cells[_TURNS] += 1
        cells[_ITEMS_RECEIVED] += turn.result.new_items
        turn_finished(turn)

    async def models(self) -> list[str]:
        return await self.env.backend.models()

    async def close_connections(self, code: int = CLOSE_GOING_AWAY) -> None:
        """Drain: refuse new connections and requests at once (`/readyz` 503), let in-flight responses
        finish, then close every WebSocket with 1001 so clients reconnect elsewhere."""
        self.gate.draining = True
        await asyncio.gather(*(conn.close(code) for conn in list(self.connections)), return_exceptions=True)

    def drain_soon(self) -> None:
        """Start the drain once, for callers that cannot await it (a worker's WebSockets at shutdown)."""
        if self._draining is None:
            self._draining = asyncio.get_running_loop().create_task(self.close_connections())


def create_app(
    settings: Settings | None = None,
    *,
    config: ShimConfig | None = None,
    backend: Backend | None = None,
    store: ResponseStore | None = None,
    validators: Sequence[Validator] = (),
    classifiers: Sequence[Classifier] = (),
    checks: Sequence[Check] = (),
    plugin_manager: pluggy.PluginManager | None = None,
    keys: Sequence[ApiKey] | None = None,
) -> Starlette:
    """The shim as an ASGI app.

    Without `backend`, the deployments of `config` (or the one `settings.backend` names) are
    built by the plugins' backend kinds and put behind the router. Validators, classifiers and
    post-inference sinks come from the arguments plus every plugin of `plugin_manager` (default:
    the built-in plugins and the installed entry points, `server_shim.extensions`). Stateful checks
    (`checks.py`) are `checks`, for every model, followed by the config file's built-in ones.
    `keys` are the accepted bearer keys as the caller already read them (`serve` reads the keys file
    once: a pipe reads empty the second time); by default they are read from `settings`.
    """
    settings = settings or (config.settings() if config else Settings())
    manager = plugin_manager or extensions.default_plugin_manager()
    if backend is None:
        routed = config or ShimConfig.from_settings(settings)
        backend = build_router(routed, extensions.backend_kinds(manager))
        metrics.prepare(d.name for d in routed.deployments)
    else:
        metrics.prepare([ANONYMOUS])
    configured = checks_by_model(config or ShimConfig(), backend)
    checks = [*checks, *extensions.checks(manager, settings)]
    counters = counters_by_model((config or ShimConfig()).deployments)
    env = TurnEnv(
        backend=backend,
        store=store or build_store(settings),
        validators=[*validators, *extensions.validators(manager, settings)],
        classifiers=[*classifiers, *extensions.classifiers(manager, settings)],
        post_inference=PostInference([extensions.ResponseSink(manager)], build_ledger(settings)),
        limits=RequestLimits.from_settings(settings),
        checks=(lambda model: [*checks, *configured(model)]) if checks else configured,  # asked every turn
        overlap_checks=settings.checks_overlap,
        token_counter=counters.get,
        compaction_key=compaction_key(settings.compaction_secret),
    )
    if isinstance(backend, ServesModels):
        env.serves_model = backend.serves_model
    if isinstance(backend, HostedToolPolicy):
        env.hosted_policy = backend.hosted_policy
    if isinstance(backend, ContextWindows):
        env.context_window = backend.context_window
    keys = list(keys) if keys is not None else load_keys(settings.api_keys, settings.api_keys_file)
    tenants = len({key.tenant for key in keys})
    limiter = TenantLimiter(settings.tenant_max_concurrent, settings.tenant_turns_per_minute)
    stats = ShimStats()
    shim = ShimState(
        settings,
        env,
        stats=stats,
        gate=ConnectionGate(
            settings.max_connections,
            tenant_connection_cap(settings.max_connections, settings.tenant_max_connections, tenants),
            tenants,
        ),
        limiter=limiter,
        cache_budget=CacheBudget(
            settings.cache_budget_bytes or default_cache_budget(), settings.tenant_cache_max_bytes
        ),
        trimmer=Trimmer(settle=settle_hooks(backend), in_flight=limiter.busy, turns=lambda: stats.turns),
    )

    async def websocket_endpoint(websocket: WebSocket) -> None:
        tenant = scope_tenant(websocket.scope)
        refusal = shim.gate.admit_connection(tenant)
        if refusal is not None:
            await websocket.send_denial_response(http.error_response(refusal.api_error()))
            return
        try:
            await _serve_connection(websocket)
        finally:
            shim.gate.connection_closed(tenant)
            shim.trimmer.maybe_trim()

    async def _serve_connection(websocket: WebSocket) -> None:
        connection = ResponsesConnection(websocket, shim)
        shim.connections.add(connection)
        shim.stats.websocket_connections += 1
        metrics.CONNECTIONS.inc()
        try:
            await connection.run()
        finally:
            shim.connections.discard(connection)
            metrics.CONNECTIONS.dec()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if isinstance(env.backend, HasBackgroundWork):
            await env.backend.start()
        await env.post_inference.start()
        shim.store_answered = await env.store.ping()
        if not shim.store_answered:
            log.warning(
                "the response store at %s does not answer: /readyz says 503 until it does", store_address(shim.settings)
            )
        yield
        await shim.close_connections()
        await env.post_inference.aclose()
        await env.backend.aclose()
        await env.store.aclose()
        for counter in counters.values():
            await counter.aclose()

    routes = [
        WebSocketRoute("/v1/responses", websocket_endpoint),
        Route("/v1/responses", resources.guarded(http.create_response), methods=["POST"]),
        Route("/v1/responses/{response_id}", resources.guarded(http.get_response), methods=["GET"]),
        Route("/v1/responses/input_tokens", resources.guarded(resources.count_input_tokens), methods=["POST"]),
        Route("/v1/responses/compact", resources.guarded(resources.compact_response), methods=["POST"]),
        Route("/v1/responses/{response_id}/input_items", resources.guarded(http.list_input_items), methods=["GET"]),
        Route("/v1/responses/{response_id}/cancel", resources.guarded(resources.cancel_response), methods=["POST"]),
        Route("/v1/responses/{response_id}", resources.guarded(http.delete_response), methods=["DELETE"]),
        Route("/v1/chat/completions", resources.guarded(chat_http.create_chat_completion), methods=["POST"]),
        Route("/v1/models", resources.guarded(http.list_models), methods=["GET"]),
        Route("/healthz", resources.guarded(http.healthz), methods=["GET"]),
        Route("/readyz", resources.guarded(http.readyz), methods=["GET"]),
        Route("/metrics", resources.guarded(http.metrics_endpoint), methods=["GET"]),
    ]
    errors = {404: resources.http_error, 405: resources.http_error}
    app = ShimApp(routes=routes, lifespan=lifespan, exception_handlers=errors)
    app.browser_guard = BrowserGuard.build(settings.host, settings.allowed_origins, settings.allowed_hosts)
    app.state.shim = shim
    metrics_key = None if settings.metrics_open else settings.metrics_key
    if keys or metrics_key:
        app.add_middleware(BearerAuth, keys=keys, metrics_key=metrics_key, metrics_open=settings.metrics_open)
    return app


def store_address(settings: Settings) -> str:
    """Where the store is, for a log line: host and port (or socket path), never the URL's password."""
    parts = urlsplit(settings.store)
    return parts.path if parts.scheme == "unix" else f"{parts.hostname}:{parts.port or 6379}"


def build_store(settings: Settings) -> ResponseStore:
    """The store `settings.store` names: in-process memory, or Redis shared by workers and replicas."""
    if settings.store == "memory":
        return MemoryResponseStore(
            settings.store_max_responses,
            settings.store_max_bytes,
            tenant_max_responses=settings.store_tenant_max_responses,
            tenant_max_bytes=settings.store_tenant_max_bytes,
        )
    from .redis_quota import TenantQuota
    from .redis_store import RedisResponseStore

    return RedisResponseStore(
        settings.store,
        ttl_s=settings.store_ttl_s,
        max_entry_bytes=settings.store_max_entry_bytes,
        timeout_s=settings.store_timeout_s,
        quota=TenantQuota(settings.store_tenant_max_responses, settings.store_tenant_max_bytes),
    )


def build_ledger(settings: Settings) -> Ledger | None:
    """The usage ledger `settings.usage_ledger` names (a Redis stream on the store's Redis, or SQLite), or None."""
    kind = settings.usage_ledger
    if kind == "auto":
        kind = "sqlite" if settings.store == "memory" else "redis"
    if kind == "off":
        return None
    from .ledger_sinks import RedisStreamSink, SqliteSink

    if kind == "redis" and settings.store == "memory":
        raise ValueError("usage_ledger 'redis' needs a redis:// store (--store)")
    sink = RedisStreamSink(settings.store) if kind == "redis" else SqliteSink(settings.usage_path)
    journal = Path(settings.usage_path + ".journal")
    return Ledger(sink, journal, flush_interval_s=settings.usage_flush_interval_s, batch=settings.usage_flush_records)


class ShimApp(Starlette):
    """The shim's Starlette app: it turns the protocol's direct frame writer off where a middleware wraps `send`.

    `ShimWebSocketProtocol` lets the app write event frames straight to the socket, past ASGI `send`;
    a middleware wrapping `send` (an ASGI wrapper around the app, one added with `add_middleware`,
    uvicorn's trace logging) would then not see them. So frames go through `send` unless `send` is
    the protocol's own and the app has no middleware but the shim's.
    """

    OWN_MIDDLEWARE = frozenset({BearerAuth})
    browser_guard = BrowserGuard(frozenset(), frozenset(), loopback_only=False)
    """Refuses what a web page made a browser send (`browsers.py`), before auth and routing."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            refusal = self.browser_guard.refusal(scope.get("method", "GET"), scope["headers"])
            if refusal is not None:
                await deny(scope, receive, send, refusal)
                return
        if scope["type"] == "websocket":
            extension = scope.get("extensions", {}).get(FORCE_CLOSE_EXTENSION)
            if extension is not None and not self._sends_unwrapped(extension, send):
                extension["send_texts"] = None
        await super().__call__(scope, receive, send)

    def _sends_unwrapped(self, extension: dict[str, object], send: Send) -> bool:
        own_send = extension.get("asgi_send")
        return (
            own_send is not None
            and own_send == send
            and all(m.cls in self.OWN_MIDDLEWARE for m in self.user_middleware)
        )
