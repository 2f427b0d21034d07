"""What a value really holds in memory, for the byte bounds of the connection cache and the store.

`len()` of a JSON encoding is not the cost: a Python dict, list or str has a fixed overhead of
tens of bytes, so 60k tiny items cost megabytes more than their JSON. The footprint walks the
value once and sums `sys.getsizeof` of every node; a container reached twice in one walk is
counted once, short dict keys (shared by the JSON decoder's key cache) are not counted.
"""

from __future__ import annotations

import sys
from typing import Any

SHARED_KEY_CHARS = 64
"""Dict keys up to this length are taken as shared between objects (orjson caches them)."""


LEAVES = frozenset({str, int, float, bool, type(None), bytes})
"""Exact types counted where they are met, without a trip through the walk's stack."""


def footprint(value: Any) -> int:
    """Bytes held by a JSON-like value (dicts, lists, tuples, str, bytes, numbers); iterative.

    Runs on every turn's new items and response: leaves are sized inline, which makes the walk
    about 40% cheaper than pushing every node.
    """
    total = 0
    seen: set[int] = set()
    stack = [value]
    getsizeof = sys.getsizeof
    while stack:
        node = stack.pop()
        if not isinstance(node, (dict, list, tuple)):
            total += getsizeof(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        total += getsizeof(node)
        if isinstance(node, dict):
            total += sum(getsizeof(k) for k in node if isinstance(k, str) and len(k) > SHARED_KEY_CHARS)
            children: Any = node.values()
        else:
            children = node
        for child in children:
            if type(child) in LEAVES:
                total += getsizeof(child)
            else:
                stack.append(child)
    return total
