"""Admission: connection cap, drain, per-tenant limits, slow and idle clients, backpressure.

The decisions are tested as plain state machines with a number for a clock; the probes run a
real server on loopback, each bounded in time.
"""

from __future__ import annotations

import asyncio
import json
import time
import weakref
from collections import deque
from typing import Any

import httpx2
import pytest
import websockets
from hypothesis import given
from hypothesis import strategies as st
from support.wire import API_KEY, MODEL, only_connection, ws_url
from websockets.asyncio.client import connect as ws_connect

from server_shim.admission import ConnectionGate, TenantLimiter
from server_shim.ws import ConnectionState
from server_shim.ws_protocol import FORCE_CLOSE_GRACE_S, ShimWebSocketProtocol

HEADERS = {"Authorization": f"Bearer {API_KEY}"}


def create(**fields: Any) -> str:
    return json.dumps({"type": "response.create", "model": MODEL, "input": "hi", "store": False, **fields})


async def until_terminal(ws: Any, timeout: float = 10) -> list[dict[str, Any]]:
    events = []
    while True:
        event = json.loads(await asyncio.wait_for(ws.recv(), timeout))
        events.append(event)
        if event["type"] in ("response.completed", "response.incomplete", "error"):
            return events


# --- decisions, without sockets or sleeps --------------------------------------------------------


def test_the_connection_cap_refuses_with_503_until_one_closes():
    gate = ConnectionGate(max_connections=2)
    assert gate.admit_connection() is None and gate.admit_connection() is None
    refusal = gate.admit_connection()
    assert refusal is not None and (refusal.status, refusal.code) == (503, "server_overloaded")
    assert refusal.retry_after_header == "1"
    gate.connection_closed()
    assert gate.admit_connection() is None


def test_draining_refuses_connections_and_requests():
    gate = ConnectionGate(max_connections=10, draining=True)
    assert gate.admit_connection().code == "server_shutting_down"
    assert gate.admit_request().code == "server_shutting_down"


def test_concurrent_responses_per_tenant_are_bounded_and_freed_on_release():
    limiter = TenantLimiter(max_concurrent=2)
    assert limiter.acquire("a", 0.0) is None and limiter.acquire("a", 0.0) is None
    refusal = limiter.acquire("a", 0.0)
    assert refusal is not None and (refusal.status, refusal.code) == (429, "rate_limit_exceeded")
    assert limiter.acquire("b", 0.0) is None, "another tenant is not affected"
    limiter.release("a")
    assert limiter.acquire("a", 0.0) is None


def test_turns_per_minute_slide_and_say_when_to_retry():
    limiter = TenantLimiter(turns_per_minute=3)
    for now in (0.0, 10.0, 20.0):
        assert limiter.acquire("a", now) is None
        limiter.release("a")
    refusal = limiter.acquire("a", 30.0)
    assert refusal is not None and refusal.retry_after_s == pytest.approx(30.0)
    assert "retry in 30.0 s" in refusal.message
    assert limiter.acquire("a", 60.5) is None, "the first start left the window"


def test_a_tenant_with_nothing_in_flight_and_no_window_is_forgotten():
    limiter = TenantLimiter(max_concurrent=5)
    limiter.acquire("a", 0.0)
    limiter.release("a")
    assert limiter._in_flight == {} and limiter._starts == {}


