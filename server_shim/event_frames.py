"""A turn's hot events encoded from templates: what the WebSocket sends, without an event dict or an encoding each.

A 1-token turn sends 9 events; built as dicts and encoded one by one, they cost about as much as the
rest of the turn's output side together, though most of their bytes are the same every turn (the
event's keys, the message item's constant fields) or every event of the turn (the Response object's
echoed request fields, the item id and position). Here the constant JSON is written once per process
(the templates below), what is constant for the turn is encoded once per turn, and only the changing
values (sequence numbers, text, status) are encoded and spliced in with one bytes `%` each.

Every template writes exactly what `orjson.dumps` of the event dict (`events.py`) writes, key for key
(tests/test_shim_event_frames.py compares the two for generated responses). Paths that read events as
dicts (HTTP, chat) still get dicts; tool calls and failures are encoded as dicts on every path.
"""

from __future__ import annotations

import secrets
from typing import Any, Literal, Protocol

import orjson


class Numbering(Protocol):
    """The turn's event numbering (`events.EventSequence`): the next number, and how each event ends."""

    next: int
    tail: bytes


_RESPONSE_EVENT = b'{"type":"%b","sequence_number":%d,"response":%b%b'
_RESPONSE_HEAD = b'{"id":%b,"object":"response","created_at":%d,"completed_at":%b,"status":%b,%b'
_RESPONSE = _RESPONSE_HEAD + b'"error":%b,"incomplete_details":%b,"metadata":%b,"output":[%b],"usage":%b}'
_RESPONSE_ECHOING_METADATA = (
    _RESPONSE_HEAD + b'"metadata":%b%b,"error":%b,"incomplete_details":%b,"output":[%b],"usage":%b}'
)
_STATUSES = {status: orjson.dumps(status) for status in ("completed", "incomplete", "failed", "cancelled")}
"""The terminal statuses' JSON (any other is encoded)."""
_MESSAGE_ADDED = (
    b'{"type":"response.output_item.added","sequence_number":%d,"output_index":%d,'
    b'"item":{"id":%b,"type":"message","status":"in_progress","role":"assistant","content":[]}%b'
)
_PART_ADDED = (
    b'{"type":"response.content_part.added","sequence_number":%d%b,'
    b'"part":{"type":"output_text","text":"","annotations":[],"logprobs":[]}%b'
)
_TEXT_DELTA = b'{"type":"response.output_text.delta","sequence_number":%d%b,"delta":%b,"logprobs":%b%b'
_TEXT_DONE = b'{"type":"response.output_text.done","sequence_number":%d%b,"text":%b,"logprobs":%b%b'
_PART_DONE = (
    b'{"type":"response.content_part.done","sequence_number":%d%b,'
    b'"part":{"type":"output_text","text":%b,"annotations":[],"logprobs":%b}%b'
)
_ITEM_DONE = b'{"type":"response.output_item.done","sequence_number":%d,"output_index":%d,"item":%b%b'
_MESSAGE = (
    b'{"id":%b,"type":"message","status":%b,"role":"assistant",'
    b'"content":[{"type":"output_text","text":%b,"annotations":[],"logprobs":%b}]}'
)
_NO_LOGPROBS = b"[]"


class EchoMemo(Protocol):
    """A derivation of the echo reused by a connection's turns (`turn_settings.Derived`): `echoed`, which every
    turn's echo repeats but for its own `previous_response_id`, and a place for its encoding (`echo_json`)."""

    echoed: dict[str, Any]
    echo_json: EchoJson | Literal[False] | None


_MARK = "\x00" + secrets.token_hex(16)
"""Stands for `previous_response_id` while a memo's echo is encoded; never a response id (those are ASCII)."""
_MARK_JSON = orjson.dumps(_MARK)


class EchoJson:
    """A memo's echo encoded once, `previous_response_id` left out: each turn writes its own in between."""

    __slots__ = ("after", "head", "tail")

    def __init__(self, head: bytes, tail: bytes, after: bytes) -> None:
        self.head, self.tail, self.after = head, tail, after

    @classmethod
    def of(cls, echoed: dict[str, Any]) -> EchoJson | None:
        """None when the echo cannot be encoded, or has no `previous_response_id`."""
        if "previous_response_id" not in echoed:
            return None
        encoded = _encode_echo({**echoed, "previous_response_id": _MARK})  # the key keeps its place
        if encoded is None:
            return None
        head, mark, tail = encoded[0].partition(_MARK_JSON)
        return cls(head, tail, encoded[1]) if mark else None

    def echo(self, previous_response_id: str | None) -> tuple[bytes, bytes]:
        """What `_encode_echo` gives for the memo's echo with this `previous_response_id` (TypeError: it cannot
        be encoded)."""
        return self.head + orjson.dumps(previous_response_id) + self.tail, self.after


