"""The sliced parser against orjson: the same value for what orjson accepts, an error for what it refuses.

Generated documents (several serializers, tiny windows and slices so every boundary path runs), the
same documents with hostile tokens spliced in, and a fixed list of the cases where the standard
library and orjson disagree (NaN, lone surrogates, big integers, depth...).
"""

from __future__ import annotations

import json
import math
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server_shim import json_slices
from server_shim.json_slices import DISPOSE_CHUNK, SLICE_CHARS, WINDOW, dispose, parse_in_slices, parse_steps

EXAMPLES = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])

HOSTILE = [
    *'"\\,:[]{} \n\t\r\x00\x1f.eE+-0é\ufeff\u2028',
    "01",
    "1.",
    "1e",
    "-0",
    "1.0",
    "1e400",
    "-1e400",
    "1E+999",
    "1e-400",
    "1e308",
    "18446744073709551615",
    "18446744073709551616",
    "-9223372036854775808",
    "-9223372036854775809",
    "1234567890123456789012345",
    "NaN",
    "Infinity",
    "-Infinity",
    "true",
    "nul",
    "\\ud800",
    "\\udc00",
    "\\uD83D\\uDE00",
    "\\ud83d\\ude00",
    "\\\\",
    "\\u00e9",
    "\\x",
    '"a":',
    "[]",
    "{}",
    "[" * 30,
    "]" * 30,
]

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
    | st.sampled_from(["\U0001f600", "\\", '"', "\ud7ff", "\ue000", "x" * 300])
)
values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=8) | st.dictionaries(st.text(max_size=6), children, max_size=6),
    max_leaves=60,
)


def serialized(value: Any, style: int) -> str:
    """One of the ways clients write JSON: compact (as orjson writes, but also integers past 64 bits), the standard
    library's default (ASCII-escaped), not escaped, indented."""
    if style == 0:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return json.dumps(value, ensure_ascii=style == 1, indent=2 if style == 3 else None)


def outcome(parse: Any, document: str | bytes) -> tuple[str, Any]:
    try:
        return "ok", parse(document)
    except json.JSONDecodeError:  # orjson's error is one too; anything else escapes and fails the test
        return "error", None


def same(a: Any, b: Any) -> bool:
    """Equal, with the same types everywhere (1 is not 1.0), keys in the same order, -0.0 not 0.0."""
    pending = [(a, b)]
    while pending:
        x, y = pending.pop()
        if type(x) is not type(y):
            return False
        if isinstance(x, dict):
            if list(x) != list(y):
                return False
            pending.extend(zip(x.values(), y.values(), strict=True))
        elif isinstance(x, list):
            if len(x) != len(y):
                return False
            pending.extend(zip(x, y, strict=True))
        elif isinstance(x, float):
            if x != y or math.copysign(1, x) != math.copysign(1, y):
                return False
        elif x != y:
            return False
    return True


def assert_agrees(document: str | bytes, slice_chars: int = SLICE_CHARS, window: int = WINDOW) -> None:
    expected = outcome(orjson.loads, document)
    got = outcome(lambda d: json_slices.loads(d, slice_chars, window), document)
    assert expected[0] == got[0], (document[:300], expected[0], got[0])
    assert same(expected[1], got[1]), document[:300]


windows = st.sampled_from([2, 5, 16, 64, 4096, WINDOW])
slices = st.sampled_from([1, 7, 64, SLICE_CHARS])


@EXAMPLES
@given(value=values, style=st.integers(0, 3), window=windows, slice_chars=slices, as_bytes=st.booleans())
def test_valid_documents_parse_to_what_orjson_gives(value, style, window, slice_chars, as_bytes):
    text = serialized(value, style)
    assert_agrees(text.encode() if as_bytes else text, slice_chars, window)


@EXAMPLES
@given(
    value=values,
    style=st.integers(0, 3),
    edits=st.lists(
        st.tuples(st.integers(0, 10**6), st.sampled_from(HOSTILE) | st.text(max_size=3), st.integers(0, 2)),
        min_size=1,
        max_size=4,
    ),
    window=windows,
    slice_chars=slices,
)
def test_hostile_edits_are_accepted_and_refused_as_orjson_does(value, style, edits, window, slice_chars):
    text = serialized(value, style)
    for at, token, removed in edits:
        at %= len(text) + 1
        text = text[:at] + token + text[at + removed :]
    assert_agrees(text, slice_chars, window)
    assert_agrees(text.encode("utf-8", "surrogatepass"), slice_chars, window)


@EXAMPLES
@given(raw=st.binary(max_size=80), window=windows)
def test_arbitrary_bytes_are_accepted_and_refused_as_orjson_does(raw, window):
    assert_agrees(raw, 7, window)
    assert_agrees(b'{"input": [' + raw + b"]}", 7, window)


