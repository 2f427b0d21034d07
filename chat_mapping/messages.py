"""Chat messages and tools as Responses input items and tools. No I/O.

Each mapping says the same thing in the other API or raises `Unmapped` naming what it cannot
say (an audio part, a custom tool): the client then leaves the call on HTTP, the server answers
400. `Malformed`, an `Unmapped`, is a message the Chat Completions API itself refuses (a part's
`text` not a string): the client leaves it to HTTP too (the API's own 400), the server answers
400 `invalid_type` naming the field.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pydantic


class Unmapped(ValueError):
    """This chat request cannot be said in the Responses API without changing its meaning; `reason` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Malformed(Unmapped):
    """Not what the Chat Completions API accepts; `where` is the field, within the message or tool."""

    def __init__(self, reason: str, where: str) -> None:
        super().__init__(reason)
        self.where = where


def tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    """A chat function tool as a Responses function tool (not strict unless asked, as in chat)."""
    if tool.get("type") != "function":
        raise Unmapped(f"{tool.get('type')} tools")
    function = tool["function"]
    out: dict[str, Any] = {"type": "function", "name": function["name"]}
    if function.get("description") is not None:
        out["description"] = function["description"]
    out["parameters"] = function.get("parameters")
    out["strict"] = function.get("strict") is True  # strict by default in Responses, not in chat
    return out


def tool_choice(choice: Any) -> Any:
    """A chat `tool_choice` in its Responses form."""
    if isinstance(choice, str):
        return choice
    kind = choice.get("type")
    if kind == "function":
        return {"type": "function", "name": choice["function"]["name"]}
    if kind == "allowed_tools":
        allowed = choice["allowed_tools"]
        tools = [{"type": "function", "name": t["function"]["name"]} for t in allowed["tools"]]
        if any(t.get("type") != "function" for t in allowed["tools"]):
            raise Unmapped("allowed_tools with non-function tools")
        return {"type": "allowed_tools", "mode": allowed["mode"], "tools": tools}
    raise Unmapped(f"tool_choice {kind}")


def as_dict(message: Any) -> dict[str, Any]:
    """A message as a plain dict: callers often append the SDK's `ChatCompletionMessage` objects as they got them."""
    if isinstance(message, pydantic.BaseModel):
        return message.model_dump(mode="json", exclude_none=True)
    if isinstance(message, Mapping):
        return dict(message)
    raise Unmapped(f"a message of type {type(message).__name__}")


def messages_to_items(messages: Iterable[Any]) -> list[dict[str, Any]]:
    """Responses input items saying what the messages say; raises `Unmapped` for what they cannot."""
    items: list[dict[str, Any]] = []
    for message in messages:
        items.extend(message_items(as_dict(message)))
    return items


def message_items(message: dict[str, Any]) -> list[dict[str, Any]]:
    role = message.get("role")
    if role not in ("system", "developer", "user", "assistant", "tool"):
        raise Unmapped(f"{role} messages")
    if message.get("name") is not None and role != "tool":  # a tool message's name is not in the API (CrewAI sends it)
        raise Unmapped("message name")
    if role in ("system", "developer"):
        return [{"type": "message", "role": role, "content": _plain_content(message.get("content"), "input_text")}]
    if role == "user":
        return [{"type": "message", "role": "user", "content": _user_content(message.get("content"))}]
    if role == "assistant":
        return _assistant_items(message)
    output = _text_only(message.get("content"))
    return [{"type": "function_call_output", "call_id": message["tool_call_id"], "output": output}]


def _assistant_items(message: dict[str, Any]) -> list[dict[str, Any]]:
    for unsupported in ("audio", "function_call"):
        if message.get(unsupported):
            raise Unmapped(f"assistant {unsupported}")
    items: list[dict[str, Any]] = []
    text = _text_only(message.get("content"))
    refusal = message.get("refusal")
    if refusal is not None and not isinstance(refusal, str):
        raise Malformed("'refusal' must be a string", "refusal")
    if refusal:  # the model's refusal: a `refusal` part of its message, as a Response's output has it
        parts = [{"type": "output_text", "text": text}] if text else []
        items.append(
            {"type": "message", "role": "assistant", "content": [*parts, {"type": "refusal", "refusal": refusal}]}
        )
    elif text:
        items.append({"type": "message", "role": "assistant", "content": text})
    for call in message.get("tool_calls") or ():
        if call.get("type", "function") != "function":
            raise Unmapped(f"{call.get('type')} tool calls")
        function = call["function"]
        items.append(
            {
                "type": "function_call",
                "call_id": call["id"],
                "name": function["name"],
                "arguments": function["arguments"],
            }
        )
    return items


def _plain_content(content: Any, part_type: str) -> Any:
    if isinstance(content, str) or content is None:
        return content or ""
    return [{"type": part_type, "text": _part_text(part, index)} for index, part in enumerate(_parts(content))]


def _user_content(content: Any) -> Any:
    if isinstance(content, str) or content is None:
        return content or ""
    parts = []
    for index, part in enumerate(_parts(content)):
        kind = part.get("type")
        if kind == "text":
            parts.append({"type": "input_text", "text": _part_text(part, index)})
        elif kind == "image_url":
            image = part["image_url"]
            parts.append({"type": "input_image", "image_url": image["url"], "detail": image.get("detail") or "auto"})
        elif kind == "file":
            parts.append({"type": "input_file", **{k: v for k, v in part["file"].items() if v is not None}})
        else:
            raise Unmapped(f"{kind} content")
    return parts


def _text_only(content: Any) -> str:
    if isinstance(content, str) or content is None:
        return content or ""
    return "".join(_part_text(part, index) for index, part in enumerate(_parts(content)))


def _parts(content: Any) -> list[Any]:
    if not isinstance(content, list):
        raise Malformed("'content' must be a string or an array of content parts", "content")
    return content


def _part_text(part: Any, index: int) -> str:
    if not isinstance(part, Mapping):
        raise Malformed("a content part must be an object", f"content[{index}]")
    if part.get("type") != "text":
        raise Unmapped(f"{part.get('type')} content in a text-only message")
    if not isinstance(part.get("text"), str):
        raise Malformed("a text part's 'text' must be a string", f"content[{index}].text")
    return part["text"]