def _encode_echo(echoed: dict[str, Any]) -> tuple[bytes, bytes] | None:
    """The echoed fields as the Response object writes them (see `ResponseFrames`): those before `metadata` (all
    when it has none), each followed by a comma, and those after it, each preceded by one. None when they cannot be
    encoded."""
    try:
        if "metadata" not in echoed:
            return orjson.dumps(echoed)[1:-1] + b",", b""
        keys = list(echoed)
        at = keys.index("metadata")
        echo = b"".join(b"%b:%b," % (orjson.dumps(k), orjson.dumps(echoed[k])) for k in keys[:at])
        return echo, b"".join(b",%b:%b" % (orjson.dumps(k), orjson.dumps(echoed[k])) for k in keys[at + 1 :])
    except TypeError:  # orjson.JSONEncodeError: a lone surrogate, say
        return None


def _echo_json(echoed: dict[str, Any], memo: EchoMemo | None) -> tuple[bytes, bytes] | None:
    """`_encode_echo(echoed)`, from the memo's encoding when `echoed` is its echo but for `previous_response_id`."""
    if memo is not None and len(echoed) == len(memo.echoed):
        template = memo.echo_json
        if template is None:
            template = memo.echo_json = EchoJson.of(memo.echoed) or False
        if template:
            try:
                return template.echo(echoed["previous_response_id"])
            except TypeError:
                return None
    return _encode_echo(echoed)


def response_metadata(request: Any, labels: dict[str, str] | None) -> dict[str, str]:
    """The Response object's `metadata`: the request's, with the classifiers' labels over it."""
    return {**(request.metadata or {}), **labels} if labels else (request.metadata or {})


def event_tail(stream_id: str | None) -> bytes:
    """What ends each event of a lane: its `stream_id` (the last key, as `EventSequence` adds it) and the brace."""
    return b"}" if stream_id is None else b',"stream_id":' + orjson.dumps(stream_id) + b"}"


class MessageFrames:
    """The events of one output message: its id and position encoded once, each text spliced into them."""

    __slots__ = ("_id", "_index", "_tail", "_where")

    def __init__(self, item_id: str, output_index: int, tail: bytes) -> None:
        self._id = orjson.dumps(item_id)
        self._index = output_index
        self._where = b',"item_id":%b,"output_index":%d,"content_index":0' % (self._id, output_index)
        self._tail = tail

    def opened(self, first: int, text: str, logprobs: Any) -> list[Any]:
        """`response.output_item.added` and `response.content_part.added`, numbered from `first`, then the first
        text's `response.output_text.delta` when it can be encoded (else the dict's encoding answers for it)."""
        opened = [
            _MESSAGE_ADDED % (first, self._index, self._id, self._tail),
            _PART_ADDED % (first + 1, self._where, self._tail),
        ]
        delta = self.delta(first + 2, text, logprobs)
        if delta is not None:
            opened.append(delta)
        return opened

    def delta(self, number: int, text: str, logprobs: Any) -> bytes | None:
        """`response.output_text.delta`; None when the text cannot be encoded (the dict's encoding answers that)."""
        try:
            logprobs_json = orjson.dumps(logprobs) if logprobs else _NO_LOGPROBS
            return _TEXT_DELTA % (number, self._where, orjson.dumps(text), logprobs_json, self._tail)
        except TypeError:  # orjson.JSONEncodeError: a lone surrogate, say
            return None

    def closed(self, first: int, text: str, logprobs: Any, status: str) -> tuple[list[Any], bytes] | None:
        """`output_text.done`, `content_part.done`, `output_item.done` from `first`; and the item's own JSON,
        which the Response object's `output` repeats. None when the text cannot be encoded."""
        try:
            text_json = orjson.dumps(text)
            logprobs_json = orjson.dumps(logprobs) if logprobs else _NO_LOGPROBS
        except TypeError:
            return None
        item = _MESSAGE % (self._id, _STATUSES.get(status) or orjson.dumps(status), text_json, logprobs_json)
        return [
            _TEXT_DONE % (first, self._where, text_json, logprobs_json, self._tail),
            _PART_DONE % (first + 1, self._where, text_json, logprobs_json, self._tail),
            _ITEM_DONE % (first + 2, self._index, item, self._tail),
        ], item


