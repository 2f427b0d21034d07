"""The responses-ws server shim: Responses API WebSocket mode in front of any inference backend."""

from __future__ import annotations

from .app import ShimState, create_app
from .errors import APIError, BackendError
from .server import BackgroundServer, ShimServer, serve
from .settings import Settings
from .state import ConnectionCache, MemoryResponseStore, ResponseState, ResponseStore
from .turn import TurnEnv, Validator

__all__ = [
    "APIError",
    "BackendError",
    "BackgroundServer",
    "ConnectionCache",
    "MemoryResponseStore",
    "ResponseState",
    "ResponseStore",
    "Settings",
    "ShimServer",
    "ShimState",
    "TurnEnv",
    "Validator",
    "create_app",
    "serve",
]
