"""Facts read from the installed `openai` SDK's types, so the shim accepts what the SDK can send."""

from __future__ import annotations

import typing
from typing import Any


def sdk_literal_types(union: Any) -> frozenset[str]:
    """The `type` values of the TypedDicts in one of the SDK's unions: kept in step with the SDK."""
    kinds: set[str] = set()
    for member in typing.get_args(union):
        hints = typing.get_type_hints(member) if isinstance(member, type) else {}
        kinds.update(a for a in typing.get_args(hints.get("type")) if isinstance(a, str))
    return frozenset(kinds)
