"""The walk behind `json_slices`: a JSON document read a window at a time by the standard library's C scanner.

The document is walked with an explicit stack; every value that fits in a window of `window` characters is
handed whole to `json.scanner.c_make_scanner`, and a container larger than that is entered and its members
read the same way (a list's small elements many at a time, `Walk._batch`). The numbers come out as orjson's
(64-bit integers stay integers, larger ones become floats, a double's overflow is an error), NaN and
Infinity are refused, nesting deeper than 1,024 is an error; lone surrogate escapes and the UTF-8 check
are `json_slices`'s, before the walk.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Callable, Generator
from json import JSONDecodeError
from json.decoder import scanstring  # type: ignore[attr-defined]
from json.scanner import c_make_scanner  # type: ignore[attr-defined]
from typing import Any

MAX_DEPTH = 1024  # orjson's nesting limit

_WS = re.compile(r"[ \t\n\r]*")
_WS_CHARS = (" ", "\t", "\n", "\r")
_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1
_NUMBER_STARTS = frozenset("-0123456789")
_BATCH_CUT = {'"': '"', "{": "}", "[": "]"}  # what ends an element that starts so (a number or literal: nothing)

Scanner = Callable[[str, int], tuple[Any, int]]


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _as_orjson_int(text: str) -> int | float:
    """orjson's integers: 64-bit ones stay integers, larger become floats, beyond a double are errors."""
    if len(text) <= 21:
        value = int(text)
        if _INT_MIN <= value <= _INT_MAX:
            return value
    return _as_orjson_float(text)


def _as_orjson_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError("number is infinity when parsed as double")
    return value


def _scanner(exact_numbers: bool) -> Scanner:
    """The C scanner; with `exact_numbers` it calls back for every number (~1 µs each), so that each comes
    out as orjson's would. Only windows where a number might differ (`_risky`) pay for that."""
    numbers: dict[str, Any] = {"parse_int": _as_orjson_int, "parse_float": _as_orjson_float} if exact_numbers else {}
    return c_make_scanner(json.JSONDecoder(parse_constant=_reject_constant, **numbers))  # type: ignore[no-any-return]


_FAST, _EXACT = _scanner(False), _scanner(True)
_NUMBER_SHAPES = str.maketrans(
    {c: "0" if c.isdigit() else "e" if c in "eE" else "+" if c in "+-" else "x" for c in map(chr, range(128))}
)


def _risky(chunk: str) -> bool:
    """Whether `chunk` may hold an integer outside 64 bits (19+ digits) or a double's overflow (an exponent of
    3+ digits): one C pass (`str.translate`, ~4 ns a character), not a callback per number."""
    shapes = chunk.translate(_NUMBER_SHAPES)
    return "0" * 19 in shapes or "e000" in shapes or "e+000" in shapes


def _skip(text: str, pos: int) -> int:
    return _WS.match(text, pos).end()  # type: ignore[union-attr]