class ResponseFrames:
    """A turn's Response object in its events: the request fields it echoes encoded once for all of them.

    `events.response_object` writes the echoed fields between `status` and `error`, except `metadata`: it is
    written after `incomplete_details`, or in the echo's place when the request set it (a dict keeps a key
    where it was first written). `_echo` is the echo before that place, `_after` what follows it.
    """

    __slots__ = ("_after", "_created_at", "_echo", "_echoed", "_id", "_seq", "_tail")

    def __init__(
        self, response_id: str, created_at: int, echoed: dict[str, Any], seq: Numbering, memo: EchoMemo | None = None
    ) -> None:
        """`memo`: the derivation `echoed` comes from (its echo but for `previous_response_id`), whose encoding is
        then made once for all its turns rather than once per turn (~8,000 instructions for a request's defaults)."""
        self._id = orjson.dumps(response_id)
        self._created_at = created_at
        self._echoed = echoed
        self._seq = seq
        self._tail = seq.tail
        encoded = _echo_json(echoed, memo)
        self._echo: bytes | None = None if encoded is None else encoded[0]
        self._after = b"" if encoded is None else encoded[1]

    def started(self, request: Any, labels: dict[str, str]) -> list[Any] | None:
        """`response.created` and `response.in_progress`: one Response object, encoded once. None when the
        request's fields cannot be encoded (the dicts' encoding answers that)."""
        if self._echo is None:
            return None
        response = self._body(b"null", b'"in_progress"', b"null", b"null", response_metadata(request, labels), b"")
        first = self._seq.next
        self._seq.next += 2
        return [
            _RESPONSE_EVENT % (b"response.created", first, response, self._tail),
            _RESPONSE_EVENT % (b"response.in_progress", first + 1, response, self._tail),
        ]

    def ended(self, kind: str, response: dict[str, Any], items: list[bytes]) -> bytes | None:
        """The terminal event of `response` (built by `events.response_object` with this turn's echoed fields);
        `items`: the output items' JSON as their events had it, when they all had one. None when the object
        no longer echoes what it was built with (`not_stored` changed `store`), or cannot be encoded: the caller
        encodes it whole."""
        if self._echo is None or response["store"] is not self._echoed["store"]:
            return None
        output = response["output"]
        completed_at, status = response["completed_at"], response["status"]
        error, incomplete = response["error"], response["incomplete_details"]
        try:
            body = self._body(
                b"null" if completed_at is None else b"%d" % completed_at,
                _STATUSES.get(status) or orjson.dumps(status),
                b"null" if error is None else orjson.dumps(error),
                b"null" if incomplete is None else orjson.dumps(incomplete),
                response["metadata"],
                b",".join(items) if len(items) == len(output) else orjson.dumps(output)[1:-1],
                orjson.dumps(response["usage"]),
            )
        except TypeError:
            return None
        self._seq.next += 1
        return _RESPONSE_EVENT % (kind.encode(), self._seq.next - 1, body, self._tail)

    def _body(
        self,
        completed_at: bytes,
        status: bytes,
        error: bytes,
        incomplete: bytes,
        metadata: dict[str, str],
        output: bytes,
        usage: bytes = b"null",
    ) -> bytes:
        """The Response object's JSON, in one `%` (its head and rest in one template); `output`: its items' JSON,
        comma-separated (the brackets are the template's)."""
        echo = self._echo
        assert echo is not None
        metadata_json = orjson.dumps(metadata) if metadata else b"{}"
        if "metadata" not in self._echoed:
            return _RESPONSE % (
                self._id,
                self._created_at,
                completed_at,
                status,
                echo,
                error,
                incomplete,
                metadata_json,
                output,
                usage,
            )
        return _RESPONSE_ECHOING_METADATA % (
            self._id,
            self._created_at,
            completed_at,
            status,
            echo,
            metadata_json,
            self._after,
            error,
            incomplete,
            output,
            usage,
        )