class _RecordLimiter:
    """`TenantLimiter` as it was before its counts became plain ints: a record per tenant, its window always kept."""

    def __init__(self, max_concurrent: int, turns_per_minute: int) -> None:
        self.max_concurrent, self.turns_per_minute, self.window_s = max_concurrent, turns_per_minute, 60.0
        self.usage: dict[str | None, list[Any]] = {}  # [in flight, deque of starts]

    def acquire(self, tenant: str | None, now: float, count: int) -> tuple[Any, ...] | None:
        usage = self.usage.setdefault(tenant, [0, deque()])
        starts = usage[1]
        while starts and starts[0] <= now - self.window_s:
            starts.popleft()
        if self.max_concurrent and usage[0] + count > self.max_concurrent:
            return ("concurrent", 1.0)
        if self.turns_per_minute and len(starts) + count > self.turns_per_minute:
            expiring = min(len(starts) + count - self.turns_per_minute, len(starts)) - 1
            return ("rate", (starts[expiring] + self.window_s - now) if expiring >= 0 else self.window_s)
        usage[0] += count
        if self.turns_per_minute:
            starts.extend([now] * count)
        return None

    def release(self, tenant: str | None, count: int) -> None:
        usage = self.usage.get(tenant)
        if usage is not None:
            usage[0] -= count
            if usage[0] <= 0 and not usage[1]:
                del self.usage[tenant]


@given(
    limits=st.tuples(st.integers(0, 4), st.integers(0, 4)),
    steps=st.lists(
        st.tuples(st.booleans(), st.sampled_from([None, "a", "b"]), st.integers(1, 3), st.floats(0, 40)), max_size=40
    ),
)
def test_the_limiter_decides_as_a_record_per_tenant_did(limits: tuple[int, int], steps: list[Any]) -> None:
    """Any run of acquires and releases (each release one an acquire admitted): the same refusals, with the same
    waits, and the same counts in flight."""
    limiter, record = TenantLimiter(*limits), _RecordLimiter(*limits)
    admitted: list[tuple[str | None, int]] = []
    now = 0.0
    for acquires, tenant, count, later in steps:
        now += later
        if acquires or not admitted:
            refusal = limiter.acquire(tenant, now, count)
            expected = record.acquire(tenant, now, count)
            assert (refusal is None) == (expected is None)
            if refusal is None:
                admitted.append((tenant, count))
            else:
                assert refusal.retry_after_s == expected[1]
                assert ("in flight" in refusal.message) == (expected[0] == "concurrent")
        else:
            tenant, count = admitted.pop(0)
            limiter.release(tenant, count)
            record.release(tenant, count)
        for name in (None, "a", "b"):
            expected_in_flight = record.usage[name][0] if name in record.usage else 0
            assert limiter.in_flight(name) == expected_in_flight


# --- probes over a real server -------------------------------------------------------------------


async def test_past_the_connection_cap_the_upgrade_gets_503_with_retry_after(make_server):
    server = make_server(max_connections=2)
    async with ws_connect(ws_url(server)), ws_connect(ws_url(server)) as second:
        with pytest.raises(websockets.InvalidStatus) as refused:
            async with ws_connect(ws_url(server)):
                pass
        assert refused.value.response.status_code == 503
        assert refused.value.response.headers["Retry-After"] == "1"
        assert json.loads(refused.value.response.body)["error"]["code"] == "server_overloaded"
        await second.send(create())
        assert (await until_terminal(second))[-1]["type"] == "response.completed"
    async with ws_connect(ws_url(server)) as again:  # the slots are free once those closed
        await again.send(create())
        assert (await until_terminal(again))[-1]["type"] == "response.completed"


async def test_drain_finishes_the_response_in_flight_refuses_late_comers_then_closes_1001(make_server):
    server = make_server(simulated_ttft_s=0.8, drain_timeout_s=10)
    async with ws_connect(ws_url(server)) as ws, httpx2.AsyncClient(base_url=server.base_url) as http:
        await ws.send(create())
        assert json.loads(await ws.recv())["type"] == "response.created"
        server.server.should_exit = True  # SIGTERM's effect: uvicorn starts its shutdown
        deadline = time.monotonic() + 5
        while (await http.get("/../readyz")).status_code != 503:
            assert time.monotonic() < deadline, "/readyz never said not ready"
            await asyncio.sleep(0.02)
        late = await http.post("/responses", json={"model": MODEL, "input": "late"}, headers=HEADERS)
        assert late.status_code == 503 and late.json()["error"]["code"] == "server_shutting_down"
        assert "Retry-After" in late.headers
        with pytest.raises(websockets.InvalidStatus) as refused:
            async with ws_connect(ws_url(server)):
                pass
        assert refused.value.response.status_code == 503
        events = await until_terminal(ws)
        assert events[-1]["type"] == "response.completed", "the accepted response was not cut"
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), 10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001


