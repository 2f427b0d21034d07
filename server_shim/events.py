"""Responses stream events: sequence numbers, lane echo, and assembling output items from deltas."""

from __future__ import annotations

import functools
import os
import threading
import time
from array import array
from dataclasses import dataclass, field
from typing import Any, Protocol

from openai.types.responses import Response
from openai.types.responses.response_create_params import ResponseCreateParamsBase
from pydantic import BaseModel

from .backends.base import Delta, Finish, TextDelta, ToolCallDelta, Usage
from .event_frames import MessageFrames, event_tail, response_metadata

Event = dict[str, Any]
Sent = Event | bytes
"""An event as a dict, or already encoded (`event_frames`) for the WebSocket."""


ID_BYTES = 16
_ID_BATCH = 256
_random = bytearray(ID_BYTES * _ID_BATCH)
"""Random bytes for the next ids, read from `os.urandom` a batch at a time; `_unused[0]` of them not handed out yet.

Kept as bytes, not as ready-made id strings: strings made ahead would outlive the burst of turns that
made them, scattered over its memory (Python's allocator returns a 1 MiB arena only once nothing in it
is alive). The buffer and the count are made once, at import, and updated in place."""
_unused = array("l", [0])
_id_lock = threading.Lock()


def new_id(prefix: str) -> str:
    """`prefix_` and 128 random bits in hex, as unguessable as `uuid4` but without a syscall per id.

    The bits come from `os.urandom` read 256 ids at a time; a forked worker starts a batch of its own.
    Each bit is handed out once, even to servers running in several threads.
    """
    with _id_lock:
        end = _unused[0]
        if end < ID_BYTES:
            _random[:] = os.urandom(len(_random))
            end = len(_random)
        _unused[0] = end - ID_BYTES
        return f"{prefix}_{_random[end - ID_BYTES : end].hex()}"


def _after_fork() -> None:
    _unused[0] = 0


os.register_at_fork(after_in_child=_after_fork)


class EventSequence:
    """Numbers the events of one response and echoes its lane on each."""

    def __init__(self, stream_id: str | None = None) -> None:
        self.stream_id = stream_id
        self.next = 0
        self.tail = event_tail(stream_id)
        """How each of its events ends when encoded from a template (`event_frames`)."""

    def __call__(self, type_: str, **fields: Any) -> Event:
        event = {"type": type_, "sequence_number": self.next, **fields}
        if self.stream_id is not None:
            event["stream_id"] = self.stream_id
        self.next += 1
        return event


@dataclass(slots=True)
class _OpenItem:
    item: dict[str, Any]
    index: int
    text: list[str] = field(default_factory=list)
    logprobs: list[dict[str, Any]] = field(default_factory=list)
    frames: MessageFrames | None = None
    """Its events' templates, when they are sent encoded."""


