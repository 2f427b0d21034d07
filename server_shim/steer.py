"""`response.steer`: user input queued onto a response while it runs, as the SDK's steer events define.

The decisions only (sans-I/O); `ws.py` sends the events and runs the turns. Per connection:
- A steer naming a response that is running on this connection is accepted at once
  (`response.steer.accepted`, whatever the lane is doing) and queued on that response.
- The running turn looks at its queue between deltas; at a safe output boundary (no tool call
  under way) it stops with `response.incomplete`, reason `steered`. A response that still ends
  normally without tool calls is followed by the successor all the same. The successor inherits
  the response's settings and continues from it (`previous_response_id`) with the queued input,
  on the same lane; its `response.created` is the commit point.
- A response that ends with client tool calls keeps the input queued: `response.steer.pending`
  (`waiting_for_required_input`, one stub per call) follows `response.completed`, and the next
  explicit `response.create` continuing that response gets the input prepended to its own.
- Everything else is `response.steer.failed` with the input returned: `invalid_input`,
  `response_not_found`, `response_already_completed`, `response_not_active`,
  `too_many_pending_steers`, `successor_creation_failed`, and the request limits' own codes
  (`too_many_input_items`, `invalid_value` for nesting...): steer input is held to the limits a
  `response.create`'s input is, since it becomes one. Input nested too deep is not returned
  (`input` is `""`): it could not be encoded.

Steer events are numbered by the connection's own counter: they belong to no response's stream.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from .errors import APIError
from .events import Event, new_id
from .items import Item, validate_items
from .limits import DEFAULT_LIMITS, RequestLimits, check_body

MAX_QUEUED = 16
"""Steers one response may hold; more are refused with `too_many_pending_steers`."""

_REMEMBERED = 256
"""How many ended responses a connection remembers, to tell 'already completed' from 'not found'."""

STEER_KEYS = frozenset({"type", "previous_response_id", "input"})
MESSAGE_KEYS = frozenset({"type", "role", "content", "id", "status"})
PART_TYPES = frozenset({"input_text", "input_image", "input_file"})


@dataclass(slots=True)
class Steer:
    id: str | None
    previous_response_id: str
    input: Any
    """As the client sent it, to return on failure."""
    items: list[Item] = field(default_factory=list)


@dataclass(slots=True)
class SteerSlot:
    """The steering queued on one running response; the turn reads `queued` between deltas."""

    response_id: str
    stream_id: str | None
    queued: list[Steer] = field(default_factory=list)


class Steering:
    """One connection's steering state."""

    def __init__(self, limits: RequestLimits = DEFAULT_LIMITS) -> None:
        self.limits = limits
        self.active: dict[str, SteerSlot] = {}
        self.pending: dict[str, list[Steer]] = {}
        self._ended: OrderedDict[str, str] = OrderedDict()
        self._sequence = 0

    def begin(self, response_id: str, stream_id: str | None) -> SteerSlot:
        slot = self.active[response_id] = SteerSlot(response_id, stream_id)
        return slot

    def submit(self, body: dict[str, Any]) -> Event:
        """Accept or refuse one `response.steer` frame; the event to send at once."""
        target = body.get("previous_response_id")
        steer = Steer(None, target if isinstance(target, str) else "", body.get("input"))
        try:  # the limits first: a refused input may be too deep to echo, or costly to validate
            check_body({"input": steer.input}, self.limits)
        except APIError as error:
            if error.code == "invalid_value":  # nested too deep: returning it could not be encoded
                steer.input = ""
                return self.failed(steer, error.code, error.message + " The input is not returned.")
            return self.failed(steer, error.code, error.message)
        problem = _invalid(body)
        if problem is not None:
            return self.failed(steer, "invalid_input", problem)
        steer.items = _items(body["input"])
        slot = self.active.get(steer.previous_response_id)
        if slot is None:
            ended = self._ended.get(steer.previous_response_id)
            if ended == "completed":
                return self.failed(steer, "response_already_completed", "The response completed; send a new request.")
            if ended is not None:
                return self.failed(steer, "response_not_active", f"The response is {ended} and takes no steering.")
            return self.failed(steer, "response_not_found", "No running response with this id on this connection.")
        if len(slot.queued) >= MAX_QUEUED:
            return self.failed(steer, "too_many_pending_steers", f"At most {MAX_QUEUED} steers may wait on a response.")
        queued = sum(len(s.items) for s in slot.queued) + len(steer.items)
        if queued > self.limits.max_input_items:  # together they are the successor's input
            message = (
                f"The steers queued on this response would hold {queued} items, the input of one request; at most "
                f"{self.limits.max_input_items} are allowed."
            )
            return self.failed(steer, "too_many_input_items", message)
        steer.id = new_id("steer")
        slot.queued.append(steer)
        return self._event(
            "response.steer.accepted",
            slot.stream_id,
            steer={"id": steer.id, "previous_response_id": steer.previous_response_id},
        )

    def end(self, slot: SteerSlot, response: dict[str, Any] | None) -> tuple[list[Event], list[Steer]]:
        """The response ended: events to send after its terminal event, and the steers for a successor now."""
        self.active.pop(slot.response_id, None)
        status = response["status"] if response is not None else "failed"
        self._remember(slot.response_id, status)
        steers, slot.queued = slot.queued, []
        if not steers:
            return [], []
        if status == "failed":
            message = "The response failed before the input was applied."
            return [self.failed(s, "response_not_active", message, slot.stream_id) for s in steers], []
        stubs = _required_input(response["output"] if response else [])
        if stubs:
            self.pending.setdefault(slot.response_id, []).extend(steers)
            events = [
                self._event(
                    "response.steer.pending",
                    slot.stream_id,
                    reason="waiting_for_required_input",
                    required_input=stubs,
                    steer={"id": s.id, "previous_response_id": s.previous_response_id},
                )
                for s in steers
            ]
            return events, []
        return [], steers

    def take_pending(self, response_id: str | None) -> list[Steer]:
        """Steers waiting for the explicit request that continues `response_id` (prepended to its input)."""
        return self.pending.pop(response_id, []) if response_id else []

    def failed(self, steer: Steer, code: str, message: str, stream_id: str | None = None) -> Event:
        returned: dict[str, Any] = {"input": steer.input, "previous_response_id": steer.previous_response_id}
        if steer.id is not None:
            returned["id"] = steer.id
        error = {"code": code, "message": message, "type": "invalid_request_error"}
        return self._event("response.steer.failed", stream_id, error=error, steer=returned)

    def _event(self, kind: str, stream_id: str | None, **fields: Any) -> Event:
        event: Event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        if stream_id is not None:
            event["stream_id"] = stream_id
        return event

    def _remember(self, response_id: str, status: str) -> None:
        self._ended[response_id] = status
        while len(self._ended) > _REMEMBERED:
            self._ended.popitem(last=False)


