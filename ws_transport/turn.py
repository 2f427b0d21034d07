"""One `response.create` as the session sends it: chained when it can be, in full when it must be.

Pure code: frames are built here and sent elsewhere. The chained frame carries only the new
items, so its cost does not grow with the history; the full form is built lazily, only for a
first turn, a resend or the HTTP fallback.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
import pydantic

from . import _sdk
from .chaining import Chain, Plan, dump_model
from .chat_replies import ChatReply
from .portal import never_ready

TICKET_HEADER = "x-ws-transport-turn"
"""Marks a request whose turn the wrapped `responses.create` already prepared (its body is empty)."""


def encode_json(value: Any) -> bytes:
    """Compact JSON of what is already JSON-ready (request fields, the server's output items)."""
    return orjson.dumps(value, default=_dump_model)


def encode_items(items: Any) -> bytes:
    """The input as the SDK would send it, at a fraction of the cost of the SDK's transform.

    Plain JSON (dicts with string keys, lists, tuples, strings, 64-bit integers, finite floats,
    booleans, None; TypedDicts are dicts) and the SDK's own models (dumped as the SDK dumps them)
    are encoded with `orjson`: the SDK's transform changes nothing in such input items, since they
    carry no renamed or reformatted fields. Anything else (datetimes, iterators, integer keys, NaN,
    UUIDs, big integers...) goes through the SDK's transform and its JSON encoder, so it reads as
    over HTTP or fails as it fails there. The check walks only the values it is given: the new
    items of a chained turn, never the history.
    """
    if is_plain(items):
        try:
            return orjson.dumps(items, default=_dump_model)
        except orjson.JSONEncodeError:  # nested deeper than orjson writes: the SDK's encoder decides, as over HTTP
            pass
    return _sdk.input_json(items)


PLAIN_LEAVES = (str, bool, type(None), pydantic.BaseModel)
INT64 = range(-(2**63), 2**64)


def is_plain(value: Any) -> bool:
    """Whether `orjson` writes `value` exactly as the SDK's transform and encoder would.

    Plain dicts and lists of strings (most input items) are walked in one loop, without a call per value."""
    kind = type(value)
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str or (type(item) is not str and not is_plain(item)):
                return False
        return True
    if kind is list:
        for item in value:  # noqa: SIM110 (a loop, not `all()` of a generator: no frame per item)
            if type(item) is not str and not is_plain(item):
                return False
        return True
    if isinstance(value, PLAIN_LEAVES):
        return True
    if isinstance(value, dict):
        return all(type(k) is str and is_plain(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return all(is_plain(v) for v in value)
    if isinstance(value, int):
        return value in INT64
    if isinstance(value, float):
        return math.isfinite(value)
    return False


def _dump_model(value: Any) -> Any:
    if isinstance(value, pydantic.BaseModel):
        return dump_model(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


@dataclass
class TurnRequest:
    """A request split into its fields and its input, with the chain it may continue.

    `fields` are the JSON-ready non-input fields; `http_body_bytes` is the full HTTP body when it
    is already known (the transport path), else it is built only if needed.
    """

    fields: dict[str, Any]
    plan: Plan
    raw_input: Any
    stream: bool
    http_body_bytes: bytes | None = None
    recorded: Chain | None = None
    counted: bool = False
    """Already in the session's turn count (a resend or an SDK retry is not a new turn)."""
    headers: list[tuple[str, str]] = field(default_factory=list)
    """The upgrade headers of the request that carried the turn: its credentials pick the socket."""
    credentials: tuple[list[tuple[str, str]], Any] | None = None
    """(headers, their credentials) worked out before, used while `headers` is that very list."""
    on_socket: bool = False
    """A frame of the turn went out on a socket (its upgrade headers were good for one)."""
    input_nbytes: int = field(default=0, init=False)
    chat: ChatReply | None = None
    """Set when the turn carries a `chat.completions.create` call: how its answer is shaped."""
    ready: Callable[[], bool] = never_ready
    """Whether the turn's events' next step would not wait (an event is there, or the turn is over): set while
    `Session.events` reads it, so a sync stream reads those in one portal call (`PortalStream`)."""

    @property
    def chain(self) -> Chain | None:
        return self.plan.chain

    def can_chain(self, generation: int) -> bool:
        chain = self.plan.chain
        return chain is not None and bool(self.plan.new_items) and chain.usable_on(generation)

    def frame(self, stream_id: str | None, *, chained: bool) -> tuple[bytes, int]:
        """The `response.create` frame and the size the same request would have over HTTP."""
        if not chained:
            body = self.responses_body()
            self.input_nbytes = max(0, len(body) - len(encode_json(self.fields)))
            return _splice(body, stream_id), len(body)
        chain = self.plan.chain
        assert chain is not None
        new_items = encode_items(self.plan.new_items)
        self.input_nbytes = chain.prefix_nbytes + len(new_items)
        frame = self._chained_head(chain, stream_id) + b',"input":' + new_items + b"}"
        return frame, len(frame) + chain.prefix_nbytes

    def _chained_head(self, chain: Chain, stream_id: str | None) -> bytes:
        """`{"type":"response.create", ...fields, "previous_response_id": ..., "stream_id": ...` (unclosed).

        The fields' part is encoded once per chain of turns sharing one fields dict (`Chain.head`)."""
        fields = self.fields
        if "previous_response_id" in fields or "stream_id" in fields:  # (as None): the merged dict puts it there
            event: dict[str, Any] = {"type": "response.create", **fields, "previous_response_id": chain.response_id}
            if stream_id is not None:
                event["stream_id"] = stream_id
            return encode_json(event)[:-1]
        head = chain.head if chain.fields is fields else None
        if head is None:
            head = encode_json({"type": "response.create", **fields})[:-1]
            if chain.fields is fields:
                chain.head = head
        head += b',"previous_response_id":' + orjson.dumps(chain.response_id)
        return head if stream_id is None else head + b',"stream_id":' + orjson.dumps(stream_id)

    def http_body(self) -> bytes:
        """The body plain HTTP would send: a chat call's own body, else every field and the whole input."""
        return self.chat.http_body if self.chat is not None else self.responses_body()

    def responses_body(self) -> bytes:
        """The whole request as a Responses body: every field and the whole input."""
        if self.http_body_bytes is None:
            fields = encode_json({**self.fields, "stream": self.stream})
            self.http_body_bytes = fields[:-1] + b',"input":' + encode_items(self.raw_input) + b"}"
        return self.http_body_bytes

    def record_nbytes(self, output: list[Any]) -> int:
        """What the items of the chain ending in `output` weigh as JSON: this input plus the output."""
        return self.input_nbytes + len(encode_json(output))


def _splice(body: bytes, stream_id: str | None) -> bytes:
    """Turn an HTTP body (a JSON object) into a frame without re-encoding it."""
    head = b'{"type":"response.create"'
    if stream_id is not None:
        head += b',"stream_id":' + orjson.dumps(stream_id)
    rest = body.strip()[1:].lstrip()
    return head + (rest if rest.startswith(b"}") else b"," + rest)
