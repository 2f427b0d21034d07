"""The two HTTP libraries `openai` clients are built on: `httpx2` (openai 3.x) and `httpx` (1.x, 2.x).

They have the same API under two names, and a client only accepts answers made with its own
(`httpx` checks that a response's stream is one of its `AsyncByteStream`s). So the transport
answers each request with the library the request was made with, and its stream and transport
classes derive from both libraries' base classes. `httpx` is optional: without it, only
`httpx2`-based clients exist.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import httpx2

try:
    import httpx
except ImportError:  # pragma: no cover - httpx comes with openai 1.x/2.x, and usually with 3.x's neighbours
    httpx = None  # type: ignore[assignment]

MODULES: tuple[ModuleType, ...] = (httpx2,) if httpx is None else (httpx2, httpx)


def module_of(request: Any) -> Any:
    """The library `request` (or a response, or an URL) belongs to: answers must be made with it."""
    if httpx is not None and isinstance(request, (httpx.Request, httpx.Response, httpx.URL)):
        return httpx
    return httpx2


def bases(name: str) -> tuple[type, ...]:
    """The class `name` of each library, to derive from all of them."""
    return tuple(getattr(module, name) for module in MODULES)
