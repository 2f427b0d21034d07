"""The responses-ws server shim: Responses API WebSocket mode in front of any inference backend.

What a user needs to run it (`create_app`, `serve`, `BackgroundServer`, `Settings`, `ShimConfig`)
and what a plugin author needs to extend it: the hook marker, the backend protocol and its
request and deltas, the validator and classifier signatures with what they are given, the
response store protocol, and the errors to raise.
"""

from __future__ import annotations

from .app import create_app
from .backends.base import (
    Backend,
    BackendFactory,
    BackendRequest,
    Delta,
    Finish,
    TextDelta,
    ToolCallDelta,
    Usage,
)
from .config import DeploymentConfig, ShimConfig
from .errors import APIError, BackendError
from .hookspecs import hookimpl
from .requests import CreateRequest
from .safety import Classifier, Validator
from .server import BackgroundServer, serve
from .settings import Settings
from .state import MemoryResponseStore, ResponseState, ResponseStore

__all__ = [
    "APIError",
    "Backend",
    "BackendError",
    "BackendFactory",
    "BackendRequest",
    "BackgroundServer",
    "Classifier",
    "CreateRequest",
    "Delta",
    "DeploymentConfig",
    "Finish",
    "MemoryResponseStore",
    "ResponseState",
    "ResponseStore",
    "Settings",
    "ShimConfig",
    "TextDelta",
    "ToolCallDelta",
    "Usage",
    "Validator",
    "create_app",
    "hookimpl",
    "serve",
]
