"""One response on a WebSocket connection: the tenant's rate limit, steering, and the turn's frames sent as they come.

The connection (`ws.py`) reads frames and runs each lane's requests in order; this is what it does
for each `response.create` once its lane and an in-flight slot are its.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from starlette.websockets import WebSocketDisconnect

from .errors import APIError, internal_error, previous_response_in_progress
from .items import normalize_input
from .requests import CreateRequest
from .steer import Steer, steered_input
from .turn import Turn
from .ws_frames import with_lane

if TYPE_CHECKING:
    from .ws import ResponsesConnection

log = logging.getLogger("server_shim.ws")
"""The connection's logger: a turn that fails unexpectedly is logged where the connection's messages are."""


async def run_turn(
    conn: ResponsesConnection, request: CreateRequest, stream_id: str | None, successor_of: list[Steer] | None = None
) -> None:
    """Run one response: an explicit one (steering pending on its parent prepended) or a steered successor.

    One coroutine from the tenant's limit to the turn's end (a coroutine layer between costs ~1,000
    instructions a turn); what does not wait is in plain functions (`_turn`)."""
    parent = request.previous_response_id
    if parent is not None and parent in conn.steering.active and parent not in conn.cache:
        await conn.send(with_lane(previous_response_in_progress(parent).event(), stream_id))
        return
    limiter = conn.shim.limiter
    refusal = limiter.acquire(conn.tenant, conn.shim.clock())
    if refusal is not None:
        await conn.send(with_lane(refusal.api_error().event(), stream_id))
        return
    try:
        turn, steers = _turn(conn, request, stream_id, successor_of)
        try:
            await turn.run(conn.sent_at_once, conn.send_all, conn.steering.begin, encoded=True)
        except APIError as error:
            if not steers:
                await conn.send(with_lane(error.event(), stream_id))
            for steer in steers:  # the input could not be committed: returned, with why
                await conn.send(conn.steering.failed(steer, "successor_creation_failed", error.message, stream_id))
        except WebSocketDisconnect:
            raise
        except Exception:
            log.exception("turn failed unexpectedly")
            await conn.send(with_lane(internal_error().event(), stream_id))
        finally:
            conn.shim.record_turn(turn)
    finally:
        limiter.release(conn.tenant)
    slot = turn.steering
    if slot is not None:
        events, successor = conn.steering.end(slot, turn.result.response)
        if events or successor:  # most responses: nothing was steered, nothing to await
            await _after_steerable(conn, turn, events, successor, stream_id)


def _turn(
    conn: ResponsesConnection, request: CreateRequest, stream_id: str | None, successor_of: list[Steer] | None
) -> tuple[Turn, list[Steer]]:
    """The turn for `request`, with the steering it commits: the successor's, or what was pending on its parent
    (prepended to its input)."""
    steers = successor_of
    if steers is None:
        steers = conn.steering.take_pending(request.previous_response_id)
        if steers:
            request = request.model_copy(update={"input": steered_input(steers) + normalize_input(request.input)})
    turn = Turn(
        request,
        conn.shim.env,
        conn.cache,
        stream_id=stream_id,
        connection_id=conn.id,
        tenant=conn.tenant,
        memo=conn.memo,
    )
    turn.result.trace_carrier = conn.trace_carrier
    return turn, steers


async def _after_steerable(
    conn: ResponsesConnection, turn: Turn, events: list[dict[str, Any]], successor: list[Steer], stream_id: str | None
) -> None:
    """Steering queued while the response ran: pending events, or the automatic successor."""
    for event in events:
        await conn.send(event)
    if successor:
        update = {"input": steered_input(successor), "previous_response_id": turn.response_id, "generate": None}
        await run_turn(conn, turn.request.model_copy(update=update), stream_id, successor)
