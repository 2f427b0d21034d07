"""A `POST /v1/chat/completions` body, validated at the edge and said as a Responses turn.

The chat endpoint runs the same turn pipeline as `POST /v1/responses` (auth, tenants, limits,
validators, checks, the router and its backends, the usage ledger), so a chat request becomes a
`CreateRequest`: messages as input items and tools as Responses tools (`chat_mapping`, shared
with the client), `max_tokens` as `max_output_tokens`, `response_format` as `text.format`,
`reasoning_effort` as `reasoning.effort`; never stored (a chat completion has no
`previous_response_id` to continue). What the Responses API cannot say goes beside it:
`stop` is applied to the answer here (and sent to chat backends), `n` runs one turn per
choice, and `seed`, `frequency_penalty`, `presence_penalty`, `logit_bias` reach chat backends
as they are (the simulator and a `responses` upstream ignore them); `logprobs` and `top_logprobs`
ask for the output text's log probabilities, returned as the chat choice's `logprobs` when the
backend gives them. A message's `name` is accepted and ignored; audio, legacy `functions` and predicted outputs are refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, ValidationError, field_validator

from chat_mapping import Malformed, Unmapped, message_items, tool, tool_choice

from .errors import APIError, invalid
from .limits import RequestLimits
from .request_fields import LOGPROBS_INCLUDE
from .requests import CreateRequest, ServiceTier, parse_create, validation_error
from .tools import check_tool_name

MAX_CHOICES = 8
"""The most choices (`n`) one request may ask for: each runs a turn of its own on the backend."""
MAX_STOP = 4
"""As OpenAI: up to four stop sequences."""
MAX_STOP_CHARS = 256
"""The longest stop sequence: the stream holds back up to this many characters that may begin one,
and matching costs up to this many per delta (OpenAI states no bound; chat agents' are a few words)."""
CHAT_ONLY = ("stop", "seed", "frequency_penalty", "presence_penalty", "logit_bias")
"""Fields with no Responses equivalent that chat backends get as they are."""
UNSUPPORTED = {
    "audio": "audio output",
    "functions": "legacy 'functions' (send 'tools')",
    "function_call": "legacy 'function_call' (send 'tool_choice')",
    "prediction": "predicted outputs",
    "web_search_options": "web search",
}
SAME_NAME = (
    "temperature",
    "top_p",
    "parallel_tool_calls",
    "user",
    "metadata",
    "service_tier",
    "prompt_cache_key",
    "safety_identifier",
)
"""Fields with the same name and meaning in both APIs."""
ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})


class ChatBody(BaseModel):
    """The fields the endpoint acts on, with the SDK's types; unknown fields are accepted and ignored."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1)
    messages: list[Any] = Field(min_length=1)
    stream: StrictBool | None = None
    stream_options: dict[str, StrictBool] | None = None
    n: StrictInt | None = Field(default=None, ge=1, le=MAX_CHOICES)
    stop: str | list[str] | None = None
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1)
    temperature: StrictFloat | None = Field(default=None, ge=0, le=2)
    top_p: StrictFloat | None = Field(default=None, ge=0, le=1)
    frequency_penalty: StrictFloat | None = Field(default=None, ge=-2, le=2)
    presence_penalty: StrictFloat | None = Field(default=None, ge=-2, le=2)
    seed: StrictInt | None = None
    logit_bias: dict[str, Annotated[StrictInt, Field(ge=-100, le=100)]] | None = None
    logprobs: StrictBool | None = None
    top_logprobs: StrictInt | None = Field(default=None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: StrictBool | None = None
    response_format: dict[str, Any] | None = None
    reasoning_effort: str | None = None
    verbosity: str | None = None
    user: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    service_tier: ServiceTier | None = None
    metadata: dict[str, str] | None = None
    store: StrictBool | None = None
    modalities: list[str] | None = None

    @field_validator("stop")
    @classmethod
    def _stop(cls, value: str | list[str] | None) -> str | list[str] | None:
        stops = [value] if isinstance(value, str) else value or []
        if len(stops) > MAX_STOP or not all(0 < len(stop) <= MAX_STOP_CHARS for stop in stops):
            raise ValueError(
                f"must be a non-empty string or up to {MAX_STOP} non-empty strings of at most {MAX_STOP_CHARS} characters"
            )
        return value


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """A chat request as the endpoint runs it: the turn's request, and what shapes the answer."""

    create: CreateRequest
    choices: int
    stops: tuple[str, ...]
    stream: bool
    include_usage: bool
    owners: tuple[str, ...] = ()
    """For each input item, the chat path it came from (`messages[2]`, `messages[2].tool_calls[0]`)."""

    def choice(self, index: int) -> CreateRequest:
        """The turn request of choice `index`. With a `seed`, choice i gets `seed + i`: one seed for
        all would give `n` identical choices from a backend that honours it (vLLM, llama.cpp)."""
        seed = self.create.chat_only.get("seed")
        if index == 0 or seed is None:
            return self.create
        create = self.create.model_copy()
        create.chat_only = {**self.create.chat_only, "seed": seed + index}
        return create

    def chat_error(self, error: APIError) -> APIError:
        """`error` (raised on the Responses request: parsing, `turn.prepare()`) naming the chat parameter."""
        return chat_error(error, self.owners)


