"""`create_app(settings)`: the Starlette app with its routes and shared state."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from starlette.applications import Starlette
from starlette.routing import Route, WebSocketRoute
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket

from . import http
from .backends import Backend, OpenAICompatibleBackend, SimulatedBackend
from .errors import APIError
from .settings import SIMULATED, Settings
from .state import MemoryResponseStore, ResponseStore
from .turn import Turn, TurnEnv, Validator
from .ws import CLOSE_GOING_AWAY, ResponsesConnection

log = logging.getLogger(__name__)


@dataclass
class ShimStats:
    """Counters a test or an operator can read: what arrived, not what clients meant to send."""

    turns: int = 0
    input_items_received: int = 0
    bytes_received: int = 0
    websocket_connections: int = 0


@dataclass
class ShimState:
    settings: Settings
    env: TurnEnv
    connections: set[ResponsesConnection] = field(default_factory=set)
    stats: ShimStats = field(default_factory=ShimStats)

    def record_turn(self, turn: Turn) -> None:
        self.stats.turns += 1
        self.stats.input_items_received += turn.result.new_items

    async def models(self) -> list[str]:
        return await self.env.backend.models()

    async def close_connections(self, code: int = CLOSE_GOING_AWAY) -> None:
        """Drain and close every WebSocket (code 1001 so clients reconnect elsewhere)."""
        await asyncio.gather(*(conn.close(code) for conn in list(self.connections)), return_exceptions=True)


def build_backend(settings: Settings) -> Backend:
    if settings.backend == SIMULATED:
        return SimulatedBackend(
            ttft_s=settings.simulated_ttft_s,
            tokens_per_s=settings.simulated_tokens_per_s,
            model=settings.default_model,
        )
    return OpenAICompatibleBackend(
        settings.backend, api_key=settings.backend_api_key, timeout_s=settings.backend_timeout_s
    )


def create_app(
    settings: Settings | None = None,
    *,
    backend: Backend | None = None,
    store: ResponseStore | None = None,
    validators: Sequence[Validator] = (),
) -> Starlette:
    settings = settings or Settings()
    env = TurnEnv(
        backend=backend or build_backend(settings),
        store=store or MemoryResponseStore(settings.store_max_responses),
        validators=tuple(validators),
    )
    shim = ShimState(settings, env)

    async def websocket_endpoint(websocket: WebSocket) -> None:
        connection = ResponsesConnection(websocket, shim)
        shim.connections.add(connection)
        shim.stats.websocket_connections += 1
        try:
            await connection.run()
        finally:
            shim.connections.discard(connection)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await shim.close_connections()
        await env.backend.aclose()
        await env.store.aclose()

    routes = [
        WebSocketRoute("/v1/responses", websocket_endpoint),
        Route("/v1/responses", http.create_response, methods=["POST"]),
        Route("/v1/responses/{response_id}", http.get_response, methods=["GET"]),
        Route("/v1/responses/{response_id}", http.delete_response, methods=["DELETE"]),
        Route("/v1/models", http.list_models, methods=["GET"]),
        Route("/healthz", http.healthz, methods=["GET"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.shim = shim
    if settings.api_keys:
        app.add_middleware(BearerAuth, keys=settings.api_keys)
    return app


class BearerAuth:
    """Require `Authorization: Bearer <key>` on every route but `/healthz`; 401 at the upgrade."""

    def __init__(self, app: ASGIApp, keys: Sequence[str]) -> None:
        self.app = app
        self.keys = [key.encode() for key in keys]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or scope["path"] == "/healthz" or self._authorized(scope):
            await self.app(scope, receive, send)
            return
        denial = http.error_response(
            APIError(
                401,
                "invalid_api_key",
                "Missing or invalid API key: send 'Authorization: Bearer <key>'.",
                type="authentication_error",
            )
        )
        if scope["type"] == "http":
            await denial(scope, receive, send)
        else:
            await WebSocket(scope, receive, send).send_denial_response(denial)

    def _authorized(self, scope: Scope) -> bool:
        for name, value in scope["headers"]:
            if name == b"authorization" and value[:7].lower() == b"bearer ":
                presented = value[7:].strip()
                return any(hmac.compare_digest(presented, key) for key in self.keys)
        return False