def steered_input(steers: list[Steer]) -> list[Item]:
    return [item for steer in steers for item in steer.items]


def _invalid(body: dict[str, Any]) -> str | None:
    """Why a steer frame is not valid, per the SDK's `ResponseSteerEvent` (None when it is)."""
    extra = set(body) - STEER_KEYS
    if extra:
        return f"A steer event takes only type, previous_response_id and input; got {sorted(extra)}."
    if not isinstance(body.get("previous_response_id"), str) or not body["previous_response_id"]:
        return "'previous_response_id' must name the response to steer."
    value = body.get("input")
    if isinstance(value, str):
        return None if value else "'input' must not be empty."
    if not isinstance(value, list) or not value:
        return "'input' must be a string or a non-empty array of user messages."
    for index, item in enumerate(value):
        if not isinstance(item, dict) or set(item) - MESSAGE_KEYS or item.get("type", "message") != "message":
            return f"'input[{index}]' must be a message: steering takes only user messages."
        if item.get("role") != "user":
            return f"'input[{index}].role' must be 'user'."
        content = item.get("content")
        if isinstance(content, str):
            continue
        if not isinstance(content, list) or not all(
            isinstance(p, dict) and p.get("type") in PART_TYPES for p in content
        ):
            return f"'input[{index}].content' must be a string or input_text, input_image and input_file parts."
    try:  # the checks a response.create's input gets, so nothing is accepted that its successor would refuse
        validate_items(_items(value))
    except APIError as error:
        return error.message
    return None


def _items(value: Any) -> list[Item]:
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    return [{"type": "message", "role": "user", "content": item["content"]} for item in value]


def _required_input(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    stubs: list[dict[str, Any]] = []
    for item in output:
        if item["type"] == "function_call":
            stubs.append({"type": "function_call_output", "call_id": item["call_id"], "name": item["name"]})
        elif item["type"] == "custom_tool_call":
            stubs.append({"type": "custom_tool_call_output", "call_id": item["call_id"]})
    return stubs
