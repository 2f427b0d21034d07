"""Parsing a large JSON document in slices, so one client's big frame does not hold the event loop.

`orjson.loads` is one C call that holds the GIL: a 3 MB frame of 60,000 small items keeps every
other connection waiting ~40 ms (a thread does not help). Here the document is walked with an
explicit stack (`json_walk.Walk`), and every value that fits in a window of `WINDOW` characters is
handed whole to the standard library's C scanner; containers larger than that are entered and
their members parsed the same way. `parse_steps` is a generator that pauses after
about `slice_chars` characters of work, so the caller decides what to do between slices (the
connection loop yields to the event loop): no step scans more than a window, apart from a single
string or number longer than one, which the C scanner reads at memory speed.

The result is exactly what `orjson.loads` gives, and what orjson refuses is refused
(`tests/test_json_slices.py` compares the two on generated and hostile input): no NaN/Infinity,
no lone surrogate escapes, integers outside 64 bits become floats and numbers that overflow a
double are errors, nesting deeper than 1,024 is an error, the last of duplicate keys wins in the
first one's place, nothing but whitespace after the document, the text must be valid UTF-8.
Error messages are the standard library's, not orjson's; the error code a client gets is the same.
"""

from __future__ import annotations

import asyncio
import codecs
from collections.abc import Generator
from json import JSONDecodeError
from typing import Any

import orjson

from .json_shape import Shape, bounds, measure_steps
from .json_walk import Walk

WINDOW = 32 * 1024
SLICE_CHARS = 16 * 1024


def parse_in_slices(nbytes: int, threshold: int) -> bool:
    """Whether a document of `nbytes` is parsed in slices (`threshold` 0: never).

    Below the threshold orjson's one call is both faster (3-4x here) and short (~1 ms per 100 KB here),
    so the common small frame pays nothing more.
    """
    return 0 < threshold <= nbytes


async def load(data: str | bytes, nbytes: int, threshold: int) -> Any:
    """`orjson.loads(data)`, giving way to the event loop between slices when `data` is large.

    Raises `json.JSONDecodeError` (orjson's error is one) for what orjson refuses.
    """
    if not parse_in_slices(nbytes, threshold):
        return orjson.loads(data)
    steps = parse_steps(data)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value
        await asyncio.sleep(0)


async def load_measured(
    data: str | bytes, nbytes: int, threshold: int, max_values: int, max_depth: int
) -> tuple[Any, Shape]:
    """`load`, after the text is measured (`json_shape`): a document of more than `max_values` values raises
    `json_shape.TooManyValues` before it is parsed. A large one is measured in slices too; a small one whose
    `bounds` settle the limits is not measured exactly, and is parsed in one call."""
    shape, large = bounds(data, nbytes, max_values, max_depth), parse_in_slices(nbytes, threshold)
    if shape is None:
        shape = await _measured(measure_steps(data, max_values, max_depth), pause=large)
    return (await load(data, nbytes, threshold) if large else orjson.loads(data)), shape


def load_settled(
    data: str | bytes, nbytes: int, threshold: int, max_values: int, max_depth: int
) -> tuple[Any, Shape] | None:
    """`load_measured` with nothing to await: a document parsed in one call whose `bounds` settle both limits (the
    usual frame; a coroutine awaited costs ~1,000 instructions); None when it must be measured or parsed in slices."""
    if parse_in_slices(nbytes, threshold):
        return None
    shape = bounds(data, nbytes, max_values, max_depth)
    return None if shape is None else (orjson.loads(data), shape)


async def _measured(steps: Generator[None, None, Shape], *, pause: bool) -> Shape:
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value
        if pause:
            await asyncio.sleep(0)


DISPOSE_CHUNK = 2_000


async def dispose(body: Any) -> None:
    """Free a large refused document's long lists a slice at a time (down to 3 levels in), giving way in
    between: dropping 60,000 parsed items at once holds the loop ~5-8 ms (reference counting frees them one
    by one). Only for a document nothing else holds: it is emptied."""
    level = [body]
    for _ in range(3):
        inner: list[Any] = []
        for node in level:
            members = list(node.values()) if isinstance(node, dict) else node if isinstance(node, list) else []
            inner += [m for m in members[:DISPOSE_CHUNK] if isinstance(m, (dict, list))]
            while isinstance(node, list) and len(node) > DISPOSE_CHUNK:
                del node[-DISPOSE_CHUNK:]
                await asyncio.sleep(0)
        level = inner


