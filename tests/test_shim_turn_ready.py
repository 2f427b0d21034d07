"""A reply ready at once (walked as a list) against the same reply streamed: the same events and the same state,
whether the turn is pulled (`Turn.events`, the HTTP paths) or pushes its batches (`Turn.run`, the WebSocket).

The unpaced simulator hands the router its whole reply (`ready`); the router hands it to the turn as a list,
which the turn walks without an async generator. A simulator that streams the same deltas through its own
`stream` (so `ready` says None) takes the streamed path: every conversation below must come out the same,
event by event (ids and times aside), in the cached state, and in the router's accounting.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncGenerator
from typing import Any

from support.wire import MODEL, user

from server_shim.backends import SimulatedBackend
from server_shim.backends.base import BackendRequest, Delta
from server_shim.config import RoutingConfig
from server_shim.health import Health
from server_shim.history import History
from server_shim.requests import CreateRequest
from server_shim.router import Deployment, Router
from server_shim.state import ConnectionCache, MemoryResponseStore
from server_shim.turn import Turn, TurnEnv


class Streamed(SimulatedBackend):
    """The simulator's deltas through a `stream` of its own: never ready at once."""

    async def stream(self, request: BackendRequest) -> AsyncGenerator[Delta, None]:
        async for delta in super().stream(request):
            yield delta


def routed(backend: SimulatedBackend) -> tuple[TurnEnv, Router]:
    routing = RoutingConfig()
    health = Health(routing.failure_threshold, routing.cooldown_s, routing.ewma_alpha)
    deployment = Deployment(name="sim", backend=backend, models={MODEL: MODEL}, health=health, tokens_per_minute=10**9)
    router = Router([deployment], routing)
    return TurnEnv(backend=router, store=MemoryResponseStore()), router


FUNCTION = {"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {}}}
NAMESPACED = {"type": "namespace", "name": "crm", "description": "CRM", "tools": [FUNCTION]}
SCHEMA = {
    "type": "json_schema",
    "name": "point",
    "schema": {"type": "object", "properties": {"x": {"type": "integer"}}},
}

CONVERSATION: list[dict[str, Any]] = [
    {"input": [user("hi")]},
    {"input": [user("again")], "max_output_tokens": 1},
    {"input": [user('call lookup {"q": 1}')], "tools": [FUNCTION]},
    {"input": [user("and now")], "tools": [FUNCTION], "tool_choice": "required"},
    {"input": [user('call crm__lookup {"q": 2}')], "tools": [NAMESPACED]},
    {"input": [user("a point")], "text": {"format": SCHEMA}},
    {"input": [user("stateless")], "store": False},
    {"input": [user("nothing generated")], "generate": False},
    {"input": [user("bounded")], "tools": [FUNCTION], "max_tool_calls": 1},
]
"""Plain text, cut at `max_output_tokens`, a call, a forced call, a namespaced call (restored: streamed on both
sides), structured output, not stored, no generation, and `max_tool_calls` (restored as well)."""


def _anonymous(events: list[Any], ids: dict[str, str]) -> str:
    """The events (or what a state holds) as JSON with each id named by when it was first seen, and the times left out."""
    text = json.dumps(events, sort_keys=True)
    text = re.sub(r'"(created_at|completed_at)": [0-9.]+', r'"\1": 0', text)
    return re.sub(r"\b([a-z]+)_[0-9a-f]{32}\b", lambda m: ids.setdefault(m.group(0), f"{m.group(1)}#{len(ids)}"), text)


async def _pushed(turn: Turn) -> list[dict[str, Any]]:
    """The turn driven as the WebSocket drives it (`Turn.run`, encoded): every other batch sent at once by
    `emit`, the others by `send`, awaited; each frame decoded back to its event."""
    sent: list[Any] = []

    def emit(batch: list[Any]) -> bool:
        if len(sent) % 2:
            return False
        sent.append(batch)
        return True

    async def send(batch: list[Any]) -> None:
        await asyncio.sleep(0)
        sent.append(batch)

    await turn.run(emit, send, encoded=True)
    return [json.loads(event) if isinstance(event, bytes) else event for batch in sent for event in batch]


async def _conversation(backend: SimulatedBackend, pushed: bool) -> tuple[list[str], list[str], dict[str, Any]]:
    env, router = routed(backend)
    cache = ConnectionCache(100, 10**9)
    previous: str | None = None
    ids: dict[str, str] = {}
    events, states = [], []
    for turn_request in CONVERSATION:
        turn = Turn(CreateRequest(model=MODEL, previous_response_id=previous, **turn_request), env, cache)
        frames = await _pushed(turn) if pushed else [event async for batch in turn.events() for event in batch]
        events.append(_anonymous(frames, ids))
        assert turn.result.response is not None
        previous = turn.result.response["id"]
        state = cache.get(previous)
        assert state is not None
        held = {"history": list(state.history.items), "output": state.output_items, "route": state.deployment}
        states.append(_anonymous([held, dict(state.carry)], ids))
    deployment = router.deployments["sim"]
    accounting = {
        "stats": list(router.stats.cells),
        "in_flight": deployment.in_flight,
        "tokens": deployment.tokens.total(router.clock()),
        "answered": deployment.health.answered,
    }
    return events, states, accounting


async def test_a_reply_ready_at_once_gives_the_events_and_state_the_same_reply_streamed_gives():
    """Ready at once or streamed, pulled (`events`, HTTP) or pushed (`run`, the WebSocket): all the same."""
    hi = BackendRequest(model=MODEL, history=History().extend([user("hi")]))
    assert SimulatedBackend(model=MODEL).ready(hi) is not None and Streamed(model=MODEL).ready(hi) is None
    runs = {
        (kind.__name__, pushed): await _conversation(kind(model=MODEL), pushed)
        for kind in (SimulatedBackend, Streamed)
        for pushed in (False, True)
    }
    events, states, accounting = runs["SimulatedBackend", False]
    for name, (other_events, other_states, other_accounting) in list(runs.items())[1:]:
        for n, (expected, got) in enumerate(zip(events, other_events, strict=True)):
            assert got == expected, f"{name}, turn {n}: {CONVERSATION[n]}"
        assert other_states == states, name
        assert other_accounting == accounting, name
    assert accounting["in_flight"] == 0 and accounting["tokens"] > 0