class OutputAssembler:
    """Turns backend deltas into stream events and the final output items.

    Text opens a message item; each tool-call index opens a function_call item. An item is
    closed when another kind starts or the stream finishes. `encoded`: a message's events are
    encoded from templates (`event_frames`), for the WebSocket; tool calls' are dicts on every path.
    """

    def __init__(self, seq: EventSequence, *, encoded: bool = False) -> None:
        self.seq = seq
        self.encoded = encoded
        self.output: list[dict[str, Any]] = []
        self.output_json: list[bytes] = []
        """The output items' JSON, as their `output_item.done` events had it (encoded messages only)."""
        self.usage: Usage | None = None
        self.finish: str = "stop"
        self._message: _OpenItem | None = None
        self._calls: dict[int, _OpenItem] = {}

    @property
    def in_tool_call(self) -> bool:
        """Whether a tool call has begun: the response must then end with its calls, not be cut short."""
        return bool(self._calls)

    def feed(self, delta: Delta) -> list[Sent]:
        if isinstance(delta, TextDelta):
            return self._text(delta.text, delta.logprobs)
        if isinstance(delta, ToolCallDelta):
            return self._tool_call(delta)
        if isinstance(delta, Usage):
            self.usage = delta
        elif isinstance(delta, Finish):
            self.finish = delta.reason
        return []

    def close(self, status: str = "completed") -> list[Sent]:
        events = self._close_message(status)
        for open_call in self._calls.values():
            events.extend(self._close_call(open_call, status))
        self._calls.clear()
        return events

    def _text(self, text: str, logprobs: tuple[dict[str, Any], ...]) -> list[Sent]:
        message = self._message
        if message is not None:
            return self._delta(message, [], text, logprobs)
        events: list[Sent] = self.close() if self._calls else []
        item_id = new_id("msg")
        item = {"id": item_id, "type": "message", "status": "in_progress", "role": "assistant", "content": []}
        message = self._message = _OpenItem(item, len(self.output))
        self.output.append(item)
        if self.encoded:
            frames = message.frames = MessageFrames(item_id, message.index, self.seq.tail)
            opened = frames.opened(self.seq.next, text, logprobs)
            self.seq.next += len(opened)
            events += opened
            if len(opened) == 3:  # the text's delta among them: a 1-token reply's message opens in one call
                message.text.append(text)
                message.logprobs.extend(logprobs)
                return events
            return self._delta(message, events, text, logprobs)
        events.append(
            self.seq(
                "response.output_item.added",
                output_index=message.index,
                item=dict(item, content=[]),
            )
        )
        events.append(
            self.seq(
                "response.content_part.added",
                item_id=item_id,
                output_index=message.index,
                content_index=0,
                part={"type": "output_text", "text": "", "annotations": [], "logprobs": []},
            )
        )
        return self._delta(message, events, text, logprobs)

    def _delta(
        self, message: _OpenItem, events: list[Sent], text: str, logprobs: tuple[dict[str, Any], ...]
    ) -> list[Sent]:
        message.text.append(text)
        message.logprobs.extend(logprobs)
        frames = message.frames
        if frames is not None and (frame := frames.delta(self.seq.next, text, logprobs)) is not None:
            events.append(frame)
            self.seq.next += 1
            return events
        events.append(
            self.seq(
                "response.output_text.delta",
                item_id=message.item["id"],
                output_index=message.index,
                content_index=0,
                delta=text,
                logprobs=list(logprobs),
            )
        )
        return events

    def _tool_call(self, delta: ToolCallDelta) -> list[Sent]:
        events = self._close_message("completed")
        open_call = self._calls.get(delta.index)
        if open_call is None:
            open_call = self._calls[delta.index] = _OpenItem(_call_item(delta), len(self.output))
            self.output.append(open_call.item)
            events.append(
                self.seq("response.output_item.added", output_index=open_call.index, item=dict(open_call.item))
            )
        elif delta.name and not open_call.item["name"]:
            open_call.item["name"] = delta.name
        if delta.arguments:
            open_call.text.append(delta.arguments)
            custom = open_call.item["type"] == "custom_tool_call"
            events.append(
                self.seq(
                    "response.custom_tool_call_input.delta" if custom else "response.function_call_arguments.delta",
                    item_id=open_call.item["id"],
                    output_index=open_call.index,
                    delta=delta.arguments,
                )
            )
        return events

    def _close_message(self, status: str) -> list[Sent]:
        message, self._message = self._message, None
        if message is None:
            return []
        text = "".join(message.text)
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": message.logprobs}
        item = message.item
        item["status"], item["content"] = status, [part]  # keys already there: their order stays
        frames = message.frames
        closed = frames and frames.closed(self.seq.next, text, message.logprobs, status)
        if closed:
            self.seq.next += 3
            self.output_json.append(closed[1])
            return closed[0]
        where = {"item_id": message.item["id"], "output_index": message.index, "content_index": 0}
        return [
            self.seq("response.output_text.done", **where, text=text, logprobs=message.logprobs),
            self.seq("response.content_part.done", **where, part=part),
            self.seq("response.output_item.done", output_index=message.index, item=message.item),
        ]

    def _close_call(self, open_call: _OpenItem, status: str) -> list[Sent]:
        item = open_call.item
        if item["type"] == "custom_tool_call":
            item["input"] = "".join(open_call.text)
            return [
                self.seq(
                    "response.custom_tool_call_input.done",
                    item_id=item["id"],
                    output_index=open_call.index,
                    input=item["input"],
                ),
                self.seq("response.output_item.done", output_index=open_call.index, item=item),
            ]
        item.update(status=status, arguments="".join(open_call.text))
        return [
            self.seq(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=open_call.index,
                name=item["name"],
                arguments=item["arguments"],
            ),
            self.seq("response.output_item.done", output_index=open_call.index, item=item),
        ]


