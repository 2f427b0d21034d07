"""Every hook responses-ws calls, client and server, in one place.

Implement a hook by decorating a function of the same name with `@hookimpl` in a module or
class, and register it through the `responses_ws` entry-point group:

    [project.entry-points.responses_ws]
    my_plugin = "my_package.my_plugin"

The server's hooks (backend kinds, validators, classifiers, post-inference sinks) are defined
in `server_shim.hookspecs`, where the server loads them without this package, and re-exported
here; their docstrings say when each is called, in what order, who wins and what errors do.
`hookimpl` is the same marker in both places. The built-in plugins (`server_shim.backends.kinds`,
`server_shim.usage_log`) are registered the same way, before the entry points, so a
third-party plugin can do anything they do, and replace a built-in backend kind.

Client-side hooks reach a client wrapped by `plugins.transport.wrap` (the LangChain and Agents
SDK integrations use it); `ws_transport.wrap` alone calls no plugin.
"""

from __future__ import annotations

from typing import Any

from server_shim.hookspecs import (
    PROJECT,
    hookimpl,
    hookspec,
    responses_ws_backend_kinds,
    responses_ws_checks,
    responses_ws_classifiers,
    responses_ws_response_finished,
    responses_ws_validators,
)

SERVER_HOOKS = (
    "responses_ws_backend_kinds",
    "responses_ws_validators",
    "responses_ws_classifiers",
    "responses_ws_checks",
    "responses_ws_response_finished",
)
CLIENT_HOOKS = ("responses_ws_transport_options", "responses_ws_client_request", "responses_ws_client_event")

__all__ = [
    "CLIENT_HOOKS",
    "PROJECT",
    "SERVER_HOOKS",
    "hookimpl",
    "hookspec",
    "responses_ws_backend_kinds",
    "responses_ws_checks",
    "responses_ws_classifiers",
    "responses_ws_client_event",
    "responses_ws_client_request",
    "responses_ws_response_finished",
    "responses_ws_transport_options",
    "responses_ws_validators",
]


@hookspec(firstresult=True)
def responses_ws_transport_options(client: Any) -> dict[str, Any] | None:
    """Default `ws_transport.SessionOptions` fields for a client wrapped by `plugins.transport.wrap`; sync.

    Called once per `wrap()`. The first non-None answer in pluggy's call order wins (the
    later-registered plugin first); explicit keyword arguments to `wrap()` override it. An
    exception propagates out of `wrap()`.
    """


@hookspec
def responses_ws_client_request(request: dict[str, Any]) -> None:
    """Called with each `response.create` payload as the transport sends it (after chaining); sync.

    Each plugin gets its own copy of what goes on the wire, for logging, tracing or accounting;
    changes to it are not sent. Runs on the transport's event loop, so keep it quick. Errors are
    logged and never fail the request.
    """


@hookspec
def responses_ws_client_event(event: dict[str, Any]) -> None:
    """Called with each server event of a turn (a JSON object, its own copy) before the caller sees it; sync.

    Errors are logged and never fail the request.
    """
