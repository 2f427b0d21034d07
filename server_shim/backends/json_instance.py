"""A deterministic JSON value that validates against a JSON Schema: what the simulator answers with.

Covers what structured-output schemas use (the subset OpenAI's strict mode allows and a bit more):
object, array, string (enum, const, format date/date-time/email/uri), number, integer (bounds),
boolean, null, anyOf/oneOf/allOf (the first branch; allOf merged), local `$ref`s to `$defs`.
"""

from __future__ import annotations

from typing import Any

_FORMATS = {
    "date": "2026-01-01",
    "date-time": "2026-01-01T00:00:00Z",
    "time": "00:00:00Z",
    "email": "simulated@example.com",
    "uri": "https://example.com/simulated",
    "uuid": "00000000-0000-4000-8000-000000000000",
}


def json_instance(schema: Any, root: Any = None, depth: int = 0) -> Any:
    """The simplest value `schema` accepts; required properties always present, optional ones too."""
    root = schema if root is None else root
    if not isinstance(schema, dict) or depth > 32:
        return None
    if "$ref" in schema:
        return json_instance(_resolve(schema["$ref"], root), root, depth + 1)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf"):
        if schema.get(key):
            return json_instance(schema[key][0], root, depth + 1)
    if schema.get("allOf"):
        merged: dict[str, Any] = {}
        for part in schema["allOf"]:
            merged = _merge(merged, _resolve(part["$ref"], root) if "$ref" in part else part)
        return json_instance(merged, root, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object" or (kind is None and "properties" in schema):
        properties = schema.get("properties") or {}
        return {name: json_instance(sub, root, depth + 1) for name, sub in properties.items()}
    if kind == "array":
        count = int(schema.get("minItems") or 1)
        return [json_instance(schema.get("items") or {"type": "string"}, root, depth + 1) for _ in range(count)]
    if kind in ("integer", "number"):
        return _number(schema, integer=kind == "integer")
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    return _string(schema)


def _number(schema: dict[str, Any], *, integer: bool) -> int | float:
    low = schema.get("minimum", schema.get("exclusiveMinimum"))
    value = 1 if low is None else low + (1 if "exclusiveMinimum" in schema and "minimum" not in schema else 0)
    high = schema.get("maximum")
    if high is not None and value > high:
        value = high
    return int(value) if integer else float(value)


def _string(schema: dict[str, Any]) -> str:
    text = _FORMATS.get(schema.get("format", ""), "simulated")
    minimum = int(schema.get("minLength") or 0)
    if len(text) < minimum:
        text = text + "x" * (minimum - len(text))
    maximum = schema.get("maxLength")
    return text[: int(maximum)] if maximum is not None else text


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
