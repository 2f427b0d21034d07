"""`wrap()` with the plugins in it: the client-side hooks applied to a `ws_transport` session.

`ws_transport` knows nothing of plugins (it can be used alone); this is where the
`responses_ws_transport_options`, `responses_ws_client_request` and `responses_ws_client_event`
hooks reach it. The framework integrations wrap their clients through here.
"""

from __future__ import annotations

from typing import Any, TypeVar

from openai import AsyncOpenAI, OpenAI

import ws_transport

from .manager import plugin_manager

ClientT = TypeVar("ClientT", OpenAI, AsyncOpenAI)


def wrap(client: ClientT, **options: Any) -> ClientT:
    """`ws_transport.wrap(client, ...)`: plugin defaults first, explicit `options` win; plugin observers attached."""
    hook = plugin_manager().hook
    settings: dict[str, Any] = dict(hook.responses_ws_transport_options(client=client) or {})
    if hook.responses_ws_client_request.get_hookimpls():
        settings["on_request"] = lambda payload: hook.responses_ws_client_request(request=payload)
    if hook.responses_ws_client_event.get_hookimpls():
        settings["on_event"] = lambda event: hook.responses_ws_client_event(event=event)
    settings.update(options)
    return ws_transport.wrap(client, **settings)
