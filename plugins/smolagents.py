"""smolagents: an `OpenAIServerModel` (`OpenAIModel`) whose calls ride one WebSocket session, chained.

    from plugins.smolagents import websocket_model

    model = websocket_model(OpenAIServerModel(model_id="gpt-4.1", api_base=..., api_key=...))
    agent = ToolCallingAgent(tools=[lookup], model=model)   # unchanged

The model's `client` is wrapped by `ws_transport.wrap()`, so each `chat.completions.create` goes
over the session. Two things would stop it from chaining, and the adapter changes both:

- smolagents replays each tool step as text: an assistant message `Calling tools:\\n[{...}]` (the
  calls' Python repr) and a user message `Observation:\\n...`, so no later request contains the
  answer the model gave, and nothing can continue it. The adapter sends such a step in the native
  form instead: the assistant message with its `tool_calls` (the same ids, names and arguments the
  model produced) and a `tool` message with the observation. A step with several calls in parallel
  stays as smolagents writes it (their observations are one joined text), as does a call with no
  id (a `tool` message must name one), and that call goes in full.
- `ToolCallingAgent` asks for `stop=["Observation:", "Calling tools:"]` with its tools, which the
  Responses API lacks (a call with `stop` goes over HTTP). The adapter removes that pair, and only
  it: that agent acts on the model's tool calls, which a stop sequence does not cut. Every other
  `stop` goes through (a `CodeAgent`'s `Observation:`/`Calling tools:`/`</code>`, planning's
  `<end_plan>`, one set in `model.kwargs`): it ends the code block or plan where smolagents
  expects, so those calls go over HTTP by `wrap()`'s rule (the shim's `/v1/chat/completions`
  applies `stop` on every backend) and do not chain. The WebSocket mode has no `stop` field, and
  adding one would make the session speak a protocol OpenAI's endpoint does not.
"""

from __future__ import annotations

import ast
import json
from typing import Any, TypeVar

import ws_transport

ModelT = TypeVar("ModelT")

CALLING = "Calling tools:\n"
OBSERVATION = "Observation:\n"
TOOL_CALLING_STOP = ["Observation:", "Calling tools:"]
"""What `ToolCallingAgent` asks for with its tools; the only `stop` the adapter removes."""


def websocket_model(model: ModelT, **options: Any) -> ModelT:
    """Route `model`'s calls over one WebSocket session, with its tool steps sent in the native form;
    returns `model`. `options` are `ws_transport.SessionOptions` fields."""
    from smolagents.models import OpenAIModel

    if not isinstance(model, OpenAIModel):
        raise TypeError(f"expected a smolagents OpenAIServerModel, got {type(model).__name__}")
    model.client = ws_transport.wrap(model.client, chat_completions=True, **options)
    prepare = model._prepare_completion_kwargs

    def prepare_native(*args: Any, **kwargs: Any) -> dict[str, Any]:
        completion: dict[str, Any] = prepare(*args, **kwargs)
        completion["messages"] = native_tool_steps(completion["messages"])
        if completion.get("tools") and completion.get("stop") == TOOL_CALLING_STOP:
            del completion["stop"]
        return completion

    model._prepare_completion_kwargs = prepare_native  # type: ignore[method-assign]
    return model


def session_of(model: Any) -> ws_transport.Session:
    """The session behind a model returned by `websocket_model`: stats, chains."""
    return ws_transport.session_of(model.client)


def native_tool_steps(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """smolagents' text replay of its tool steps (`Calling tools:` then `Observation:`) as the assistant
    `tool_calls` and `tool` message the model's answer and the tool's result are in the Chat Completions API."""
    out: list[dict[str, Any]] = []
    index = 0
    while index < len(messages):
        message = messages[index]
        following = messages[index + 1] if index + 1 < len(messages) else None
        step = _tool_step(message, following)
        if step is None:
            out.append(message)
            index += 1
        else:
            out.extend(step)
            index += 2
    return out


def _tool_step(message: dict[str, Any], following: dict[str, Any] | None) -> list[dict[str, Any]] | None:
    """The native pair for one single-call step, or None when these two messages are not one."""
    text = _text(message)
    if message.get("role") != "assistant" or text is None or CALLING not in text or following is None:
        return None
    observation = _text(following)
    if following.get("role") != "user" or observation is None or not observation.startswith(OBSERVATION):
        return None
    said, _, replay = text.partition(CALLING)
    try:
        calls = ast.literal_eval(replay)
    except (ValueError, SyntaxError):
        return None
    if not isinstance(calls, list) or len(calls) != 1 or not isinstance(calls[0], dict):
        return None
    call = calls[0]
    if not isinstance(call.get("id"), str) or not call["id"]:
        return None  # a `tool` message needs the call's id: without one, the text form stands
    function = call.get("function") or {}
    arguments = function.get("arguments")
    native_call = {
        "id": call.get("id"),
        "type": "function",
        "function": {
            "name": function.get("name"),
            "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
        },
    }
    assistant = {"role": "assistant", "content": said.strip() or None, "tool_calls": [native_call]}
    return [assistant, {"role": "tool", "tool_call_id": call["id"], "content": observation[len(OBSERVATION) :]}]


def _text(message: dict[str, Any]) -> str | None:
    """A message's text when it is only text (a string, or smolagents' text parts)."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    return None
