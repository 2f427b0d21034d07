"""The responses-ws server shim: Responses API WebSocket mode in front of any inference backend.

What a user needs to run it (`create_app`, `serve`, `BackgroundServer`, `Settings`, `ShimConfig`)
and what a plugin author needs to extend it: the hook marker, the backend protocol with its
request (the conversation as a `History` of Responses items), its deltas and its optional
abilities (`ConnectionScoped`, `ReportsRateLimits`, ...), the validator and classifier
signatures with what they are given, the response store protocol, and the errors to raise.
A chat backend renders the items with `server_shim.backends.chat_convert.chat_prompt`.

The names are imported when first used (`from server_shim import create_app` works as ever): the
`responses-ws` command imports this package first, and `serve` decides whether to run itself again
on the C allocator before it imports the server (`server_shim/allocator.py`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

_HOMES = {
    "APIError": ".errors",
    "Backend": ".backends.base",
    "BackendError": ".errors",
    "BackendFactory": ".backends.base",
    "BackendRequest": ".backends.base",
    "BackgroundServer": ".server",
    "Carry": ".backends.base",
    "Classifier": ".safety",
    "ConnectionScoped": ".backends.base",
    "ContextWindows": ".backends.base",
    "create_app": ".app",
    "CreateRequest": ".requests",
    "Delta": ".backends.base",
    "DeploymentConfig": ".config",
    "Finish": ".backends.base",
    "HasBackgroundWork": ".backends.base",
    "History": ".history",
    "hookimpl": ".hookspecs",
    "HostedToolPolicy": ".backends.base",
    "MemoryResponseStore": ".state",
    "ReportsRateLimits": ".backends.base",
    "ReportsStatus": ".backends.base",
    "ResponseState": ".state",
    "ResponseStore": ".state",
    "Routed": ".backends.base",
    "serve": ".server",
    "ServesModels": ".backends.base",
    "Settings": ".settings",
    "ShimConfig": ".config",
    "TextDelta": ".backends.base",
    "ToolCallDelta": ".backends.base",
    "Usage": ".backends.base",
    "Validator": ".safety",
}
"""The module each public name comes from."""

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


if not TYPE_CHECKING:  # type checkers see the imports above: a misspelt name stays an error for them

    def __getattr__(name: str) -> Any:
        """A public name, imported from its module on first use (then kept here), or a submodule by its name."""
        home = _HOMES.get(name)
        if home is None:
            try:
                return importlib.import_module(f".{name}", __name__)
            except ModuleNotFoundError as exc:
                if exc.name != f"{__name__}.{name}":
                    raise
                raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
        value = getattr(importlib.import_module(home, __name__), name)
        globals()[name] = value
        return value
