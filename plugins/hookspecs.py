"""Every hook responses-ws calls, client and server, in one place.

Implement a hook by decorating a function of the same name with `@hookimpl` in a module or
class, and register it through the `responses_ws` entry-point group:

    [project.entry-points.responses_ws]
    my_plugin = "my_package.my_plugin"

First-party plugins (`plugins/builtin/`) are registered the same way, so a third-party
plugin can do anything they do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from server_shim.backends.base import Backend
    from server_shim.settings import Settings
    from server_shim.turn import Validator

PROJECT = "responses_ws"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


# Server side ------------------------------------------------------------------------------


@hookspec
def responses_ws_backend_kinds() -> dict[str, Callable[..., Backend]]:
    """Backend kinds this plugin provides, as `{kind: factory}`.

    Called once when the server starts. A factory is called with the deployment's settings
    as keyword arguments and returns an object implementing `server_shim.backends.Backend`.
    A later-registered plugin wins on a duplicate kind.
    """


@hookspec
def responses_ws_validators(settings: Settings) -> list[Validator]:
    """Validators for new input items, called once at start-up.

    Each validator is called per turn as `validator(new_items, previous_state, request)`: it sees
    only the items that arrived on this turn plus the cached state (read-only), and raises
    `server_shim.APIError` to refuse the request. The connection and its cache are unchanged
    after a refusal. Keep them fast: they run on every turn before inference.
    """


@hookspec
def responses_ws_classifiers(settings: Settings) -> list[Callable[[list[dict[str, Any]]], dict[str, str]]]:
    """Classifiers for new input items, called once at start-up.

    Each classifier gets the new items of a turn and returns labels (`{name: value}`) that the
    server adds to the response's `metadata` under `classifier.<name>`. Like validators, they
    see only what is new.
    """


@hookspec
def responses_ws_response_finished(response: dict[str, Any], transport: str) -> Awaitable[None] | None:
    """Post-inference work (usage, billing, audit), called after a response's terminal event.

    `transport` is "websocket" or "http". Called after the client has the terminal event, in a
    background task, so it overlaps the client's next request instead of delaying it. May return
    an awaitable; errors are logged, never sent to the client.
    """


# Client side ------------------------------------------------------------------------------


@hookspec(firstresult=True)
def responses_ws_transport_options(client: Any) -> dict[str, Any] | None:
    """Default `ws_transport.SessionOptions` fields for a client wrapped by `plugins.transport.wrap`
    (the LangChain and Agents SDK integrations use it); the first non-None answer wins.

    Explicit keyword arguments to `wrap()` override these.
    """


@hookspec
def responses_ws_client_request(request: dict[str, Any]) -> None:
    """Called with each `response.create` payload as the transport sends it (after chaining).

    The payload is a copy of what goes on the wire, for logging, tracing or accounting; changes
    to it are not sent. Errors are logged and never fail the request.
    """


@hookspec
def responses_ws_client_event(event: dict[str, Any]) -> None:
    """Called with each server event of a turn (a JSON object) before the caller sees it.

    Errors are logged and never fail the request.
    """