def _call_item(delta: ToolCallDelta) -> dict[str, Any]:
    """A new function or custom tool call item (a custom call has no status in the API)."""
    call_id = delta.call_id or new_id("call")
    if delta.custom:
        item = {
            "id": new_id("ctc"),
            "type": "custom_tool_call",
            "call_id": call_id,
            "name": delta.name or "",
            "input": "",
        }
    else:
        item = {
            "id": new_id("fc"),
            "type": "function_call",
            "status": "in_progress",
            "call_id": call_id,
            "name": delta.name or "",
            "arguments": "",
        }
    if delta.namespace:
        item["namespace"] = delta.namespace
    return item


class ResponseMemo(Protocol):
    """A derivation of the echo reused by a connection's turns (`turn_settings.Derived`): `echoed`, which every turn's
    echo repeats but for its own `previous_response_id`, and a place for a Response object made from it once."""

    echoed: dict[str, Any]
    response_template: dict[str, Any] | None


def response_object(
    response_id: str,
    request: Any,
    *,
    status: str,
    output: list[dict[str, Any]] | None = None,
    usage: Usage | None = None,
    error: dict[str, Any] | None = None,
    incomplete_reason: str | None = None,
    created_at: float | None = None,
    labels: dict[str, str] | None = None,
    echoed: dict[str, Any] | None = None,
    memo: ResponseMemo | None = None,
) -> dict[str, Any]:
    """The Response object as the API returns it: every request field it echoes, then the outcome.

    `echoed`: `echoed_fields(request)` when the caller has it already (a turn builds several). `memo`: the derivation
    it comes from (its echo but for `previous_response_id`): the object is then a copy of one made from the memo
    once, this response's own values written in. A dict literal merging ~25 echoed fields costs ~3 times as much:
    the dict grows, rehashing what it holds, as they go in; a copy is made at the size it ends at.
    """
    now = time.time()
    created = int(created_at or now)
    completed = int(now) if status in ("completed", "incomplete", "failed") else None
    incomplete = {"reason": incomplete_reason} if incomplete_reason else None
    metadata = response_metadata(request, labels)
    if memo is None or echoed is None or len(echoed) != len(memo.echoed):
        echo = echoed_fields(request) if echoed is None else echoed
        return _response(response_id, created, completed, status, echo, error, incomplete, metadata, output, usage)
    template = memo.response_template
    if template is None:
        template = memo.response_template = _response("", 0, None, "", memo.echoed, None, None, {}, None, None)
    response = template.copy()
    response["id"] = response_id
    response["created_at"] = created
    response["completed_at"] = completed
    response["status"] = status
    response["previous_response_id"] = echoed["previous_response_id"]
    response["error"] = error
    response["incomplete_details"] = incomplete
    response["metadata"] = metadata
    response["output"] = output or []
    response["usage"] = _usage(usage)
    return response


