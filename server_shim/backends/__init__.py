"""Inference backends behind one small protocol (`base`), with optional abilities as their own protocols.

The concrete backends load on first use, so importing the protocol pulls in no HTTP client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .base import Backend, BackendRequest, Delta, Finish, TextDelta, ToolCallDelta, Usage

if TYPE_CHECKING:
    from .openai_compatible import OpenAICompatibleBackend
    from .simulated import SimulatedBackend

__all__ = [
    "Backend",
    "BackendRequest",
    "Delta",
    "Finish",
    "OpenAICompatibleBackend",
    "SimulatedBackend",
    "TextDelta",
    "ToolCallDelta",
    "Usage",
]


def __getattr__(name: str) -> Any:
    if name == "OpenAICompatibleBackend":
        from .openai_compatible import OpenAICompatibleBackend

        return OpenAICompatibleBackend
    if name == "SimulatedBackend":
        from .simulated import SimulatedBackend

        return SimulatedBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
