"""`wrap()` with the plugins in it: the client-side hooks applied to a `ws_transport` session.

`ws_transport` knows nothing of plugins (it can be used alone); this is where the
`responses_ws_transport_options`, `responses_ws_client_request` and `responses_ws_client_event`
hooks reach it. The framework integrations wrap their clients through here.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from openai import AsyncOpenAI, OpenAI
from pluggy import HookCaller

import ws_transport

from .manager import plugin_manager

log = logging.getLogger(__name__)

ClientT = TypeVar("ClientT", OpenAI, AsyncOpenAI)


def wrap(client: ClientT, **options: Any) -> ClientT:
    """`ws_transport.wrap(client, ...)`: plugin defaults first, explicit `options` win; plugin observers attached."""
    hook = plugin_manager().hook
    settings: dict[str, Any] = dict(hook.responses_ws_transport_options(client=client) or {})
    if hook.responses_ws_client_request.get_hookimpls():
        settings["on_request"] = _each(hook.responses_ws_client_request, "request")
    if hook.responses_ws_client_event.get_hookimpls():
        settings["on_event"] = _each(hook.responses_ws_client_event, "event")
    settings.update(options)
    return ws_transport.wrap(client, **settings)


def _each(hook: HookCaller, argname: str) -> Callable[[dict[str, Any]], None]:
    """Call every plugin's observer on its own copy, so one that fails or mutates hides nothing from the others."""

    def observe(payload: dict[str, Any]) -> None:
        for impl in reversed(hook.get_hookimpls()):
            try:
                impl.function(**{argname: copy.deepcopy(payload)})
            except Exception:
                log.exception("observer of plugin %s failed", impl.plugin_name)

    return observe
