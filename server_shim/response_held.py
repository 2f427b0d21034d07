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
from contextlib import suppress
from itertools import compress
from operator import is_not, itemgetter
from typing import Any, Protocol

import orjson

from .events import ECHO_DEFAULTS
from .footprint import LEAF_SIZE, footprint

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

_SCALAR_KEYS = ("id", "object", "status", "model", "previous_response_id", "created_at", "store", "completed_at")
"""The scalar fields `response_object` writes beside the echo, and the echoed id of the previous response (a string
in every chained turn, so sized as one rather than looked for among the defaults), in `_scalars_held`'s order."""
_DEFAULT_KEYS = tuple(key for key in ECHO_DEFAULTS if key not in NOT_HELD and key not in _SCALAR_KEYS)
_DEFAULT_VALUES = tuple(ECHO_DEFAULTS[key] for key in _DEFAULT_KEYS)
_DEFAULT_HELD = tuple(footprint(value) for value in _DEFAULT_VALUES)
_DEFAULT_KEY_SET = frozenset(_DEFAULT_KEYS)
_ALL_DEFAULTS_HELD = sum(_DEFAULT_HELD)
_defaults_of = itemgetter(*_DEFAULT_KEYS)


_scalars_of = itemgetter(*_SCALAR_KEYS)
_SCALAR_TYPES = tuple(
    (str, str, str, str, previous, int, bool, completed)
    for previous in (str, type(None))
    for completed in (int, type(None))
)
_PARTS = ("error", "incomplete_details", "metadata")
_parts_of = itemgetter(*_PARTS, "usage", *NOT_HELD)
"""With the fields not held: a response with every field `response_object` writes, and as many, has no other."""
_STANDARD_FIELDS = len(ECHO_DEFAULTS | dict.fromkeys(_SCALAR_KEYS)) + len(_PARTS) + 2  # and output, usage
_STR, _INT, _DICT = str.__sizeof__, int.__sizeof__, dict.__sizeof__
_NONE = sys.getsizeof(None)
_GC_HEAD = sys.getsizeof({}) - _DICT({})
_EMPTY = {kind: kind.__sizeof__ for kind in (dict, list, tuple)}
_usage_of = itemgetter("input_tokens", "output_tokens", "total_tokens", "input_tokens_details", "output_tokens_details")
_input_details_of = itemgetter("cached_tokens", "cache_write_tokens")
_INTS = frozenset((int,))
_HOLDER = sys.getsizeof((None,))
"""The tuple of the response and `others` the definition walks, without `others`."""


def response_held(response: dict[str, Any], others: tuple[Any, ...], known: Mapping[int, int] | None) -> int:
    """`footprint((response without its output and tools, *others))`, the defaults it echoes taken as measured.

    A response as `response_object` makes it (its fields and no other, each of the type it writes) is sized
    field by field (`_standard_held`); any other has its fields that are not defaults walked together.
    `known`: footprints of further containers, by `id` (the request's echoed ones, measured in slices).
    """
    try:
        present = _defaults_of(response)
    except KeyError:  # not made by `response_object` (every one of those echoes every default field)
        return footprint(({k: v for k, v in response.items() if k not in NOT_HELD}, *others), known)
    differs = tuple(map(is_not, present, _DEFAULT_VALUES))
    defaults = _ALL_DEFAULTS_HELD - sum(compress(_DEFAULT_HELD, differs))  # the fields that echo a default
    held = _standard_held(response, present, differs, others, known) if len(response) == _STANDARD_FIELDS else None
    if held is not None:
        return held + defaults
    rest = response.keys() - NOT_HELD - (_DEFAULT_KEY_SET - set(compress(_DEFAULT_KEYS, differs)))
    values = tuple(map(response.__getitem__, rest))
    walked = footprint((values, *others), {**ECHO_DEFAULT_SIZES, **known} if known else ECHO_DEFAULT_SIZES)
    # the dict itself stands in for the tuple of its walked values the walk counted
    return walked - sys.getsizeof(values) + sys.getsizeof(response) + defaults


WRITTEN = ("id", "status", "previous_response_id", "created_at", "completed_at", "error", "incomplete_details")
"""With `metadata`, `usage` and the output: the fields `response_object` writes into a copy of its memo's template, in
`_written_of`'s order; every other field of such a copy is the template's own object."""
_written_of = itemgetter(*WRITTEN, "metadata", "usage")
_WRITTEN_TYPES = frozenset(
    (str, str, previous, int, completed) for previous in (str, type(None)) for completed in (int, type(None))
)


class Template(Protocol):
    """The memo a Response object was copied from (`events.ResponseMemo`), with the footprint of what it echoes."""

    response_template: dict[str, Any] | None
    template_held: int | None


