"""One response on a WebSocket connection: the tenant's rate limit, steering, and the turn's frames sent as they come.

The connection (`ws.py`) reads frames and runs each lane's requests in order; this is what it does
for each `response.create` once its lane and an in-flight slot are its.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from starlette.websockets import WebSocketDisconnect

from .errors import APIError, internal_error, previous_response_in_progress
from .events import Sent
from .items import normalize_input
from .requests import CreateRequest
from .steer import Steer, SteerSlot, steered_input
from .turn import Turn
from .ws_frames import with_lane

if TYPE_CHECKING:
    from .ws import ResponsesConnection

log = logging.getLogger("server_shim.ws")
"""The connection's logger: a turn that fails unexpectedly is logged where the connection's messages are."""


async def run_turn(
    conn: ResponsesConnection, request: CreateRequest, stream_id: str | None, successor_of: list[Steer] | None = None
) -> None:
    """Run one response: an explicit one (steering pending on its parent prepended) or a steered successor."""
    parent = request.previous_response_id
    if parent is not None and parent in conn.steering.active and parent not in conn.cache:
        await conn.send(with_lane(previous_response_in_progress(parent).event(), stream_id))
        return
    refusal = conn.shim.limiter.acquire(conn.tenant, conn.shim.clock())
    if refusal is not None:
        await conn.send(with_lane(refusal.api_error().event(), stream_id))
        return
    try:
        turn, slot = await _stream_turn(conn, request, stream_id, successor_of)
    finally:
        conn.shim.limiter.release(conn.tenant)
    if slot is not None:
        events, successor = conn.steering.end(slot, turn.result.response)
        if events or successor:  # most responses: nothing was steered, nothing to await
            await _after_steerable(conn, turn, events, successor, stream_id)


async def _stream_turn(
    conn: ResponsesConnection, request: CreateRequest, stream_id: str | None, successor_of: list[Steer] | None
) -> tuple[Turn, SteerSlot | None]:
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

    def started(response_id: str) -> None:
        turn.steering = conn.steering.begin(response_id, stream_id)

    async def send(batch: list[Sent]) -> None:
        for event in batch:
            await conn.send(event)

    try:
        await turn.run(conn.sent_at_once, send, started, encoded=True)
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
    return turn, turn.steering


async def _after_steerable(
    conn: ResponsesConnection, turn: Turn, events: list[dict[str, Any]], successor: list[Steer], stream_id: str | None
) -> None:
    """Steering queued while the response ran: pending events, or the automatic successor."""
    for event in events:
        await conn.send(event)
    if successor:
        update = {"input": steered_input(successor), "previous_response_id": turn.response_id, "generate": None}
        await run_turn(conn, turn.request.model_copy(update=update), stream_id, successor)
