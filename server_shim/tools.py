"""Responses tool definitions -> Chat Completions tools, checked once per distinct tool list."""

from __future__ import annotations

from typing import Any

from .errors import invalid


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    if not tools:
        return None
    converted = []
    for index, tool in enumerate(tools):
        param = f"tools[{index}]"
        if tool.get("type") != "function":
            raise invalid(
                "unsupported_tool",
                f"Tool type {tool.get('type')!r} at '{param}' is not supported by this server; use function tools.",
                f"{param}.type",
            )
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise invalid("missing_required_parameter", f"Missing required parameter: '{param}.name'.", f"{param}.name")
        function = {
            "name": name,
            "parameters": tool.get("parameters") or {"type": "object", "properties": {}},
        }
        if tool.get("description"):
            function["description"] = tool["description"]
        if tool.get("strict") is not None:
            function["strict"] = tool["strict"]
        converted.append({"function": function, "type": "function"})
    return converted


def chat_tool_choice(choice: Any, tools: list[dict[str, Any]] | None) -> Any:
    if choice is None or not tools:
        return None
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        names = {tool["function"]["name"] for tool in tools}
        if choice["name"] not in names:
            raise invalid("invalid_value", f"tool_choice names unknown function {choice['name']!r}.", "tool_choice")
        return {"function": {"name": choice["name"]}, "type": "function"}
    raise invalid("invalid_value", "Invalid value for 'tool_choice'.", "tool_choice")