def _response(
    response_id: str,
    created_at: int,
    completed_at: int | None,
    status: str,
    echo: dict[str, Any],
    error: dict[str, Any] | None,
    incomplete: dict[str, str] | None,
    metadata: dict[str, str],
    output: list[dict[str, Any]] | None,
    usage: Usage | None,
) -> dict[str, Any]:
    """The Response object's keys in their order: its own, the echoed request fields, then the outcome (`metadata`
    keeps the echo's place when the request set it, as a dict keeps a key where it was first written)."""
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "completed_at": completed_at,
        "status": status,
        **echo,
        "error": error,
        "incomplete_details": incomplete,
        "metadata": metadata,
        "output": output or [],
        "usage": _usage(usage),
    }


ECHOED_FIELDS = frozenset(Response.model_fields) & frozenset(ResponseCreateParamsBase.__annotations__)
"""Request fields the API's Response object carries back: read from the SDK's own types."""

ECHO_DEFAULTS: dict[str, Any] = {
    "background": False,
    "instructions": None,
    "max_output_tokens": None,
    "max_tool_calls": None,
    "parallel_tool_calls": True,
    "previous_response_id": None,
    "prompt": None,
    "prompt_cache_key": None,
    "prompt_cache_retention": None,
    "reasoning": {"effort": None, "summary": None},
    "safety_identifier": None,
    "service_tier": "default",
    "temperature": 1.0,
    "text": {"format": {"type": "text"}, "verbosity": "medium"},
    "tool_choice": "auto",
    "tools": [],
    "top_logprobs": 0,
    "top_p": 1.0,
    "truncation": "disabled",
    "user": None,
}


@functools.cache
def _echoed_names(model: type[BaseModel]) -> tuple[str, ...]:
    """The echoed fields a request model declares, in its order (the order `model_dump` gives them)."""
    return tuple(name for name in model.model_fields if name in ECHOED_FIELDS)


def echoed_fields(request: Any) -> dict[str, Any]:
    """What the request set, over the API's defaults; `store` is the shim's own (it defaults to true)."""
    return echo_of(request)[0]


def echo_of(request: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """`echoed_fields(request)`, and what the request set of them itself (the echo's only values that are not
    `ECHO_DEFAULTS`' own objects, or the merged `text` and `reasoning`).

    Read from the request's fields, then its extra fields, as `model_dump(include=..., exclude_none=True)`
    lists them (at a fraction of its cost: no copy is made of what the Response object only echoes). The
    fields are read from the model's `__dict__`: each attribute read on a pydantic model goes through its
    `__getattr__` hook (~350 instructions more than a dict lookup).
    """
    values = request.__dict__
    given = {name: value for name in _echoed_names(request.__class__) if (value := values[name]) is not None}
    extra = request.__pydantic_extra__
    if extra:
        given.update((k, v) for k, v in extra.items() if k in ECHOED_FIELDS and v is not None)
    fields = {**ECHO_DEFAULTS, **given, "model": values["model"], "store": values["store"] is not False}
    for nested in ("reasoning", "text"):
        if nested in given:
            fields[nested] = {**ECHO_DEFAULTS[nested], **given[nested]}
    if fields["service_tier"] == "auto":
        fields["service_tier"] = "default"
    return fields, given


def _usage(usage: Usage | None) -> dict[str, Any] | None:
    if usage is None:
        return None
    return {
        "input_tokens": usage.input_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": usage.output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.input_tokens + usage.output_tokens,
    }


NOT_STORED_METADATA_KEY = "responses_ws.not_stored"


def not_stored(response: dict[str, Any], code: str) -> None:
    """Mark a response that asked to be stored but was not (the store did not answer in time): `store` false
    and the reason in its metadata, so the client knows it cannot retrieve it or continue it from another
    connection, worker or replica (its own WebSocket connection still can, from its cache)."""
    response["store"] = False
    response["metadata"] = {**(response.get("metadata") or {}), NOT_STORED_METADATA_KEY: code}
