"""Responses tools: every type of the SDK's `ToolParam` union is accepted; chat backends get functions.

The one rule for Chat Completions backends (the README's "Clients" section repeats it):
- `function` tools pass through.
- `namespace` tools are flattened: each member becomes a function named `<namespace>__<name>`;
  its calls map back to the member's own name with `namespace` set, as the API reports them.
- `custom` tools (free-form text, optional grammar) become a function with one string parameter,
  `input`, the grammar in its description; their calls come back as `custom_tool_call` items.
- Hosted tools (every other type: web search, file search, MCP, shell, ...) cannot run on a chat
  backend. The deployment's `hosted_tools` policy decides: `drop` (the default; the dropped types
  are listed in the response's metadata), `refuse` (`unsupported_tool`), or `pass` (a `responses`
  upstream runs them).
"""

from __future__ import annotations

import functools
import json
import logging
import re
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from openai.types.responses import ToolParam

from .backends.base import Delta, Finish, ToolCallDelta
from .errors import invalid
from .sdk import sdk_literal_types

if TYPE_CHECKING:
    from .requests import CreateRequest
    from .state import ResponseState

log = logging.getLogger(__name__)

HostedPolicy = Literal["drop", "refuse", "pass"]

NAMESPACE_SEPARATOR = "__"
"""A namespace member's chat function name is `<namespace>__<name>`."""

CUSTOM_INPUT = "input"
DROPPED_METADATA_KEY = "responses_ws.hosted_tools_dropped"


TOOL_TYPES = sdk_literal_types(ToolParam)
CALLABLE_TYPES = frozenset({"function", "custom", "namespace"})
HOSTED_TYPES = TOOL_TYPES - CALLABLE_TYPES

TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
"""As OpenAI: a callable tool's name is 1-64 letters, digits, underscores and dashes."""


@dataclass(frozen=True, slots=True)
class ToolOrigin:
    """What a chat function stands for: a function or custom tool, maybe inside a namespace."""

    name: str
    namespace: str | None = None
    custom: bool = False


@dataclass(frozen=True, slots=True)
class ChatTools:
    """A request's tools as a chat backend sees them, and the way back to the Responses names."""

    tools: list[dict[str, Any]] | None = None
    origins: dict[str, ToolOrigin] = field(default_factory=dict)
    dropped: tuple[str, ...] = ()

    def chat_name(self, name: str, *, custom: bool, namespace: str | None = None) -> str | None:
        """The chat function for a Responses tool name (plain or namespaced), if there is one."""
        for chat, origin in self.origins.items():
            if origin.custom == custom and origin.name == name and namespace in (None, origin.namespace):
                return chat
        return name if not custom and name in self.origins else None


def validate_tools(tools: list[dict[str, Any]] | None) -> None:
    """Refuse what no backend could make sense of: an unknown type, a callable tool without a name or with
    a name OpenAI refuses, two tools a backend would see under one name."""
    seen: set[str] = set()
    for index, tool in enumerate(tools or ()):
        param = f"tools[{index}]"
        if not isinstance(tool, dict):
            raise invalid("invalid_type", f"'{param}' must be an object.", param)
        kind = tool.get("type")
        if kind not in TOOL_TYPES:
            raise invalid(
                "unsupported_tool",
                f"Tool type {kind!r} at '{param}' is not a Responses tool type this server knows.",
                f"{param}.type",
            )
        if kind in CALLABLE_TYPES:
            _require_name(tool, param)
            _require_object(tool, param)
        if kind in ("function", "custom"):
            check_tool_name(tool["name"], tool["name"], seen, f"{param}.name")
        if kind == "namespace":
            members = tool.get("tools")
            if not isinstance(members, list) or not members:
                raise invalid("invalid_value", f"'{param}.tools' must be a non-empty array.", f"{param}.tools")
            for member_index, member in enumerate(members):
                member_param = f"{param}.tools[{member_index}]"
                if not isinstance(member, dict) or member.get("type") not in ("function", "custom"):
                    raise invalid(
                        "invalid_value", f"'{member_param}' must be a function or custom tool.", f"{member_param}.type"
                    )
                _require_name(member, member_param)
                _require_object(member, member_param)
                chat = f"{tool['name']}{NAMESPACE_SEPARATOR}{member['name']}"
                check_tool_name(member["name"], chat, seen, f"{member_param}.name")


