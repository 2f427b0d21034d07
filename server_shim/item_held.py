"""What a batch of conversation items holds, sized by the items' shape rather than walked node by node.

Every turn adds two batches to its history (its input, the response's output) and each is sized for the
byte bounds of the cache and the store. Nearly every turn's items have one of two shapes: a dict of strings
(a message whose content is a string, a function call, a function call's output) or the assistant's message
as the output assembler makes it (`events.OutputAssembler`: one `output_text` part, empty `annotations` and
`logprobs`). Each is sized here by its fields, with its shape checked first (exact types, short keys); a walk
costs a loop iteration per node and the set, stack and key pass around them (~19k instructions for a user
message, ~39k for the assistant's). Any other shape is walked by `footprint`, and so is a batch that holds an
item twice (the walk counts it once).

The figure is `footprint(batch)`'s exactly (tests/test_shim_item_held.py holds it to the definition).
"""

from __future__ import annotations

import sys
from typing import Any

from .footprint import SHARED_KEY_CHARS, footprint

_GC_HEAD = sys.getsizeof([]) - [].__sizeof__()
_STR, _DICT, _LIST, _TUPLE = str.__sizeof__, dict.__sizeof__, list.__sizeof__, tuple.__sizeof__
_all_str = frozenset((str,)).issuperset
_MESSAGE_KEYS = frozenset(("id", "type", "status", "role", "content"))
_MESSAGE_FIELDS = len(_MESSAGE_KEYS)
_PART_KEYS = frozenset(("type", "text", "annotations", "logprobs"))


def batch_footprint(batch: tuple[Any, ...]) -> int:
    """`footprint(batch)`: the tuple, and each item by its shape (`_item_held`); a batch of any other walked."""
    held = _TUPLE(batch) + _GC_HEAD
    for item in batch:
        one = _item_held(item) if type(item) is dict else None
        if one is None:
            return footprint(batch)
        held += one
    if len(batch) > 1 and len(set(map(id, batch))) < len(batch):
        return footprint(batch)
    return held


def _item_held(item: dict[Any, Any]) -> int | None:
    """A dict of strings with short keys, or the assembler's message; None for any other shape."""
    if len(item) == _MESSAGE_FIELDS and item.keys() == _MESSAGE_KEYS:  # first: the string test fails on its content
        held = _message_held(item)
        if held is not None:
            return held
    values = item.values()
    if _all_str(map(type, values)):
        try:
            if max(map(len, item)) <= SHARED_KEY_CHARS:
                return _DICT(item) + _GC_HEAD + sum(map(_STR, values))
        except (TypeError, ValueError):  # a key without a length (a number), or no key at all
            pass
    return None


def _message_held(item: dict[str, Any]) -> int | None:
    """`{id, type, status, role, content: [{type, text, annotations: [], logprobs: []}]}`, every string a str:
    the message, its content list, its part, the part's two distinct empty lists and the six strings."""
    content = item["content"]
    if type(content) is not list or len(content) != 1:
        return None
    part = content[0]
    if type(part) is not dict or part.keys() != _PART_KEYS:
        return None
    annotations, logprobs = part["annotations"], part["logprobs"]
    if type(annotations) is not list or type(logprobs) is not list or annotations or logprobs:
        return None
    strings = (item["id"], item["type"], item["status"], item["role"], part["type"], part["text"])
    if annotations is logprobs or not _all_str(map(type, strings)):
        return None
    lists = _LIST(content) + _LIST(annotations) + _LIST(logprobs)  # an emptied list keeps its room
    return _DICT(item) + _DICT(part) + lists + 5 * _GC_HEAD + sum(map(_STR, strings))