def parse_chat(body: dict[str, Any], limits: RequestLimits) -> ChatRequest:
    """Validate a chat body and say it as a Responses request; errors name the chat parameter."""
    try:
        chat = ChatBody.model_validate(body)
    except ValidationError as exc:
        raise _chat_validation_error(exc) from None
    for name, what in UNSUPPORTED.items():
        if getattr(chat, "model_extra", {}).get(name) is not None:
            raise invalid("unsupported_parameter", f"'{name}' ({what}) is not supported by this server.", name)
    if any(modality != "text" for modality in chat.modalities or ()):
        raise invalid("unsupported_parameter", "Only the 'text' modality is supported by this server.", "modalities")
    items, owners = messages_input(chat.messages)
    fields = _responses_fields(chat, items)
    try:
        create = parse_create(fields, websocket=False, limits=limits)
    except APIError as error:
        raise chat_error(error, owners) from None
    _check_tool_names(fields.get("tools") or [])
    create.chat_only = {name: getattr(chat, name) for name in CHAT_ONLY if getattr(chat, name) is not None}
    stream = chat.stream is True
    return ChatRequest(
        create=create,
        choices=chat.n or 1,
        stops=(chat.stop,) if isinstance(chat.stop, str) else tuple(chat.stop or ()),
        stream=stream,
        include_usage=stream and (chat.stream_options or {}).get("include_usage") is True,
        owners=owners,
    )


def _chat_validation_error(exc: ValidationError) -> APIError:
    """pydantic's error, its location said as the chat parameter: `tools[0]`, never `stop.str`
    (a union member), `tools.0` or `logit_bias.1` (a key)."""
    error = validation_error(exc)
    loc = exc.errors()[0]["loc"]
    if loc:
        param = str(loc[0]) + "".join(f"[{part}]" for part in loc[1:] if isinstance(part, int))
        error.message = error.message.replace(f"'{error.param}'", f"'{param}'")
        error.param = param
    return error


def _responses_fields(chat: ChatBody, items: list[dict[str, Any]]) -> dict[str, Any]:
    fields: dict[str, Any] = {"model": chat.model, "input": items, "store": False}
    for name in SAME_NAME:
        if getattr(chat, name) is not None:
            fields[name] = getattr(chat, name)
    limit = chat.max_completion_tokens or chat.max_tokens
    if limit is not None:
        fields["max_output_tokens"] = limit
    if chat.reasoning_effort is not None:
        fields["reasoning"] = {"effort": chat.reasoning_effort}
    if chat.logprobs:  # the output text's log probabilities, as the Responses API asks for them
        fields["include"] = [LOGPROBS_INCLUDE]
        if chat.top_logprobs is not None:
            fields["top_logprobs"] = chat.top_logprobs
    text = _text(chat)
    if text:
        fields["text"] = text
    if chat.tools is not None:
        fields["tools"] = [_mapped(tool, t, f"tools[{i}]") for i, t in enumerate(chat.tools)]
    if chat.tool_choice is not None:
        fields["tool_choice"] = _mapped(tool_choice, chat.tool_choice, "tool_choice")
    return fields


def _text(chat: ChatBody) -> dict[str, Any]:
    text: dict[str, Any] = {}
    fmt = chat.response_format
    if fmt is not None:
        kind = fmt.get("type")
        if kind == "json_schema" and isinstance(fmt.get("json_schema"), dict):
            text["format"] = {"type": "json_schema", **fmt["json_schema"]}
        elif kind in ("json_object", "text"):
            text["format"] = {"type": kind}
        else:
            raise invalid(
                "invalid_value",
                "'response_format' must be {'type': 'text'}, {'type': 'json_object'} or "
                "{'type': 'json_schema', 'json_schema': {...}}.",
                "response_format",
            )
    if chat.verbosity is not None:
        text["verbosity"] = chat.verbosity
    return text