def loads(data: str | bytes, slice_chars: int = SLICE_CHARS, window: int = WINDOW) -> Any:
    """The sliced parse without pauses: `parse_steps` run to its end (tests, callers without a loop)."""
    steps = parse_steps(data, slice_chars, window)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


def parse_steps(data: str | bytes, slice_chars: int = SLICE_CHARS, window: int = WINDOW) -> Generator[None, None, Any]:
    """Parse `data`, pausing (yielding None) after about `slice_chars` characters of work each time; the C
    scanner reads at most `window` characters at once (apart from one long string or number).

    Raises `json.JSONDecodeError` for anything orjson refuses.
    """
    text = yield from _text(data, slice_chars)
    yield from _check_surrogates(text, slice_chars)
    return (yield from Walk(text, slice_chars, window).run())


def _text(data: str | bytes, slice_chars: int) -> Generator[None, None, str]:
    """The document as text; orjson reads only valid UTF-8 (no surrogate code points in a `str`)."""
    if isinstance(data, str):
        for start in range(0, 0 if data.isascii() else len(data), slice_chars):
            try:
                data[start : start + slice_chars].encode()
            except UnicodeEncodeError as exc:
                raise JSONDecodeError(
                    "str is not valid UTF-8: surrogates not allowed", data, start + exc.start
                ) from None
            yield
        return data
    decoder, parts, view = codecs.getincrementaldecoder("utf-8")(), [], memoryview(data)
    for start in range(0, len(data), slice_chars):
        try:
            parts.append(decoder.decode(view[start : start + slice_chars], final=start + slice_chars >= len(data)))
        except UnicodeDecodeError as exc:
            raise JSONDecodeError(f"the text is not valid UTF-8 ({exc.reason})", "", start + exc.start) from None
        yield
    return "".join(parts)


def _check_surrogates(text: str, slice_chars: int) -> Generator[None, None, None]:
    """orjson refuses an escaped surrogate that is not half of a pair; the standard library keeps it.

    Each `\\ud...`/`\\uD...` is found by `str.find` (C speed) and checked, a slice of the text at a time.
    """
    pair_low_at, step, work = -1, max(64, slice_chars // 4), 0
    for start in range(0, len(text), step):
        found = [at for needle in ("\\ud", "\\uD") for at in _occurrences(text, needle, start, start + step)]
        for at in sorted(found):
            hexa = text[at + 2 : at + 6]
            if not _is_hex(hexa) or hexa[1] not in "89abcdefABCDEF" or at == pair_low_at or _escaped(text, at):
                continue  # not a surrogate escape (invalid JSON is refused by the parse), or a pair's low half
            low = text[at + 6 : at + 12]
            if int(hexa, 16) >= 0xDC00:
                raise JSONDecodeError("lone low surrogate in string", text, at)
            if not (low[:2] == "\\u" and _is_hex(low[2:]) and 0xDC00 <= int(low[2:], 16) <= 0xDFFF):
                raise JSONDecodeError("no low surrogate in string", text, at)
            pair_low_at = at + 6
        work += step // 8 + 32 * len(found)
        if work >= slice_chars:
            work = 0
            yield


def _occurrences(text: str, needle: str, start: int, stop: int) -> list[int]:
    """Where `needle` starts in text[start:stop] (it may run past `stop`)."""
    found, at = [], text.find(needle, start, stop + len(needle) - 1)
    while at != -1:
        found.append(at)
        at = text.find(needle, at + 1, stop + len(needle) - 1)
    return found


def _escaped(text: str, at: int) -> bool:
    """Whether the backslash at `at` is itself escaped (an odd run of backslashes before it)."""
    start = at
    while start > 0 and text[start - 1] == "\\":
        block = text[max(0, start - 64) : start]
        start -= len(block) - len(block.rstrip("\\"))
        if block.rstrip("\\"):
            break
    return (at - start) % 2 == 1


def _is_hex(digits: str) -> bool:
    return len(digits) == 4 and all(c in "0123456789abcdefABCDEF" for c in digits)