class Walk:
    """One parse: an explicit stack of the containers entered, and the window the C scanner reads."""

    def __init__(self, text: str, slice_chars: int, window: int) -> None:
        self.text, self.slice_chars, self.window = text, slice_chars, window
        self.chunk, self.base, self.work, self.scan = "", 0, 0, _FAST
        self.stack: list[Any] = []  # the containers entered, innermost last
        self.keys: list[str] = []  # the key the next value of each entered object goes to
        self.enter_from = MAX_DEPTH + 1  # containers this deep are entered, not scanned (past a RecursionError)
        self.root: Any = None
        self.batches_parsed = self.batches_failed = 0

    def run(self) -> Generator[None, None, Any]:
        text, stack = self.text, self.stack
        pos = _skip(text, 0)
        while True:
            if self.work >= self.slice_chars:
                self.work = 0
                yield
            if stack and stack[-1].__class__ is list:
                pos, closed = self._elements(stack[-1], pos)
                if closed:
                    pos = self._complete(stack.pop(), pos)
                    if pos < 0:
                        return self.root
                    continue
                if self.work >= self.slice_chars:
                    continue
            value, pos, entered = self._value(pos)
            if entered:
                stack.append(value)
                pos = _skip(text, pos)
                if not text.startswith("]" if value.__class__ is list else "}", pos):
                    if value.__class__ is dict:
                        key, pos = self._key(pos)
                        self.keys.append(key)
                    continue
                value, pos = stack.pop(), pos + 1
            pos = self._complete(value, pos)
            if pos < 0:
                return self.root

    def _complete(self, value: Any, pos: int) -> int:
        """Put a complete value in its container and read what follows: where the next value starts, or -1
        when the document ended (`root`). Closes the containers that end here."""
        text, stack = self.text, self.stack
        while stack:
            if len(stack) < self.enter_from:
                self.enter_from = MAX_DEPTH + 1
            top = stack[-1]
            if top.__class__ is list:
                top.append(value)
            else:
                top[self.keys[-1]] = value
            pos = _skip(text, pos)
            if text.startswith(",", pos):
                pos = _skip(text, pos + 1)
                if top.__class__ is dict:
                    self.keys[-1], pos = self._key(pos)
                return pos
            if not text.startswith("]" if top.__class__ is list else "}", pos):
                raise JSONDecodeError("Expecting ',' delimiter", text, pos)
            value, pos = stack.pop(), pos + 1
            if value.__class__ is dict:
                self.keys.pop()
        end = _skip(text, pos)
        if end != len(text):
            raise JSONDecodeError("Extra data", text, end)
        self.root = value
        return -1

    def _elements(self, into: list[Any], pos: int) -> tuple[int, bool]:
        """The fast path: a list's elements that lie in the current window, read in a tight loop until the
        slice's work is done. Where the list closes (True), or where the general path takes over."""
        chunk, base, depth = self.chunk, self.base, len(self.stack)
        offset = pos - base
        if not 0 <= offset < len(chunk):
            return pos, False
        budget, spent = self.slice_chars - self.work, 0  # work: characters, and 3 more a batched number
        check_depth = depth + sys.getrecursionlimit() > MAX_DEPTH
        entered_only = depth >= self.enter_from
        batching = self.batches_failed <= self.batches_parsed + 2
        while spent < budget and offset < len(chunk):
            if entered_only and chunk[offset] in "[{":
                break
            if batching:
                number = chunk[offset] in _NUMBER_STARTS  # ~4 characters, ~0.25 µs each
                span = (budget - spent) // 4 if number else budget - spent
                after, count = self._batch(into, offset, min(len(chunk), offset + span), check_depth)
                batching = after != offset  # one failed try per call at most
                if batching:
                    spent, offset = spent + after - offset + (3 * count if number else 0), after
                    continue
            try:
                value, end = self.scan(chunk, offset)
            except (StopIteration, ValueError, RecursionError):
                break
            after_value = chunk[end : end + 1]
            if after_value in _WS_CHARS:
                end = _skip(chunk, end)
                after_value = chunk[end : end + 1]
            if after_value not in (",", "]"):
                break
            if check_depth and value.__class__ in (list, dict):
                _check_depth(value, MAX_DEPTH - depth, self.text, base + offset)
            into.append(value)
            spent += end + 1 - offset
            if after_value == "]":
                self.work += spent
                return base + end + 1, True
            offset = _skip(chunk, end + 1) if chunk[end + 1 : end + 2] in _WS_CHARS else end + 1
        self.work += spent
        return _skip(self.text, base + offset), False  # the window may have ended in whitespace

    def _batch(self, into: list[Any], offset: int, limit: int, check_depth: bool) -> tuple[int, int]:
        """Many elements in one C call (where it ends, how many): the window's text up to the last comma after an element's end (`",`,
        `},`, `],` or `,`, by the kind of the first), parsed as a list of its own. Exact: were that comma inside
        a string or a nested container, the list so made would not parse (the string or container is left
        open), and the elements are then read one by one (and batches tried less: `batches_failed`)."""
        chunk = self.chunk
        closer = _BATCH_CUT.get(chunk[offset], "")
        cut = chunk.rfind(closer + ",", offset, limit) + len(closer)
        if cut <= offset:
            return offset, 0
        try:
            values, end = self.scan("[" + chunk[offset:cut] + "]", 0)
        except (StopIteration, ValueError, RecursionError):
            end = -1
        if end != cut - offset + 2:
            self.batches_failed += 1
            return offset, 0
        if check_depth:
            _check_depth(values, MAX_DEPTH + 1 - len(self.stack), self.text, self.base + offset)
        self.batches_parsed += 1
        into.extend(values)
        return _skip(chunk, cut + 1), len(values)

    def _key(self, pos: int) -> tuple[str, int]:
        text = self.text
        if not text.startswith('"', pos):
            raise JSONDecodeError("Expecting property name enclosed in double quotes", text, pos)
        key, pos = scanstring(text, pos + 1, True)
        pos = _skip(text, pos)
        if not text.startswith(":", pos):
            raise JSONDecodeError("Expecting ':' delimiter", text, pos)
        self.work += len(key) + 4
        return key, _skip(text, pos + 1)

    def _value(self, pos: int) -> tuple[Any, int, bool]:
        """The value at `pos` and where it ends; or, for a container too large for a window, a new empty
        one to fill (`entered`)."""
        depth, opener = len(self.stack), self.text[pos : pos + 1]
        container = opener in ("[", "{")
        if container and depth >= MAX_DEPTH:
            raise JSONDecodeError("depth limit exceeded", self.text, pos)
        whole = None if container and depth >= self.enter_from else self._whole(pos, depth)
        if whole is not None:
            return whole[0], whole[1], False
        self.work += 16
        if container:
            return ([] if opener == "[" else {}), pos + 1, True
        return (*self._scalar(pos), False)

    def _whole(self, pos: int, depth: int) -> tuple[Any, int] | None:
        """The value at `pos` if it fits in a window (the current one, else one that starts at `pos`)."""
        for fresh in (False, True):
            offset = pos - self.base
            if fresh:
                if offset == 0 and self.chunk:
                    return None  # the window already starts here: the value is larger, or invalid
                self._window(pos)
                offset = 0
            elif not 0 <= offset < len(self.chunk):
                continue
            try:
                value, end = self.scan(self.chunk, offset)
            except RecursionError:
                self.enter_from, self.work = depth, self.work + len(self.chunk) - offset
                return None
            except (StopIteration, ValueError):  # too large for the window, or invalid
                self.work += len(self.chunk) - offset
                continue
            if end + 3 < len(self.chunk) or self.base + len(self.chunk) == len(self.text):  # a number's end is
                # only sure where the characters after it (up to 3: '.5', 'e+1') were in the window
                self.work += end - offset
                if value.__class__ in (list, dict) and depth + sys.getrecursionlimit() > MAX_DEPTH:
                    _check_depth(value, MAX_DEPTH - depth, self.text, pos)
                return value, self.base + end
        return None

    def _window(self, pos: int) -> None:
        self.chunk, self.base = self.text[pos : pos + self.window], pos
        self.scan = _EXACT if _risky(self.chunk) else _FAST
        self.work += len(self.chunk) // 8

    def _scalar(self, pos: int) -> tuple[Any, int]:
        """A string or number longer than a window, or an invalid value: read on the whole text."""
        try:
            value, end = _EXACT(self.text, pos)
        except StopIteration:
            raise JSONDecodeError("Expecting value", self.text, pos) from None
        except JSONDecodeError:
            raise
        except ValueError as exc:
            raise JSONDecodeError(str(exc), self.text, pos) from None
        self.work += end - pos
        return value, end


def _check_depth(value: Any, limit: int, text: str, pos: int) -> None:
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            raise JSONDecodeError("depth limit exceeded", text, pos)
        children = node.values() if isinstance(node, dict) else node
        stack.extend((child, depth + 1) for child in children if isinstance(child, (list, dict)))