def check_tool_name(name: str, chat: str, seen: set[str], param: str) -> None:
    """`name` follows OpenAI's rule, and no earlier tool has the same function name `chat` on a chat backend
    (its calls could not be told apart); `seen` collects the names so far."""
    if not TOOL_NAME.fullmatch(name):
        message = f"Invalid '{param}': a tool name is 1-64 characters of a-z, A-Z, 0-9, '_' and '-'."
        raise invalid("invalid_value", message, param)
    if chat in seen:
        raise invalid("invalid_value", f"Invalid '{param}': another tool is already named '{chat}'.", param)
    seen.add(chat)


def chat_tools(tools: list[dict[str, Any]] | None, hosted: HostedPolicy = "drop") -> ChatTools:
    """Convert validated Responses tools for a chat backend under the deployment's hosted-tool policy."""
    validate_tools(tools)
    converted: list[dict[str, Any]] = []
    origins: dict[str, ToolOrigin] = {}
    dropped: list[str] = []
    for index, tool in enumerate(tools or ()):
        kind = tool["type"]
        if kind == "namespace":
            for member in tool["tools"]:
                origin = ToolOrigin(member["name"], tool["name"], member["type"] == "custom")
                _add(converted, origins, f"{tool['name']}{NAMESPACE_SEPARATOR}{member['name']}", member, origin)
        elif kind in ("function", "custom"):
            _add(converted, origins, tool["name"], tool, ToolOrigin(tool["name"], custom=kind == "custom"))
        elif hosted == "refuse":
            raise invalid(
                "unsupported_tool",
                f"Tool type {kind!r} at 'tools[{index}]' is a hosted tool this deployment cannot run.",
                f"tools[{index}].type",
            )
        elif kind not in dropped:
            dropped.append(kind)
    return ChatTools(converted or None, origins, tuple(dropped))


def _add(
    converted: list[dict[str, Any]], origins: dict[str, ToolOrigin], chat: str, tool: dict[str, Any], origin: ToolOrigin
) -> None:
    function: dict[str, Any] = {"name": chat, "parameters": _parameters(tool, origin)}
    description = tool.get("description") or ""
    if origin.custom:
        description = (description + "\n\n" if description else "") + _custom_format_note(tool.get("format"))
    if description:
        function["description"] = description
    if tool.get("strict") is not None and not origin.custom:
        function["strict"] = tool["strict"]
    converted.append({"function": function, "type": "function"})
    origins[chat] = origin


def _parameters(tool: dict[str, Any], origin: ToolOrigin) -> dict[str, Any]:
    if origin.custom:
        return {
            "type": "object",
            "properties": {CUSTOM_INPUT: {"type": "string", "description": "The tool's whole input, as text."}},
            "required": [CUSTOM_INPUT],
        }
    return tool.get("parameters") or {"type": "object", "properties": {}}


def _custom_format_note(fmt: Any) -> str:
    if isinstance(fmt, dict) and fmt.get("type") == "grammar":
        return f"Put the whole input in `input`; it must follow this {fmt.get('syntax', '')} grammar:\n{fmt.get('definition', '')}"
    return "Put the whole input, free-form text, in `input`."


def _require_name(tool: dict[str, Any], param: str) -> None:
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise invalid("missing_required_parameter", f"Missing required parameter: '{param}.name'.", f"{param}.name")


def _require_object(tool: dict[str, Any], param: str) -> None:
    """A function's `parameters` and a custom tool's `format` are objects (or null) in the SDK's types."""
    key = "format" if tool.get("type") == "custom" else "parameters"
    if key in tool and tool[key] is not None and not isinstance(tool[key], dict):
        raise invalid("invalid_value", f"Invalid value for '{param}.{key}': expected an object.", f"{param}.{key}")