def _check_tool_names(tools: list[dict[str, Any]]) -> None:
    seen: set[str] = set()
    for index, function in enumerate(tools):
        name = function.get("name")
        name = name if isinstance(name, str) else ""
        check_tool_name(name, name, seen, f"tools[{index}].function.name")


def messages_input(messages: list[Any]) -> tuple[list[dict[str, Any]], tuple[str, ...]]:
    """The messages as Responses input items, and the chat path each item came from; a message that
    cannot be read is a 400 naming it."""
    items: list[dict[str, Any]] = []
    owners: list[str] = []
    for index, message in enumerate(messages):
        param = f"messages[{index}]"
        if not isinstance(message, dict):
            raise invalid("invalid_type", f"Invalid type for '{param}': expected an object.", param)
        role = message.get("role")
        if role not in ROLES:
            raise invalid("invalid_value", f"Invalid value for '{param}.role': expected one of {sorted(ROLES)}.", param)
        if role == "tool" and not isinstance(message.get("tool_call_id"), str):
            raise invalid("missing_required_parameter", f"Missing required parameter: '{param}.tool_call_id'.", param)
        if role != "tool":
            message = {k: v for k, v in message.items() if k != "name"}  # a participant name: no Responses field
        said = _mapped(message_items, message, param)
        items.extend(said)
        calls = 0
        for item in said:
            owners.append(f"{param}.tool_calls[{calls}]" if item["type"] == "function_call" else param)
            calls += item["type"] == "function_call"
    return items, tuple(owners)


def _mapped(mapping: Any, value: Any, param: str) -> Any:
    """`mapping(value)`, a malformed or unsupported value a 400 naming `param`."""
    try:
        return mapping(value)
    except Malformed as bad:
        where = f"{param}.{bad.where}"
        raise invalid("invalid_type", f"Invalid type for '{where}': {bad.reason}.", where) from None
    except Unmapped as refused:
        raise invalid(
            "unsupported_value", f"'{param}': {refused.reason} are not supported by this server.", param
        ) from None
    except KeyError as missing:
        raise invalid(
            "missing_required_parameter", f"Missing required parameter in '{param}': {missing}.", param
        ) from None
    except (TypeError, AttributeError):
        raise invalid(
            "invalid_type", f"Invalid type in '{param}': not the shape the Chat Completions API sends.", param
        ) from None


_CHAT_NAMES = {
    "max_output_tokens": "max_tokens",
    "reasoning.effort": "reasoning_effort",
    "reasoning": "reasoning_effort",
}
_ITEM = re.compile(r"input\[(\d+)\](.*)")
_ITEM_FIELDS = {"name": "function.name", "arguments": "function.arguments", "output": "content"}
"""An input item's field, as the chat message (or its tool call) has it."""


def chat_error(error: APIError, owners: tuple[str, ...]) -> APIError:
    """`error` with its Responses parameter said as the chat request called it, in `param` and in the message."""
    param = chat_param(error.param, owners)
    if error.param is not None and param != error.param:
        error.message = error.message.replace(f"'{error.param}'", f"'{param}'").replace("'text'", "'response_format'")
        error.param = param
    return error


def chat_param(param: str | None, owners: tuple[str, ...] = ()) -> str | None:
    """A Responses parameter name, as the chat request called it: `input[3].content[0].text` is
    `messages[2].content[0].text` when item 3 came from message 2, `input[4].arguments` is
    `messages[2].tool_calls[0].function.arguments`, `tools[0].parameters` is
    `tools[0].function.parameters`, `text.format...` is `response_format`."""
    if param is None:
        return None
    item = _ITEM.fullmatch(param)
    if item is not None:
        index, rest = int(item.group(1)), item.group(2)
        if index >= len(owners):
            return "messages"
        owner = owners[index]
        field = rest.lstrip(".").split(".")[0].split("[")[0]
        if field == "call_id":
            return owner + (".id" if ".tool_calls[" in owner else ".tool_call_id")
        renamed = _ITEM_FIELDS.get(field)
        return owner + (rest if field == "content" else f".{renamed}" if renamed else "")
    tool = re.fullmatch(r"(tools\[\d+\])\.(name|description|parameters|strict)(.*)", param)
    if tool is not None:
        return f"{tool.group(1)}.function.{tool.group(2)}{tool.group(3)}"
    head = param.split("[")[0]
    if head == "input":
        return "messages"
    if head == "text" or param.startswith("text."):
        return "response_format"
    return _CHAT_NAMES.get(param, param)
