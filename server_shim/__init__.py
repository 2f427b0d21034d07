"""The responses-ws server shim: Responses API WebSocket mode in front of any inference backend.

What a user needs to run it (`create_app`, `serve`, `BackgroundServer`, `Settings`, `ShimConfig`)
and what a plugin author needs to extend it: the hook marker, the backend protocol with its
request (the conversation as a `History` of Responses items), its deltas and its optional
abilities (`ConnectionScoped`, `ReportsRateLimits`, ...), the validator and classifier
signatures with what they are given, the response store protocol, and the errors to raise.
A chat backend renders the items with `server_shim.backends.chat_convert.chat_prompt`.
"""

from __future__ import annotations

from .app import create_app
from .backends.base import (
    Backend,
    BackendFactory,
    BackendRequest,
    Carry,
    ConnectionScoped,
    ContextWindows,
    Delta,
    Finish,
    HasBackgroundWork,
    HostedToolPolicy,
    ReportsRateLimits,
    ReportsStatus,
    Routed,
    ServesModels,
    TextDelta,
    ToolCallDelta,
    Usage,
)
from .config import DeploymentConfig, ShimConfig
from .errors import APIError, BackendError
from .history import History
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
    "Carry",
    "Classifier",
    "ConnectionScoped",
    "ContextWindows",
    "CreateRequest",
    "Delta",
    "DeploymentConfig",
    "Finish",
    "HasBackgroundWork",
    "History",
    "HostedToolPolicy",
    "MemoryResponseStore",
    "ReportsRateLimits",
    "ReportsStatus",
    "ResponseState",
    "ResponseStore",
    "Routed",
    "ServesModels",
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