def chat_tool_choice(choice: Any, tools: ChatTools) -> tuple[list[dict[str, Any]] | None, Any]:
    """The tools to send and the chat `tool_choice` for every form of the SDK's `ToolChoice`.

    `allowed_tools` narrows the tools sent (portable, unlike chat's own `allowed_tools`); forcing a
    hosted tool the backend does not have falls back to `auto`.
    """
    if choice is None:
        return tools.tools, None
    if choice in ("auto", "none", "required"):
        return tools.tools, choice if tools.tools else None
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind in ("function", "custom") and isinstance(choice.get("name"), str):
        chat = tools.chat_name(choice["name"], custom=kind == "custom", namespace=choice.get("namespace"))
        if chat is None:
            raise invalid("invalid_value", f"tool_choice names unknown {kind} tool {choice['name']!r}.", "tool_choice")
        return tools.tools, {"function": {"name": chat}, "type": "function"}
    if kind == "allowed_tools" and choice.get("mode") in ("auto", "required") and isinstance(choice.get("tools"), list):
        allowed = {chat for ref in choice["tools"] if isinstance(ref, dict) for chat in _chat_names(ref, tools)}
        narrowed = [tool for tool in tools.tools or () if tool["function"]["name"] in allowed]
        return narrowed or None, choice["mode"] if narrowed else None
    if kind in HOSTED_TYPES | {"mcp", "programmatic_tool_calling", "computer_use"}:
        return tools.tools, "auto" if tools.tools else None
    raise invalid("invalid_value", "Invalid value for 'tool_choice'.", "tool_choice")


def _chat_names(ref: dict[str, Any], tools: ChatTools) -> list[str]:
    kind = ref.get("type")
    if kind == "namespace":
        return [chat for chat, origin in tools.origins.items() if origin.namespace == ref.get("name")]
    if kind in ("function", "custom") and isinstance(ref.get("name"), str):
        chat = tools.chat_name(ref["name"], custom=kind == "custom", namespace=ref.get("namespace"))
        return [chat] if chat else []
    return []


def restore_calls(
    deltas: AsyncGenerator[Delta, None], tools: ChatTools, max_calls: int | None = None
) -> AsyncGenerator[Delta, None]:
    """Backend deltas with each call mapped back to its Responses tool, and at most `max_calls` calls.

    `deltas` itself when there is nothing to map back or to limit (`restores_calls`): no generator
    layer between the backend and the turn for each delta.
    """
    return _restored(deltas, tools, max_calls) if restores_calls(tools, max_calls) else deltas


def restores_calls(tools: ChatTools, max_calls: int | None) -> bool:
    """Whether `restore_calls` has anything to do: a namespaced or custom tool to map back, or `max_tool_calls`."""
    if max_calls is not None:
        return True
    for origin in tools.origins.values():  # noqa: SIM110 - not any() over a generator: asked every turn
        if origin.namespace is not None or origin.custom:
            return True
    return False


async def _restored(
    deltas: AsyncIterator[Delta], tools: ChatTools, max_calls: int | None
) -> AsyncGenerator[Delta, None]:
    """`restore_calls` when there is something to restore.

    A namespaced function's pieces get the member's name and namespace. A custom tool's call is
    held until the stream finishes, then yielded whole with its `input` text as the arguments,
    since its JSON wrapper can only be taken off once complete. Calls past `max_calls` (the
    request's `max_tool_calls`) are dropped: the shim enforces the limit whatever the backend does.
    A call the backend already reports as custom or namespaced (a `responses` upstream) passes as it is.
    """
    origins: dict[int, ToolOrigin | None] = {}
    over_limit: set[int] = set()
    held: dict[int, list[ToolCallDelta]] = {}
    async for delta in deltas:
        if isinstance(delta, Finish):
            for pieces in held.values():
                yield _custom_call(pieces, origins)
            held.clear()
        if not isinstance(delta, ToolCallDelta):
            yield delta
            continue
        if delta.index not in origins and delta.index not in over_limit:
            if max_calls is not None and len(origins) >= max_calls:
                over_limit.add(delta.index)
            else:
                mapped = delta.custom or delta.namespace is not None  # a responses upstream's own call: as it is
                origins[delta.index] = None if mapped else tools.origins.get(delta.name or "")
        if delta.index in over_limit:
            continue
        origin = origins[delta.index]
        if origin is None or (origin.namespace is None and not origin.custom):
            yield delta
        elif origin.custom:
            held.setdefault(delta.index, []).append(delta)
        else:
            named = delta.name is not None
            yield ToolCallDelta(
                delta.index,
                delta.arguments,
                delta.call_id,
                origin.name if named else None,
                origin.namespace if named else None,
            )
    for pieces in held.values():
        yield _custom_call(pieces, origins)


