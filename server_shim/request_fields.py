"""Request fields beyond the conversation, in each backend's form.

A `responses` upstream gets every field the client set that the shim does not handle itself,
untouched. A Chat Completions backend gets the chat equivalents: `text.format` as
`response_format`, `reasoning.effort` as `reasoning_effort`, `top_logprobs` (or an `include` of
the output text's logprobs) with `logprobs`, and `prompt_cache_key`, `safety_identifier`, `user`, `service_tier` as they are (a deployment
whose server refuses one lists it in `quirks.drop_params`). `text.verbosity`, the rest of `include`,
`reasoning.summary` and `prompt_cache_retention` have no chat equivalent and are not sent.
"""

from __future__ import annotations

from typing import Any

from .requests import CreateRequest

SHIM_FIELDS = frozenset(
    {
        "type",
        "model",
        "input",
        "instructions",
        "previous_response_id",
        "tools",
        "tool_choice",
        "store",
        "stream",
        "stream_options",
        "background",
        "generate",
        "stream_id",
        "max_output_tokens",
        "metadata",
        "conversation",
        "truncation",
    }
)
"""Fields the shim acts on itself or sends in their own place."""

LOGPROBS_INCLUDE = "message.output_text.logprobs"
"""Asks for the output text's log probabilities (as a positive `top_logprobs` does): chat backends get `logprobs`."""
_CHAT_AS_IS = ("temperature", "top_p", "prompt_cache_key", "safety_identifier", "user", "service_tier")


_FORWARDED = tuple(name for name in CreateRequest.model_fields if name not in SHIM_FIELDS)


def responses_fields(request: CreateRequest) -> dict[str, Any]:
    """What a `responses` upstream gets beside the conversation: the client's fields, untouched.

    The values themselves, not copies (every turn builds this, whatever its backend; `model_dump`
    re-encoded every value of every unknown field, ~1 µs a value); nothing changes them. Read from the
    model's `__dict__`: an attribute read on a pydantic model costs ~350 instructions more than a dict's.
    """
    values = request.__dict__
    fields = {name: value for name in _FORWARDED if (value := values[name]) is not None}
    for name, value in (request.__pydantic_extra__ or {}).items():
        if name not in SHIM_FIELDS and value is not None:
            fields[name] = value
    return fields


def chat_options(request: CreateRequest) -> dict[str, Any]:
    """The same fields for a Chat Completions backend (read from the model's `__dict__`, as `responses_fields`)."""
    values = request.__dict__
    options = {name: value for name in _CHAT_AS_IS if (value := values[name]) is not None}
    if values["parallel_tool_calls"] is not None and values["tools"]:
        options["parallel_tool_calls"] = values["parallel_tool_calls"]
    response_format = chat_response_format((values["text"] or {}).get("format"))
    if response_format is not None:
        options["response_format"] = response_format
    effort = (values["reasoning"] or {}).get("effort")
    if effort is not None:
        options["reasoning_effort"] = effort
    top_logprobs = values["top_logprobs"]
    if top_logprobs or LOGPROBS_INCLUDE in (values["include"] or ()):
        options["logprobs"] = True
        if top_logprobs is not None:
            options["top_logprobs"] = top_logprobs
    chat_only = request.chat_only
    if chat_only:
        options.update(chat_only)
    return options


def chat_response_format(fmt: dict[str, Any] | None) -> dict[str, Any] | None:
    """`text.format` (validated by `CreateRequest`) as Chat Completions' `response_format`."""
    if fmt is None or fmt["type"] == "text":
        return None
    if fmt["type"] == "json_object":
        return {"type": "json_object"}
    schema = {key: fmt[key] for key in ("name", "schema", "description", "strict") if fmt.get(key) is not None}
    return {"type": "json_schema", "json_schema": schema}
