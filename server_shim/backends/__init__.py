"""Inference backends behind one small protocol."""

from __future__ import annotations

from .base import Backend, BackendRequest, Delta, Finish, TextDelta, ToolCallDelta, Usage
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
