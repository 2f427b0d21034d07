"""A deterministic JSON text that validates against a JSON Schema: what the simulator answers with.

Covers what structured-output schemas use (the subset OpenAI's strict mode allows and a bit more):
object, array, string (enum, const, format date/date-time/email/uri), number, integer (bounds),
boolean, null, anyOf/oneOf/allOf (the first branch; allOf merged), local `$ref`s to `$defs`.
"""

from __future__ import annotations

import json
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


def json_text(schema: Any, root: Any = None, depth: int = 0) -> Iterator[str]:
    """The JSON text of the simplest value `schema` accepts (required and optional properties present),
    piece by piece: a schema may ask for more (`minLength`, `minItems`) than any budget allows, and the
    caller stops reading when its budget is spent, so nothing past it is ever built."""
    root = schema if root is None else root
    if not isinstance(schema, dict) or depth > 32:
        yield "null"
    elif "$ref" in schema:
        yield from json_text(_resolve(schema["$ref"], root), root, depth + 1)
    elif "const" in schema:
        yield json.dumps(schema["const"])
    elif schema.get("enum"):
        yield json.dumps(schema["enum"][0])
    elif branches := schema.get("anyOf") or schema.get("oneOf"):
        yield from json_text(branches[0], root, depth + 1)
    elif schema.get("allOf"):
        merged: dict[str, Any] = {}
        for part in schema["allOf"]:
            merged = _merge(merged, _resolve(part["$ref"], root) if "$ref" in part else part)
        yield from json_text(merged, root, depth + 1)
    else:
        yield from _typed(schema, root, depth)


def _typed(schema: dict[str, Any], root: Any, depth: int) -> Iterator[str]:
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object" or (kind is None and "properties" in schema):
        yield "{"
        for index, (name, sub) in enumerate((schema.get("properties") or {}).items()):
            yield f"{', ' if index else ''}{json.dumps(name)}: "
            yield from json_text(sub, root, depth + 1)
        yield "}"
    elif kind == "array":
        yield "["
        for index in range(_count(schema.get("minItems"), 1)):
            yield ", " if index else ""
            yield from json_text(schema.get("items") or {"type": "string"}, root, depth + 1)
        yield "]"
    elif kind in ("integer", "number"):
        yield json.dumps(_number(schema, integer=kind == "integer"))
    elif kind == "boolean":
        yield "true"
    elif kind == "null":
        yield "null"
    else:
        yield from _string(schema)


def _number(schema: dict[str, Any], *, integer: bool) -> int | float:
    low = schema.get("minimum", schema.get("exclusiveMinimum"))
    value = 1 if low is None else low + (1 if "exclusiveMinimum" in schema and "minimum" not in schema else 0)
    high = schema.get("maximum")
    if high is not None and value > high:
        value = high
    return int(value) if integer else float(value)


def _string(schema: dict[str, Any]) -> Iterator[str]:
    text = _FORMATS.get(schema.get("format", ""), "simulated")
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


def _resolve(ref: str, root: Any) -> Any:
    node = root
    for part in ref.removeprefix("#/").split("/") if ref.startswith("#") else ():
        node = node.get(part, {}) if isinstance(node, dict) else {}
    return node


def _merge(left: dict[str, Any], right: dict[str, Any]) -> dict[str, Any]:
    merged = {**left, **right}
    if "properties" in left or "properties" in right:
        merged["properties"] = {**left.get("properties", {}), **right.get("properties", {})}
    return merged
