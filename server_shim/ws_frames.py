"""A WebSocket frame's first reading (size, JSON, type, lane), the errors a connection sends itself, its close codes and states.

Plain functions, apart from the connection loop in `ws.py` that uses them.
"""

from __future__ import annotations

import enum
import logging
from json import JSONDecodeError
from typing import Any

import orjson

from . import json_slices, metrics
from .errors import APIError, invalid
from .json_shape import Shape, TooManyValues
from .limits import DEFAULT_LIMITS, RequestLimits, too_many_values
from .requests import check_stream_id

log = logging.getLogger(__name__)
_unencodable_logged = False

CLOSE_GOING_AWAY = 1001
CLOSE_POLICY_VIOLATION = 1008
CLOSE_MESSAGE_TOO_BIG = 1009
FORCE_CLOSE_EXTENSION = "responses_ws.force_close"
"""ASGI scope extension our uvicorn protocol adds: `close` a socket whose peer does not read,
`writable()`, true while a send will not wait for the peer (so it needs no timeout), and
`send_texts(frames)`, which queues a text frame for each of a list of UTF-8 byte strings at once (only
while writable; None where a middleware wraps `send`, see `app.ShimApp`), `steps(coro)`, a coroutine to run as a task
whose frames are written as each of its steps ends (`ws_protocol.FlushedSteps`: the lanes run so), and `asgi_send`, the
protocol's own ASGI `send`.
The app may add `on_text(text) -> bool`: a whole text frame offered as it is read, before the ASGI queue (True: taken)."""


class ConnectionState(enum.Enum):
    OPEN = "open"
    DRAINING = "draining"
    CLOSED = "closed"


def frame_nbytes(data: str | bytes) -> int:
    """The frame's size on the wire (UTF-8 for text frames), for the size limit and the byte counter."""
    return len(data) if isinstance(data, bytes) or data.isascii() else len(data.encode())


def decode_frame(data: str | bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise _not_json(exc) from None
    return _event(body)


async def read_frame(
    data: str | bytes, nbytes: int, slice_from: int, limits: RequestLimits = DEFAULT_LIMITS
) -> tuple[dict[str, Any], Shape]:
    """`decode_frame` and the frame's shape: its values counted first (more than `max_json_values`:
    refused unparsed), parsed in slices that let other connections run when the frame is large."""
    try:
        body, shape = await json_slices.load_measured(
            data, nbytes, slice_from, limits.max_json_values, limits.max_json_depth
        )
    except TooManyValues:
        raise too_many_values(limits.max_json_values) from None
    except JSONDecodeError as exc:
        raise _not_json(exc) from None
    return _event(body), shape


def read_frame_now(
    data: str | bytes, nbytes: int, slice_from: int, limits: RequestLimits = DEFAULT_LIMITS
) -> tuple[dict[str, Any], Shape] | None:
    """`read_frame` with nothing to await (`json_slices.load_settled`: the usual frame); None: `read_frame` it."""
    try:
        settled = json_slices.load_settled(data, nbytes, slice_from, limits.max_json_values, limits.max_json_depth)
    except JSONDecodeError as exc:
        raise _not_json(exc) from None
    return None if settled is None else (_event(settled[0]), settled[1])


def _not_json(exc: JSONDecodeError) -> APIError:
    return invalid("invalid_json", f"The frame is not valid JSON: {exc}.")


def _event(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise invalid("invalid_type", "Each frame must be a JSON object with a 'type'.")
    kind = body.get("type")
    if kind is None:
        raise invalid("missing_required_parameter", "Missing required parameter: 'type'.", "type")
    if kind not in ("response.create", "response.steer"):
        raise invalid(
            "unknown_event_type",
            f"Unsupported event type {kind!r}: this server accepts 'response.create' and 'response.steer'.",
            "type",
        )
    return body


def lane_of(data: str | bytes) -> str | None:
    """The frame's lane when it names a valid one, so a refusal reaches the right request."""
    try:
        return check_stream_id(decode_frame(data).get("stream_id"))
    except APIError:
        return None


def with_lane(event: dict[str, Any], stream_id: str | None) -> dict[str, Any]:
    if stream_id is not None:
        event["stream_id"] = stream_id
    return event


def age_limit_error() -> APIError:
    return APIError(
        400,
        "websocket_connection_limit_reached",
        "This connection reached its age limit; open a new connection to continue.",
    )


def idle_error(idle_s: float) -> APIError:
    return APIError(
        400,
        "websocket_connection_idle",
        f"No request for {idle_s:.0f} s and none in flight; open a new connection to continue.",
    )


def too_large_error(limit: int) -> APIError:
    return APIError(
        400,
        "message_too_large",
        f"The frame exceeds the {limit}-byte limit; this connection will close with code 1009.",
    )


def encode_event(event: dict[str, Any] | bytes) -> bytes:
    """The event as JSON (as it is when a turn encoded it already: `event_frames`), counted in the error metric
    when it is an error.

    The last line of defence: the request limits keep client values encodable (nesting well under
    the ~254 levels orjson writes), but an event that still cannot be encoded becomes an
    `event_encoding_failed` error event on its lane, logged once per process, and the connection
    carries on (an exception here used to drop the socket and every other lane with it).
    """
    if isinstance(event, bytes):
        return event
    try:
        data = orjson.dumps(event)
    except TypeError as exc:  # orjson.JSONEncodeError: too deep, an unencodable value
        event = with_lane(unencodable_error(event, exc).event(), event.get("stream_id"))
        data = orjson.dumps(event)
    if event["type"] == "error":
        metrics.ERRORS.labels(event["error"]["code"]).inc()
    return data


def unencodable_error(event: dict[str, Any], exc: TypeError) -> APIError:
    global _unencodable_logged
    if not _unencodable_logged:
        _unencodable_logged = True
        log.error("a %r event could not be encoded (%s); sent an error event instead (logged once)", event["type"], exc)
    return APIError(
        500,
        "event_encoding_failed",
        f"The server could not encode a {event['type']!r} event ({exc}); it was not sent.",
        type="server_error",
    )
