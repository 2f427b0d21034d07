"""What a Response object holds, for its state's byte bound, without walking the fields it shares with every other.

A Response object echoes ~20 request fields; in most turns nearly all of them are the API's defaults,
the very objects in `ECHO_DEFAULTS` (`echoed_fields` copies references, not values). Walking them every
turn was most of what sizing a turn cost. Their footprints are measured once here, and a response is
charged the measured figure for each field that holds its default object (checked by identity, in C),
and walks only the rest: the fields the request set, the outcome (`id`, `usage`, `error`, ...) and
anything else the dict holds. The sum is the same figure `footprint` gives for the whole dict (the
tests compare them on hostile shapes): nothing is estimated.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from itertools import compress
from operator import is_, itemgetter
from typing import Any

from .events import ECHO_DEFAULTS
from .footprint import footprint

NOT_HELD = frozenset(("output", "tools"))
"""Fields a state sizes elsewhere: the output is in the history, the tools are counted with the state's list."""


def _sizes(containers: Iterable[Any]) -> dict[int, int]:
    """The footprint of each container and of every container inside it, by `id`."""
    sizes: dict[int, int] = {}
    stack = [c for c in containers if isinstance(c, (dict, list))]
    while stack:
        container = stack.pop()
        sizes[id(container)] = footprint(container)
        stack.extend(
            c for c in (container.values() if isinstance(container, dict) else container) if isinstance(c, (dict, list))
        )
    return sizes


ECHO_DEFAULT_SIZES = _sizes(ECHO_DEFAULTS.values())
"""The Response object's echoed defaults (`reasoning`, `text`, ...) are the same objects in every response and
never change: their footprints are taken from here rather than walked every turn."""

_DEFAULT_KEYS = tuple(key for key in ECHO_DEFAULTS if key not in NOT_HELD)
_DEFAULT_VALUES = tuple(ECHO_DEFAULTS[key] for key in _DEFAULT_KEYS)
_DEFAULT_HELD = tuple(footprint(value) for value in _DEFAULT_VALUES)
_defaults_of = itemgetter(*_DEFAULT_KEYS)


def response_held(response: dict[str, Any], others: tuple[Any, ...], known: Mapping[int, int] | None) -> int:
    """`footprint((response without its output and tools, *others))`, the defaults it echoes taken as measured.

    `known`: footprints of further containers, by `id` (the request's echoed ones, measured in slices).
    """
    try:
        present = _defaults_of(response)
    except KeyError:  # not made by `response_object` (every one of those echoes every default field)
        return footprint(({k: v for k, v in response.items() if k not in NOT_HELD}, *others), known)
    same = tuple(map(is_, present, _DEFAULT_VALUES))
    rest = response.keys() - NOT_HELD - set(compress(_DEFAULT_KEYS, same))
    values = tuple(map(response.__getitem__, rest))
    walked = footprint((values, *others), {**ECHO_DEFAULT_SIZES, **known} if known else ECHO_DEFAULT_SIZES)
    # the dict itself stands in for the tuple of its walked values the walk counted
    return walked - sys.getsizeof(values) + sys.getsizeof(response) + sum(compress(_DEFAULT_HELD, same))