ADVERSARIAL = [
    "",
    " ",
    "\ufeff{}",
    "{} x",
    "{}\x00",
    '"\\ud800"',
    '"\\udc00x"',
    '"\\ud800\\ud800\\udc00"',
    '"\\ud800\\\\udc00"',
    '"\\\\ud800"',
    '"\\\\\\ud800"',
    '"' + "\\\\" * 100 + '\\ud800"',
    '"' + "\\\\" * 100 + 'ud800"',
    '{"\\ud800": 1}',
    '"\ud800"',
    b'"\xff"',
    b'"\xed\xa0\x80"',
    "NaN",
    "[-Infinity]",
    '{"a": Infinity}',
    "1e400",
    "[1E+999]",
    "-1e-400",
    "18446744073709551615",
    "18446744073709551616",
    "-9223372036854775808",
    "-9223372036854775809",
    "1" * 400,
    "[" + "1" * 5000 + "]",
    "[1." + "1" * 5000 + "]",
    '{"a":1,"a":2,"b":3,"a":4}',
    '{"input": [1, 2], "input": [3]}',
    "[1,]",
    '{"a":1,}',
    "[01]",
    '"\x1f"',
    '"\\U00e9"',
    "[" * 1024 + "]" * 1024,
    "[" * 1025 + "]" * 1025,
    '{"a":' + "[" * 1023 + "]" * 1023 + "}",
    '{"a":' + "[" * 1024 + "]" * 1024 + "}",
    "[" * 100_000,
    '{"input": [' + '{"a": ' * 1023 + "1" + "}" * 1023 + "]}",
    '{"input": [' + '{"a": ' * 1024 + "1" + "}" * 1024 + "]}",
    '["' + "x" * 100_000 + '", 1, "' + "y" * 70_000 + '"]',
    "[" + "1.5, " * 20_000 + "2]",
    '["a,b", "c\\",d", "e"]',
    "[[1, 2], [3, 4]" * 2,
]


@pytest.mark.parametrize("window", [3, 64, WINDOW])
@pytest.mark.parametrize("document", ADVERSARIAL, ids=range(len(ADVERSARIAL)))
def test_the_cases_where_the_standard_library_and_orjson_differ(document, window):
    assert_agrees(document, 64, window)
    if isinstance(document, str):
        assert_agrees(document.encode("utf-8", "surrogatepass"), 64, window)


def test_a_large_frame_is_parsed_in_many_short_slices():
    """Structure, not speed (that is `benchmarks/loop_stall.py`): a 3 MB frame of 60,000 items pauses at least
    once per two slices' worth of text, and gives orjson's value."""
    frame = orjson.dumps(
        {"type": "response.create", "input": [{"role": "user", "content": f"item {n}"} for n in range(60_000)]}
    )
    steps, pauses = parse_steps(frame), 0
    while True:
        try:
            next(steps)
        except StopIteration as done:
            assert done.value == orjson.loads(frame)
            break
        pauses += 1
    assert pauses >= len(frame) // (2 * SLICE_CHARS)


def test_which_documents_are_sliced():
    assert not parse_in_slices(10, 256 * 1024)
    assert not parse_in_slices(256 * 1024 - 1, 256 * 1024)
    assert parse_in_slices(256 * 1024, 256 * 1024)
    assert not parse_in_slices(10**9, 0)  # 0 turns slicing off


def test_a_large_refused_body_is_freed_a_slice_at_a_time():
    long = 10 * DISPOSE_CHUNK
    body = {"input": [{"n": n} for n in range(long)], "metadata": {"k": [[] for _ in range(long)]}, "n": 1}
    freeing, pauses = dispose(body), 0
    with pytest.raises(StopIteration):
        while True:
            freeing.send(None)  # each `asyncio.sleep(0)` hands control back here
            pauses += 1
    assert pauses >= 18 and len(body["input"]) <= DISPOSE_CHUNK and len(body["metadata"]["k"]) <= DISPOSE_CHUNK


@EXAMPLES
@given(
    value=values,
    style=st.integers(0, 3),
    threshold=st.sampled_from([0, 8, 4096]),
    limits=st.tuples(st.sampled_from([4, 64, 100_000]), st.sampled_from([2, 8, 64])),
)
def test_a_document_loaded_without_awaiting_is_what_load_measured_gives(value, style, threshold, limits):
    """`load_settled` (what a frame's first reading tries before awaiting) answers only what `load_measured` would,
    the same document and shape; None leaves it to `load_measured`."""
    import asyncio

    from server_shim.json_shape import TooManyValues

    text = serialized(value, style)
    settled = json_slices.load_settled(text, len(text), threshold, *limits)
    try:
        measured = asyncio.run(json_slices.load_measured(text, len(text), threshold, *limits))
    except TooManyValues:
        assert settled is None
        return
    if settled is not None:
        assert same(settled[0], measured[0]) and settled[1] == measured[1]
    small = not json_slices.parse_in_slices(len(text), threshold) and 0 < len(text) < limits[0]
    if small and text.count("[") + text.count("{") <= limits[1]:
        assert settled is not None, "a small, shallow document is read without awaiting"
