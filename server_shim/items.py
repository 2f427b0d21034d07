"""Input items: normalise and validate what a request adds, never the history it points to."""

from __future__ import annotations

from collections.abc import Set
from typing import Any

from openai.types.responses import ResponseInputItemParam

from .errors import APIError, invalid
from .sdk import sdk_literal_types

Item = dict[str, Any]

MESSAGE_ROLES = frozenset({"user", "system", "developer", "assistant"})
TEXT_PART_TYPES = frozenset({"input_text", "output_text", "refusal"})
PART_TYPES = TEXT_PART_TYPES | {"input_image", "input_file"}
PART_STRINGS = {
    "input_image": ("image_url", "file_id", "detail"),
    "input_file": ("file_data", "file_id", "file_url", "filename"),
}
"""The string (or null) fields of the SDK's image and file parts."""
ITEM_TYPES = sdk_literal_types(ResponseInputItemParam) | {"message", "item_reference"}
"""Every input item type of the SDK's union. Those a chat backend cannot use are dropped when rendering."""
CALL_TYPES = frozenset({"function_call", "custom_tool_call"})
OUTPUT_TYPES = frozenset({"function_call_output", "custom_tool_call_output"})


def normalize_input(raw: Any) -> list[Item]:
    """A plain string is one user message; anything else must be a list of item objects."""
    if raw is None:
        return []
    if isinstance(raw, str):
        return [{"type": "message", "role": "user", "content": raw}]
    if not isinstance(raw, list):
        raise invalid("invalid_type", "'input' must be a string or an array of input items.", "input")
    return raw


def validate_items(items: list[Item], known_call_ids: Set[str] = frozenset()) -> set[str]:
    """Check each new item; return the call ids the new items introduce.

    `known_call_ids` are the function calls already in the conversation (read-only cached
    state), so a `function_call_output` can be checked without walking the history. An item's
    parameter name (`input[3]`) is written only for an error that names it.
    """
    introduced: set[str] = set()
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            param = _param(index)
            raise invalid("invalid_type", f"'{param}' must be an object.", param)
        kind = item["type"] if "type" in item else _implied_kind(item)
        if kind == "message":
            _validate_message(item, index)
        elif kind in CALL_TYPES:
            _require_str(item, ("call_id", "name", "arguments" if kind == "function_call" else "input"), index)
            introduced.add(item["call_id"])
        elif kind in OUTPUT_TYPES:
            _validate_output(item, index, known_call_ids, introduced)
        elif kind == "item_reference":
            _require_str(item, ("id",), index)
        elif kind is None:
            param = _param(index)
            raise invalid("missing_required_parameter", f"Missing required parameter: '{param}.type'.", param)
        elif kind not in ITEM_TYPES:
            param = _param(index)
            raise invalid("invalid_value", f"Invalid value for '{param}.type': unsupported item type '{kind}'.", param)
    return introduced


def _param(index: int, part: int | None = None) -> str:
    """The parameter an error names: an item of `input`, or a part of its content."""
    return f"input[{index}]" if part is None else f"input[{index}].content[{part}]"


def _implied_kind(item: Item) -> Any:
    """The type of an item without one (set in it): the SDK lets a message omit it (it has a role) and a reference
    too (it has only an id); None for any other."""
    if "role" in item:
        item["type"] = "message"
    elif set(item) == {"id"}:
        item["type"] = "item_reference"
    return item.get("type")


def _validate_output(item: Item, index: int, known: Set[str], introduced: set[str]) -> None:
    _require_str(item, ("call_id",), index)
    output = item.get("output")
    if not isinstance(output, (str, list)):
        param = _param(index)
        raise invalid("invalid_type", f"'{param}.output' must be a string or an array.", f"{param}.output")
    call_id = item["call_id"]
    if call_id not in known and call_id not in introduced:
        kind = "custom tool" if item["type"] == "custom_tool_call_output" else "function"
        raise invalid(
            "tool_output_without_call",
            f"No tool call found for {kind} call output with call_id '{call_id}'.",
            f"{_param(index)}.call_id",
        )


def _validate_message(item: Item, index: int) -> None:
    role = item.get("role")
    if role not in MESSAGE_ROLES:
        param = _param(index)
        raise invalid(
            "invalid_value",
            f"Invalid value for '{param}.role': expected one of {sorted(MESSAGE_ROLES)}, got {role!r}.",
            f"{param}.role",
        )
    content = item.get("content")
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        param = _param(index)
        raise invalid("invalid_type", f"'{param}.content' must be a string or an array.", f"{param}.content")
    for part_index, part in enumerate(content):
        part_type = part.get("type") if isinstance(part, dict) else None
        if part_type not in PART_TYPES:
            part_param = _param(index, part_index)
            raise invalid("invalid_value", f"Invalid content part at '{part_param}'.", f"{part_param}.type")
        if part_type in TEXT_PART_TYPES:
            key = "refusal" if part_type == "refusal" else "text"
            if not isinstance(part.get(key), str):
                part_param = _param(index, part_index)
                raise invalid("invalid_type", f"'{part_param}.{key}' must be a string.", f"{part_param}.{key}")
        for key in PART_STRINGS.get(part_type, ()):
            if part.get(key) is not None and not isinstance(part[key], str):
                part_param = _param(index, part_index)
                raise invalid("invalid_value", f"'{part_param}.{key}' must be a string.", f"{part_param}.{key}")


def _require_str(item: Item, keys: tuple[str, ...], index: int) -> None:
    for key in keys:
        if key not in item:
            param = f"{_param(index)}.{key}"
            raise invalid("missing_required_parameter", f"Missing required parameter: '{param}'.", param)
        if not isinstance(item[key], str):
            param = f"{_param(index)}.{key}"
            raise invalid("invalid_type", f"'{param}' must be a string.", param)


def resolve_references(items: list[Item], known: list[Item]) -> list[Item]:
    """Replace `item_reference` items by the `known` (cached) items they name."""
    for item in items:  # a loop, not `any(...)`: no generator made for each turn (~2,000 instructions)
        if item.get("type") == "item_reference":
            break
    else:
        return items
    lookup = {item["id"]: item for item in known if "id" in item}
    resolved = []
    for index, item in enumerate(items):
        if item.get("type") != "item_reference":
            resolved.append(item)
            continue
        target = lookup.get(item["id"])
        if target is None:
            raise APIError(404, "item_not_found", f"Item with id '{item['id']}' not found.", f"input[{index}].id")
        resolved.append(target)
    return resolved