def _custom_call(pieces: list[ToolCallDelta], origins: dict[int, ToolOrigin | None]) -> ToolCallDelta:
    first = pieces[0]
    origin = origins[first.index]
    assert origin is not None
    arguments = "".join(piece.arguments for piece in pieces)
    call_id = next((piece.call_id for piece in pieces if piece.call_id), None)
    return ToolCallDelta(first.index, custom_input(arguments), call_id, origin.name, origin.namespace, custom=True)


def custom_input(arguments: str) -> str:
    """The text inside a custom tool's `{"input": ...}` arguments (the raw arguments if they are not that)."""
    try:
        parsed = json.loads(arguments)
    except json.JSONDecodeError:
        return arguments
    if isinstance(parsed, dict) and isinstance(parsed.get(CUSTOM_INPUT), str):
        return parsed[CUSTOM_INPUT]
    return arguments


class ToolPlan(NamedTuple):
    """A turn's tools, checked before inference: for chat backends, what they send, and for the others (a named
    tuple: a frozen dataclass sets each field through `object.__setattr__`, thousands of instructions per turn)."""

    chat: ChatTools
    sent: list[dict[str, Any]] | None
    """The chat tools a chat backend sends (after `allowed_tools`)."""
    backend: list[dict[str, Any]] | None
    """The client's tools as a non-chat backend gets them: hosted ones left out unless the policy is `pass`."""


_tool_plan = functools.partial(tuple.__new__, ToolPlan)
"""`ToolPlan(chat, sent, backend)` made in C (a named tuple's `__new__` is Python: ~1,300 instructions more a turn)."""


def plan_tools(
    request: CreateRequest,
    previous: ResponseState | None,
    policy: Callable[[str, str | None], str],
    sticky: str | None,
    labels: dict[str, str],
    notices: set[str],
) -> ToolPlan:
    """Check the request's tools and `tool_choice` and apply the hosted-tool `policy` of the deployment the model
    and `sticky` route go to (asked only when there are hosted tools): `refuse` raises `unsupported_tool`, `drop`
    labels the response and logs once per connection (`notices`), `pass` sends them on to an upstream that runs
    them."""
    given = request.tools or []
    chat = previous.chat_tools if previous is not None and previous.tools == given else chat_tools(given)
    sent, _ = chat_tool_choice(request.tool_choice, chat)  # raises for a choice naming no tool
    backend = given or None
    if chat.dropped:
        decided = policy(request.model, sticky)
        if decided == "refuse":
            index = next(i for i, tool in enumerate(given) if tool["type"] in chat.dropped)
            raise invalid(
                "unsupported_tool",
                f"Tool type {chat.dropped[0]!r} at 'tools[{index}]' is a hosted tool this deployment cannot run.",
                f"tools[{index}].type",
            )
        if decided != "pass":
            backend = [tool for tool in given if tool["type"] not in HOSTED_TYPES] or None
        if decided == "drop":
            labels[DROPPED_METADATA_KEY] = ",".join(chat.dropped)
            fresh = [kind for kind in chat.dropped if f"dropped:{kind}" not in notices]
            if fresh:
                notices.update(f"dropped:{kind}" for kind in fresh)
                log.info("dropping hosted tools %s, which this backend cannot run", fresh)
    return _tool_plan((chat, sent, backend))
