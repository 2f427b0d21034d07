"""The footprint's definition, as plainly as it can be written: the reference the fast sizes are held to."""

from __future__ import annotations

import sys
from typing import Any

SHARED_KEY_CHARS = 64


def footprint_by_definition(value: Any, seen: set[int] | None = None) -> int:
    """Every node's `sys.getsizeof`, each container once per walk, and dict keys longer than 64 characters."""
    seen = set() if seen is None else seen
    if not isinstance(value, (dict, list, tuple)):
        return sys.getsizeof(value)
    if id(value) in seen:
        return 0
    seen.add(id(value))
    total = sys.getsizeof(value)
    if isinstance(value, dict):
        total += sum(sys.getsizeof(k) for k in value if isinstance(k, str) and len(k) > SHARED_KEY_CHARS)
        children = list(value.values())
    else:
        children = list(value)
    return total + sum(footprint_by_definition(child, seen) for child in children)
