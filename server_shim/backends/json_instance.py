"""A deterministic JSON text that validates against a JSON Schema: what the simulator answers with.

Covers what structured-output schemas use (the subset OpenAI's strict mode allows and a bit more):
object, array, string (enum, const, format date/date-time/email/uri), number, integer (bounds,
exclusive bounds, an integer `multipleOf`), boolean, null, anyOf/oneOf/allOf (the first branch;
allOf merged), local `$ref`s to `$defs`.

Any JSON value is accepted as a schema and gives JSON text: the simulator is no schema validator
(a real backend may refuse a malformed schema; this one answers). A keyword whose value is not of
the type JSON Schema gives it is ignored, as if absent: a `minimum` that is not a number (or is
NaN, infinite, or beyond what a double holds), a `properties` that is not an object, an `enum`
that is not a list, a `$ref` that is not a string. Unsatisfiable bounds give the lower one.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

_FORMATS = {
    "date": "2026-01-01",
    "date-time": "2026-01-01T00:00:00Z",
    "time": "00:00:00Z",
    "email": "simulated@example.com",
    "uri": "https://example.com/simulated",
    "uuid": "00000000-0000-4000-8000-000000000000",
}
_LARGEST = 1.7976931348623157e308
"""The largest finite double: a bound beyond it (a Python caller's huge int) is ignored."""


def json_text(schema: Any, root: Any = None, depth: int = 0) -> Iterator[str]:
    """The JSON text of the simplest value `schema` accepts (required and optional properties present),
    piece by piece: a schema may ask for more (`minLength`, `minItems`) than any budget allows, and the
    caller stops reading when its budget is spent, so nothing past it is ever built."""
    root = schema if root is None else root
    if not isinstance(schema, dict) or depth > 32:
        yield "null"
    elif isinstance(schema.get("$ref"), str):
        yield from json_text(_resolve(schema["$ref"], root), root, depth + 1)
    elif "const" in schema:
        yield _dumps(schema["const"])
    elif enum := _list(schema.get("enum")):
        yield _dumps(enum[0])
    elif branches := _list(schema.get("anyOf")) or _list(schema.get("oneOf")):
        yield from json_text(branches[0], root, depth + 1)
    elif parts := _list(schema.get("allOf")):
        merged: dict[str, Any] = {}
        for part in parts:
            ref = part.get("$ref") if isinstance(part, dict) else None
            merged = _merge(merged, _resolve(ref, root) if isinstance(ref, str) else part)
        yield from json_text(merged, root, depth + 1)
    else:
        yield from _typed(schema, root, depth)


def _typed(schema: dict[str, Any], root: Any, depth: int) -> Iterator[str]:
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    properties = _dict(schema.get("properties"))
    if kind == "object" or (kind is None and properties):
        yield "{"
        for index, (name, sub) in enumerate(properties.items()):
            yield f"{', ' if index else ''}{json.dumps(name)}: "
            yield from json_text(sub, root, depth + 1)
        yield "}"
    elif kind == "array":
        yield "["
        for index in range(_count(schema.get("minItems"), 1)):
            yield ", " if index else ""
            yield from json_text(schema.get("items") or {"type": "string"}, root, depth + 1)
        yield "]"
    elif kind == "integer":
        yield json.dumps(_integer(schema))
    elif kind == "number":
        yield json.dumps(_number(schema))
    elif kind == "boolean":
        yield "true"
    elif kind == "null":
        yield "null"
    else:
        yield from _string(schema)


def _bounds(schema: dict[str, Any], inclusive: str, exclusive: str) -> tuple[float | None, bool]:
    """The tighter of a side's inclusive and exclusive bounds, and whether it is exclusive; unusable values ignored.

    `exclusiveMinimum: true` (draft 4) makes `minimum` exclusive.
    """
    closed, opened = _finite(schema.get(inclusive)), _finite(schema.get(exclusive))
    if schema.get(exclusive) is True and closed is not None:
        return closed, True
    if opened is None or (closed is not None and (closed > opened if inclusive == "minimum" else closed < opened)):
        return closed, False
    return opened, True


def _integer(schema: dict[str, Any]) -> int:
    low, low_open = _bounds(schema, "minimum", "exclusiveMinimum")
    high, high_open = _bounds(schema, "maximum", "exclusiveMaximum")
    least = None if low is None else math.floor(low) + 1 if low_open else math.ceil(low)
    most = None if high is None else math.ceil(high) - 1 if high_open else math.floor(high)
    value = least if least is not None else 1 if most is None else min(1, most)
    step = _finite(schema.get("multipleOf"))
    if step is not None and step >= 1 and step == int(step):
        value = -(-value // int(step)) * int(step)  # the first multiple at or above
    if most is not None and value > most and (least is None or most >= least):
        value = most
    return value


def _number(schema: dict[str, Any]) -> float:
    low, low_open = _bounds(schema, "minimum", "exclusiveMinimum")
    high, high_open = _bounds(schema, "maximum", "exclusiveMaximum")
    if low is None:
        value = 1.0 if high is None or high > 1 or (high == 1 and not high_open) else high
        return math.nextafter(value, -math.inf) if high_open and value == high else float(value)
    if not low_open:
        return float(low)
    above = max(low + 1, math.nextafter(low, math.inf))
    if high is not None and (above > high or (above == high and high_open)):
        above = low / 2 + high / 2
        return above if low < above else math.nextafter(low, math.inf)
    return float(above)


def _string(schema: dict[str, Any]) -> Iterator[str]:
    form = schema.get("format")
    text = _FORMATS.get(form, "simulated") if isinstance(form, str) else "simulated"
    length = max(len(text), _count(schema.get("minLength"), 0))
    if schema.get("maxLength") is not None:
        length = min(length, _count(schema["maxLength"], length))
    yield json.dumps(text[:length])[:-1]
    padding = length - min(len(text), length)
    for start in range(0, padding, 4096):
        yield "x" * min(4096, padding - start)
    yield '"'


def _count(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default


def _finite(value: Any) -> float | None:
    """A bound as a number a double holds; anything else (text, a boolean, NaN, an infinity) is None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value if -_LARGEST <= value <= _LARGEST else None


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _dumps(value: Any) -> str:
    """JSON text for a `const` or `enum` value; a NaN or infinity (a Python caller's) becomes null."""
    try:
        return json.dumps(value, allow_nan=False)
    except ValueError:
        return "null"


def _resolve(ref: str, root: Any) -> Any:
    node = root
    for part in ref.removeprefix("#/").split("/") if ref.startswith("#") else ():
        node = node.get(part, {}) if isinstance(node, dict) else {}
    return node


def _merge(left: dict[str, Any], right: Any) -> dict[str, Any]:
    if not isinstance(right, dict):
        return left
    merged = {**left, **right}
    if "properties" in left or "properties" in right:
        merged["properties"] = {**_dict(left.get("properties")), **_dict(right.get("properties"))}
    return merged