def made_held(
    response: dict[str, Any], others: tuple[Any, ...], memo: Template, known: Mapping[int, int] | None
) -> int:
    """`response_held` for a response `response_object` has just copied from `memo`'s template: the fields it did not
    write (the echo) are the template's objects, measured once per memo; only the fields it wrote are sized here.
    Any other response (not the template's length) is sized by `response_held`."""
    template = memo.response_template
    if template is None or len(response) != len(template):
        return response_held(response, others, known)
    echoed = memo.template_held
    if echoed is None:
        echoed = memo.template_held = _template_held(template, known)
    id_, status, previous, created, completed, error, incomplete, metadata, usage = _written_of(response)
    if (type(id_), type(status), type(previous), type(created), type(completed)) not in _WRITTEN_TYPES:
        return response_held(response, others, known)
    walk: list[Any] = []
    held = (
        echoed
        + _DICT(response)
        + _GC_HEAD
        + _HOLDER
        + len(others) * tuple.__itemsize__
        + _STR(id_)
        + _STR(status)
        + (_NONE if previous is None else _STR(previous))
        + _INT(created)
        + (_NONE if completed is None else _INT(completed))
    )
    if error is None and incomplete is None and not metadata and not any(others):  # most turns: nothing in them
        held += 2 * _NONE + sum(map(sys.getsizeof, (metadata, *others)))  # an empty container's all, as walked
    else:
        held += _apart((error, incomplete, metadata, *others), walk)
    usage_held = _usage_held(usage)
    if usage_held is None:
        walk.append(usage)
    else:
        held += usage_held
    if walk:
        walked = tuple(walk)
        held += footprint(walked, known) - sys.getsizeof(walked)
    return held


def _template_held(template: dict[str, Any], known: Mapping[int, int] | None) -> int:
    """What the template's echoed fields hold (those `response_object` does not write, but the output and tools),
    encoded first: a non-ASCII string holds a UTF-8 copy once encoded, as each response echoing it soon is."""
    skipped = NOT_HELD.union(WRITTEN, ("metadata", "usage"))
    values = tuple(value for key, value in template.items() if key not in skipped)
    with suppress(TypeError):  # orjson.JSONEncodeError: not JSON (never sent as it is), walked as it is
        orjson.dumps(values)
    walked = footprint(values, {**ECHO_DEFAULT_SIZES, **known} if known else ECHO_DEFAULT_SIZES)
    return walked - sys.getsizeof(values)


def _standard_held(
    response: dict[str, Any],
    present: tuple[Any, ...],
    differs: tuple[bool, ...],
    others: tuple[Any, ...],
    known: Mapping[int, int] | None,
) -> int | None:
    """What a `response_object` response holds beside the fields echoing a default (the caller adds those), its
    fields sized by what they are rather than walked: the scalars by their type's `__sizeof__`, `usage` by its
    fixed shape, leaves and empty containers as they are; what is left (a request's echoed value, a non-empty
    `metadata`, `carry`...) walked together.
    None: a field is missing or not of the type `response_object` writes.

    The full walk's figure, unless a container sized apart (`usage`, an empty one) is also held by another
    part (the shim never builds one): it is then counted once more, so the figure is above the walk's, never
    below.
    """
    try:
        scalars = _scalars_of(response)
        error, incomplete, metadata, usage, _, _ = _parts_of(response)
    except KeyError:
        return None
    if tuple(map(type, scalars)) not in _SCALAR_TYPES:
        return None
    walk: list[Any] = []
    total = (
        _DICT(response)
        + _GC_HEAD
        + _HOLDER
        + len(others) * tuple.__itemsize__  # the tuple the definition walks from, as `footprint` counts it
        + _scalars_held(*scalars)
        + _apart((error, incomplete, metadata, *others, *compress(present, differs)), walk)
    )
    usage_held = _usage_held(usage)
    if usage_held is None:
        walk.append(usage)
    else:
        total += usage_held
    if walk:
        walked = tuple(walk)
        total += footprint(walked, known) - sys.getsizeof(walked)
    return total


def _scalars_held(
    id_: str, object_: str, status: str, model: str, previous: Any, created_at: int, store: bool, completed: Any
) -> int:
    """The scalar fields, each of the exact type `_SCALAR_TYPES` checked (`previous_response_id` a str or None,
    `completed_at` an int or None)."""
    held = _STR(id_) + _STR(object_) + _STR(status) + _STR(model) + _INT(created_at) + _INT(store)
    return held + (_NONE if previous is None else _STR(previous)) + (_NONE if completed is None else _INT(completed))


def _apart(values: tuple[Any, ...], walk: list[Any]) -> int:
    """What the leaves and empty containers among `values` hold; the other values are added to `walk`."""
    held = 0
    for value in values:
        if value is None:  # most of them: `error`, `incomplete_details`, an unset field
            held += _NONE
            continue
        kind = type(value)
        sizer = LEAF_SIZE.get(kind)
        if sizer is not None:
            held += sizer(value)
        elif kind in _EMPTY and not value:
            held += _EMPTY[kind](value) + _GC_HEAD
        else:
            walk.append(value)
    return held


def _usage_held(usage: Any) -> int | None:
    """The `usage` dict as `response_object` writes it (five keys, two dicts of details, six ints), sized by
    its three dicts and six ints; None when it is anything else (None, another shape, a float), to walk."""
    if type(usage) is not dict or len(usage) != 5:
        return None
    try:
        inputs, outputs, total, input_details, output_details = _usage_of(usage)
        if type(input_details) is not dict or type(output_details) is not dict:
            return None
        if len(input_details) != 2 or len(output_details) != 1:
            return None
        counts = (inputs, outputs, total, *_input_details_of(input_details), output_details["reasoning_tokens"])
    except KeyError:
        return None
    if _INTS.issuperset(map(type, counts)):
        return _DICT(usage) + _DICT(input_details) + _DICT(output_details) + 3 * _GC_HEAD + sum(map(_INT, counts))
    return None
