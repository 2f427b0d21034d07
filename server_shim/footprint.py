"""What a value really holds in memory, for the byte bounds of the connection cache and the store.

`len()` of a JSON encoding is not the cost: a Python dict, list or str has a fixed overhead of
tens of bytes, so 60k tiny items cost megabytes more than their JSON. The footprint walks the
value once and sums `sys.getsizeof` of every node; a container reached twice in one walk is
counted once, short dict keys (shared by the JSON decoder's key cache) are not counted.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Generator, Mapping
from itertools import chain
from typing import Any

SHARED_KEY_CHARS = 64
"""Dict keys up to this length are taken as shared between objects (orjson caches them)."""


_GC_HEAD = sys.getsizeof([]) - [].__sizeof__()
"""What `sys.getsizeof` adds to `__sizeof__` for an object the cyclic collector tracks (dicts, lists, tuples)."""

LEAF_SIZE: dict[type, Any] = {kind: kind.__sizeof__ for kind in (str, int, float, bool, bytes, type(None))}
"""Exact leaf types and their `__sizeof__`, which is what `sys.getsizeof` returns for them (none is tracked
by the collector) at a third of its cost: the walk sizes every node, so this is most of its time."""

_CONTAINER_SIZE: dict[type, Any] = {kind: kind.__sizeof__ for kind in (dict, list, tuple)}
_DICT_SIZE = dict.__sizeof__


def _longest_key(node: dict) -> int:
    """The length of the dict's longest key, found in C (JSON keys are str); any key without a length
    (a number) answers as long, so the exact check runs."""
    try:
        return max(map(len, node), default=0)
    except TypeError:
        return SHARED_KEY_CHARS + 1


STEP_CONTAINERS = 1_000
"""Containers sized between pauses of `footprint_in_slices` (~1-5 ms here): a request's tools or items can
hold ~100,000 values (`max_json_values`), ~100 ms of walking in one go."""


def footprint(value: Any, known: Mapping[int, int] | None = None) -> int:
    """Bytes held by a JSON-like value (dicts, lists, tuples, str, bytes, numbers); iterative.

    Runs on every turn's new items: one loop, no generator, leaves sized inline through their exact
    type's `__sizeof__` (`sys.getsizeof` costs four times as much), the dicts' keys checked for long ones
    once, all dicts together, at the end. The same figure as `footprint_steps` (which pauses for
    `footprint_in_slices`). `known`: the footprints of containers that never change (by `id`), taken as
    they are instead of walked.
    """
    leaf_size = LEAF_SIZE.get
    sizer = leaf_size(type(value))
    if sizer is not None:
        return sizer(value)  # type: ignore[no-any-return]
    total, seen, dicts, stack = 0, set(), [], [value]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if known and id(node) in known:
            total += known[id(node)]
            continue
        kind = type(node)
        if kind is dict:
            total += _DICT_SIZE(node) + _GC_HEAD
            dicts.append(node)
            node = node.values()
        elif kind is list or kind is tuple:
            total += kind.__sizeof__(node) + _GC_HEAD  # type: ignore[call-arg]
        else:
            total += sys.getsizeof(node)
            if not isinstance(node, (dict, list, tuple)):
                continue
            if isinstance(node, dict):
                dicts.append(node)
                node = node.values()
        for child in node:
            sizer = leaf_size(type(child))
            if sizer is None:
                stack.append(child)
            else:
                total += sizer(child)
    return total + _long_keys(dicts) if dicts else total


def _long_keys(dicts: list[Any]) -> int:
    """What the dicts' keys longer than `SHARED_KEY_CHARS` hold: one pass over every key in C, the exact
    sum only when one is long (or has no length)."""
    try:
        if max(map(len, chain.from_iterable(dicts)), default=0) <= SHARED_KEY_CHARS:
            return 0
    except TypeError:  # a key without a length (a number): the exact sum below skips it
        pass
    return sum(sys.getsizeof(k) for d in dicts for k in d if isinstance(k, str) and len(k) > SHARED_KEY_CHARS)


async def footprint_in_slices(value: Any) -> int:
    """`footprint`, giving way to the event loop after every `STEP_CONTAINERS` containers."""
    steps = footprint_steps(value, None, STEP_CONTAINERS)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        await asyncio.sleep(0)


def footprint_steps(value: Any, known: Mapping[int, int] | None, step: int) -> Generator[None, None, int]:
    """The walk behind `footprint`, pausing (yielding None) after every `step` containers (0: never)."""
    total, countdown = 0, step
    seen: set[int] = set()
    stack = [value]
    getsizeof = sys.getsizeof
    leaf_size = LEAF_SIZE.get
    while stack:
        node = stack.pop()
        sizer = leaf_size(type(node))
        if sizer is not None:
            total += sizer(node)
            continue
        if not isinstance(node, (dict, list, tuple)):
            total += getsizeof(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        countdown -= 1
        if countdown == 0:
            countdown = step
            yield
        if known and id(node) in known:
            total += known[id(node)]
            continue
        sizer = _CONTAINER_SIZE.get(type(node))
        total += getsizeof(node) if sizer is None else sizer(node) + _GC_HEAD
        if isinstance(node, dict):
            children: Any = node.values()
            if _longest_key(node) > SHARED_KEY_CHARS:
                total += sum(getsizeof(k) for k in node if isinstance(k, str) and len(k) > SHARED_KEY_CHARS)
        else:
            children = node
        for child in children:
            sizer = leaf_size(type(child))
            if sizer is not None:
                total += sizer(child)
            else:
                stack.append(child)
    return total
