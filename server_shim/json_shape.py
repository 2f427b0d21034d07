"""How many values a JSON document holds and how deep it nests, read from its text before it is parsed.

Every later pass over a request (the depth and tool-schema checks, validation, the memory footprint, the
copies made for the backend and the Response) costs time per value, on the event loop. A frame of a few
MiB can hold millions of values (70,000 lists 61 deep in 8 MiB): walking it holds every other connection
for seconds. So the values are counted first, from the text, by a handful of C passes over it (`bytes.replace`,
`split`, `translate`, `count`), a slice at a time; a document over the bound is refused before it is
parsed, at a cost proportional to the bound, and one under it is parsed and walked at a cost the bound caps.

The count, for valid JSON, is exact: every scalar, array and object is one value (object keys are not), so
it is 1 + the commas + the non-empty containers, counted outside strings. Strings are found by their quotes
once escaped backslashes and escaped quotes are removed. The depth (a scalar 0, `[]` 1) is found on the
document's brackets alone (`depth`). For text that is not valid JSON the figures mean nothing; the parse refuses it (unless it
is over the bound first, which is refused as such).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import NamedTuple

STEP_BYTES = 64 * 1024
"""Text measured between pauses: the C passes over it take ~0.1-0.3 ms here."""

_WHITESPACE = b" \t\n\r"
_NOT_BRACKETS = bytes(c for c in range(256) if c not in b"[]{}")
_AS_BRACKETS = bytes.maketrans(b"{}", b"[]")
MAX_DEPTH = 1024
"""orjson's nesting limit: a deeper document is not JSON here, whatever its depth."""
_BACKSLASH = ord("\\")


class Shape(NamedTuple):
    """What a document holds: its values (scalars, arrays, objects) and its depth; from `bounds`, at most these.

    A named tuple: a frozen dataclass's `__init__` alone cost ~4,000 instructions, for each frame.
    """

    values: int
    depth: int


_shape = functools.partial(tuple.__new__, Shape)
"""`Shape(values, depth)` made in C (a named tuple's `__new__` is Python: ~1,000 instructions more per frame)."""


class TooManyValues(ValueError):
    """The document holds more than `limit` values (counting stopped past it: `seen` is a lower bound)."""

    def __init__(self, seen: int, limit: int) -> None:
        super().__init__(f"more than {limit} JSON values")
        self.seen, self.limit = seen, limit


@dataclass(slots=True)
class _Count:
    """The running count across slices: what a slice needs from the ones before it."""

    values: int = 1
    in_string: bool = False
    last: int = -1  # the last structural character so far (an empty container may straddle two slices)
    brackets: list[bytes] = field(default_factory=list)  # each slice's brackets, braces as brackets

    def add(self, structure: bytes) -> None:
        """Count one slice's structure (strings reduced to one quote each, no whitespace)."""
        if not structure:
            return
        opens = structure.count(b"[") + structure.count(b"{")
        empties = structure.count(b"[]") + structure.count(b"{}")
        if (self.last, structure[0]) in ((0x5B, 0x5D), (0x7B, 0x7D)):
            empties += 1
        self.values += structure.count(b",") + opens - empties
        self.last = structure[-1]
        if opens or b"]" in structure or b"}" in structure:
            self.brackets.append(structure.translate(_AS_BRACKETS, _NOT_BRACKETS))


def depth(brackets: bytes, cap: int) -> int:
    """The nesting depth of a balanced string of brackets, or `cap + 1` when deeper than `cap`.

    Each `replace` pass removes the innermost pairs (it does not rescan what it wrote): one C pass per level,
    cheap while a pass removes much (many small containers). Where a pass removes little (a few deep,
    narrow nests) the rest is read as runs of brackets instead, a Python step per run: there are about as
    many runs as the pass removed.
    """
    passes = 0
    while brackets:
        if passes == cap:
            return cap + 1
        shorter = brackets.replace(b"[]", b"")
        passes += 1
        if (len(brackets) - len(shorter)) * _FEW_REMOVED < len(brackets):
            return min(cap + 1, passes + _deepest_run(shorter))
        brackets = shorter
    return passes


_FEW_REMOVED = 32
_RUNS = re.compile(rb"\[+|\]+")


def _deepest_run(brackets: bytes) -> int:
    level = deepest = 0
    for run in _RUNS.findall(brackets):
        if run[0] == 0x5B:
            level += len(run)
            deepest = max(deepest, level)
        else:
            level -= len(run)
    return deepest


def bounds(data: str | bytes, nbytes: int, max_values: int, max_depth: int) -> Shape | None:
    """Upper bounds on the document's values and depth from two counts over its whole text (strings
    included), when they settle both limits; None when they do not (then `measure_steps` counts exactly).

    Each value takes at least one byte of its own, so a document of `nbytes` < `max_values` bytes cannot hold
    too many (nor could text that is not JSON count as many: the count is at most 1 + its commas and openers).
    Nothing nests deeper than the number of `[` and `{` in the text: a chained turn's frame (a few objects)
    is settled here for ~2,000 instructions, against ~40,000-70,000 for the exact count of the same bytes.
    """
    if not 0 < nbytes < max_values:
        return None
    opens = data.count("[") + data.count("{") if isinstance(data, str) else data.count(b"[") + data.count(b"{")
    return _shape((nbytes + 1, opens)) if opens <= max_depth else None


def measure(data: str | bytes, max_values: int = 0, max_depth: int = MAX_DEPTH) -> Shape:
    """`measure_steps` without pauses (small documents, tests)."""
    steps = measure_steps(data, max_values, max_depth)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]


def measure_steps(
    data: str | bytes, max_values: int = 0, max_depth: int = MAX_DEPTH, step: int = STEP_BYTES
) -> Generator[None, None, Shape]:
    """The document's shape, pausing (yielding None) after each `step` of text; its depth exact up to
    `max_depth` (`max_depth + 1`: deeper).

    Raises `TooManyValues` as soon as the count passes `max_values` (0: no bound), so refusing a huge
    document costs about as much as measuring `max_values` values of it.
    """
    count, start = _Count(), 0
    while start < len(data):
        end = _slice_end(data, start + step)
        chunk = data[start:end]
        count.add(_structure(chunk.encode("utf-8", "surrogatepass") if isinstance(chunk, str) else chunk, count))
        if 0 < max_values < count.values:
            raise TooManyValues(count.values, max_values)
        start = end
        if start < len(data):
            yield
    return Shape(count.values, depth(b"".join(count.brackets), max_depth))


def _slice_end(data: str | bytes, end: int) -> int:
    """Where a slice may end: never inside a run of backslashes or between one and the character it escapes."""
    backslash: int | str = _BACKSLASH if isinstance(data, bytes) else "\\"
    while end < len(data) and data[end - 1] == backslash:
        end += 1
    return min(end, len(data))


def _structure(chunk: bytes, count: _Count) -> bytes:
    """The slice's text outside strings, each string (or part of one) as a single quote, without whitespace;
    updates whether the slice ends inside a string."""
    if b"\\" in chunk:
        chunk = chunk.replace(b"\\\\", b"").replace(b'\\"', b"")
    parts = chunk.split(b'"')
    started_in_string = count.in_string
    if (len(parts) - 1) % 2:
        count.in_string = not count.in_string
    if started_in_string:  # the string's end stands for it: no "[" + "]" across it reads as an empty list
        return b'"'.join([b"", *parts[1::2]]).translate(None, _WHITESPACE)
    return b'"'.join(parts[0::2]).translate(None, _WHITESPACE)