async def test_turns_per_minute_per_tenant_get_rate_limit_exceeded_over_both_transports(make_server):
    server = make_server(api_keys=["key-a", "key-b"], tenant_turns_per_minute=2)
    a = {"Authorization": "Bearer key-a"}
    async with ws_connect(ws_url(server), additional_headers=a) as ws:
        for _ in range(2):
            await ws.send(create())
            assert (await until_terminal(ws))[-1]["type"] == "response.completed"
        await ws.send(create())
        error = (await until_terminal(ws))[-1]
        assert error["type"] == "error" and error["status"] == 429
        assert error["error"]["code"] == "rate_limit_exceeded" and "retry in" in error["error"]["message"]
    async with httpx2.AsyncClient(base_url=server.base_url) as http:
        refused = await http.post("/responses", json={"model": MODEL, "input": "x"}, headers=a)
        other = await http.post(
            "/responses", json={"model": MODEL, "input": "x"}, headers={"Authorization": "Bearer key-b"}
        )
    assert refused.status_code == 429 and int(refused.headers["Retry-After"]) >= 1
    assert other.status_code == 200, "another tenant is not limited"


async def _stop_reading(server: Any, ws: Any) -> weakref.ref:
    """Fill four lanes with long answers on a client that does not read; return once the server has given
    up on it (its send timed out: it queued the 1008 close and will abort the socket after the grace period)."""
    (protocol,) = [c for c in server.server.server_state.connections if isinstance(c, ShimWebSocketProtocol)]
    connection = only_connection(server)
    for lane in range(4):
        await ws.send(create(stream_id=f"l{lane}", max_output_tokens=32_768))
    deadline = time.monotonic() + 15
    while connection.state is not ConnectionState.CLOSED:
        assert time.monotonic() < deadline, "the non-reading client was never let go"
        await asyncio.sleep(0.05)
    return weakref.ref(protocol)


async def test_a_client_that_never_reads_is_cut_after_the_grace_period_sees_1006_and_frees_its_slots(make_server):
    """The 1008 close frame waits behind the data the client never read, so it cannot arrive: the socket
    is aborted `FORCE_CLOSE_GRACE_S` after the send timeout, and the client sees 1006 (no close frame)."""
    server = make_server(send_timeout_s=0.5, max_in_flight=4)
    async with ws_connect(ws_url(server), max_queue=1) as ws:  # the client stops reading its socket
        protocol = await _stop_reading(server, ws)
        deadline = time.monotonic() + FORCE_CLOSE_GRACE_S + 10
        while protocol() is not None or server.shim.connections:  # aborted, its buffers freed with it
            assert time.monotonic() < deadline, "the connection was never aborted"
            await asyncio.sleep(0.1)
        assert server.shim.limiter.in_flight(None) == 0, "its in-flight slots were not freed"
        with pytest.raises(websockets.ConnectionClosed) as closed:  # reading now ends at the cut
            while True:
                await asyncio.wait_for(ws.recv(), 10)
    assert closed.value.rcvd is None, "no close frame can reach a client that never read"


async def test_a_slow_reader_that_catches_up_within_the_grace_period_sees_1008(make_server):
    server = make_server(send_timeout_s=0.5, max_in_flight=4)
    async with ws_connect(ws_url(server), max_queue=1) as ws:
        await _stop_reading(server, ws)
        with pytest.raises(websockets.ConnectionClosed) as closed:  # it reads what was buffered, then the close
            while True:
                await asyncio.wait_for(ws.recv(), 10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
    assert closed.value.rcvd.reason == "client not reading"
    assert server.shim.limiter.in_flight(None) == 0


async def test_an_idle_connection_is_told_then_closed_with_1001(make_server):
    server = make_server(idle_timeout_s=0.5)
    async with ws_connect(ws_url(server)) as ws:
        await ws.send(create())
        await until_terminal(ws)
        started = time.monotonic()
        error = json.loads(await asyncio.wait_for(ws.recv(), 5))
        assert error["type"] == "error" and error["error"]["code"] == "websocket_connection_idle"
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), 5)
        assert closed.value.rcvd.code == 1001
        assert time.monotonic() - started < 3


async def test_a_busy_connection_is_not_idle(make_server):
    server = make_server(idle_timeout_s=0.3, simulated_ttft_s=0.9)
    async with ws_connect(ws_url(server)) as ws:
        await ws.send(create())
        assert (await until_terminal(ws))[-1]["type"] == "response.completed"


async def test_a_pipelining_client_is_not_read_past_the_queue_bound_and_every_request_is_answered(make_server):
    server = make_server(max_queued_requests=4, simulated_ttft_s=0.05)
    async with ws_connect(ws_url(server)) as ws:
        sending = asyncio.gather(*(ws.send(create(metadata={"n": str(n)})) for n in range(40)))
        await asyncio.sleep(0.3)
        connection = next(iter(server.shim.connections))
        assert connection.queued.requests <= 4
        await sending
        order = []
        for _ in range(40):
            order.append((await until_terminal(ws))[-1]["response"]["metadata"]["n"])
    assert order == [str(n) for n in range(40)]


async def test_a_non_streaming_http_client_that_leaves_cancels_its_response(make_server):
    server = make_server(simulated_ttft_s=5.0)
    async with httpx2.AsyncClient(base_url=server.base_url, headers=HEADERS, timeout=0.5) as http:
        with pytest.raises(httpx2.TimeoutException):
            await http.post("/responses", json={"model": MODEL, "input": "slow"})
    deadline = time.monotonic() + 2
    while server.shim.limiter.in_flight(None) or server.shim.stats.turns == 0:
        assert time.monotonic() < deadline, "the response ran on after its client left"
        await asyncio.sleep(0.05)


async def test_with_api_keys_the_probes_answer_anyone_but_name_deployments_only_for_a_key(make_server):
    server = make_server(api_keys=["key-a"])
    root = server.base_url.removesuffix("/v1")
    async with httpx2.AsyncClient(base_url=root) as http:
        anonymous = [await http.get(path) for path in ("/healthz", "/readyz")]
        keyed = [await http.get(path, headers={"Authorization": "Bearer key-a"}) for path in ("/healthz", "/readyz")]
    assert [r.status_code for r in anonymous] == [200, 200]
    assert anonymous[0].json() == {"status": "ok"} and anonymous[1].json() == {"ready": True}
    assert "connections" in keyed[0].json() and "deployments" in keyed[1].json()


async def test_pipelined_large_frames_are_bounded_by_queued_bytes_and_all_answered(make_server):
    """The issue's case: 400 pipelined 1 MiB frames were all queued (+399 MB)."""
    server = make_server(max_queued_bytes=3 * 1024 * 1024, simulated_ttft_s=0.05)
    frame = create(input="p" * 1024 * 1024, max_output_tokens=1)
    async with ws_connect(ws_url(server), max_size=None) as ws:
        sending = asyncio.gather(*(ws.send(frame) for _ in range(12)))
        peak = 0
        for _ in range(20):
            await asyncio.sleep(0.05)
            if server.shim.connections:
                peak = max(peak, next(iter(server.shim.connections)).queued.nbytes)
        assert 0 < peak <= 4 * 1024 * 1024, "at most the bound plus the frame that filled it"
        await sending
        for _ in range(12):
            assert (await until_terminal(ws))[-1]["type"] == "response.completed"
