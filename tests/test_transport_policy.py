"""The transport's decisions, driven directly: no server, no socket, no event loop, no sleeping.

A `FakeClock` stands in for `time.monotonic`; each test feeds the machines what the sockets did
and checks what they answer.
"""

from __future__ import annotations

import pytest
from support.clock import FakeClock

from ws_transport import ReconnectPolicy
from ws_transport.policy import (
    Dialer,
    FrameLimit,
    Open,
    Pool,
    Replicas,
    SocketState,
    Take,
    TurnAttempts,
    Verdict,
    Wait,
    should_resend,
    upgrade_verdict,
)

ALICE = (("authorization", "Bearer alice"),)
BOB = (("authorization", "Bearer bob"),)


def pool(clock: FakeClock | None = None, **options: object) -> Pool:
    return Pool(clock=clock or FakeClock(), **options)  # type: ignore[arg-type]


def open_socket(p: Pool, credentials: tuple[tuple[str, str], ...] = ALICE):
    assert isinstance(p.acquire(credentials), Open)
    return p.opened(credentials)


# --- Pool: which socket a turn rides ---------------------------------------------------------------


def test_the_first_turn_opens_a_socket_and_rides_it() -> None:
    p = pool()
    decision = p.acquire(ALICE)
    assert decision == Open(replacing=False)
    socket = p.opened(ALICE)
    assert (socket.generation, socket.in_flight, socket.state) == (1, 1, SocketState.OPEN)


def test_a_second_turn_waits_while_a_socket_is_opening_then_shares_it() -> None:
    p = pool()
    assert isinstance(p.acquire(ALICE), Open)
    assert isinstance(p.acquire(ALICE), Wait)
    socket = p.opened(ALICE)
    assert p.acquire(ALICE) == Take(socket)
    assert socket.in_flight == 2


def test_a_turn_rides_the_socket_that_holds_its_chain() -> None:
    p = pool(max_in_flight=2)
    first = open_socket(p)
    assert isinstance(p.acquire(ALICE), Take)  # first is now full
    second = open_socket(p)
    p.release(first, clean=True)
    p.release(first, clean=True)
    assert first.free > second.free
    assert p.acquire(ALICE, chain_generation=second.generation) == Take(second)
    assert p.acquire(ALICE) == Take(first), "without a chain: the socket with most room"


def test_a_turn_never_rides_a_socket_upgraded_with_other_credentials() -> None:
    p = pool()
    alice = open_socket(p, ALICE)
    decision = p.acquire(BOB)
    assert isinstance(decision, Open)
    bob = p.opened(BOB)
    assert bob is not alice and bob.credentials == BOB


def test_at_the_connection_limit_idle_sockets_of_other_credentials_retire_to_make_room() -> None:
    p = pool(max_connections=1)
    alice = open_socket(p, ALICE)
    p.release(alice, clean=True)
    assert isinstance(p.acquire(BOB), Open)
    assert alice.state is SocketState.DRAINING
    assert p.closable() == [alice]


def test_at_the_connection_limit_a_busy_socket_makes_the_turn_wait() -> None:
    p = pool(max_connections=1)
    alice = open_socket(p, ALICE)
    assert isinstance(p.acquire(BOB), Wait)
    assert alice.usable and p.closable() == []
    p.release(alice, clean=True)
    assert isinstance(p.acquire(BOB), Open)


def test_without_lanes_each_socket_carries_one_turn() -> None:
    p = pool(lanes=False, max_connections=2)
    first = open_socket(p)
    assert isinstance(p.acquire(ALICE), Open)
    second = p.opened(ALICE)
    assert isinstance(p.acquire(ALICE), Wait)
    p.release(first, clean=True)
    assert p.acquire(ALICE) == Take(first)
    assert second.in_flight == 1


# --- Pool: retiring sockets -----------------------------------------------------------------------


def test_a_socket_past_its_age_retires_and_the_next_turn_opens_another() -> None:
    clock = FakeClock()
    p = pool(clock, max_age_s=60)
    old = open_socket(p)
    p.release(old, clean=True)
    clock.advance(59)
    assert p.acquire(ALICE) == Take(old)
    p.release(old, clean=True)
    clock.advance(2)
    assert p.acquire(ALICE) == Open(replacing=True)
    assert old.state is SocketState.DRAINING and p.closable() == [old]


def test_an_aged_socket_with_turns_in_flight_closes_only_after_the_last() -> None:
    clock = FakeClock()
    p = pool(clock, max_age_s=60)
    old = open_socket(p)
    clock.advance(61)
    assert isinstance(p.acquire(ALICE), Open)
    new = p.opened(ALICE)
    assert p.closable() == [] and old.state is SocketState.DRAINING
    p.release(old, clean=True)
    assert p.closable() == [old]
    assert p.sockets == [new]


def test_a_turn_abandoned_mid_response_retires_its_socket() -> None:
    p = pool()
    socket = open_socket(p)
    assert p.acquire(ALICE) == Take(socket)
    p.release(socket, clean=False)
    assert socket.state is SocketState.DRAINING
    assert p.closable() == [], "its other turn still runs"
    p.release(socket, clean=True)
    assert p.closable() == [socket]
    assert p.closable() == [], "handed over once"


def test_a_closing_server_drains_the_socket() -> None:
    p = pool()
    socket = open_socket(p)
    p.drain(socket)
    assert not socket.usable
    assert isinstance(p.acquire(ALICE), Open)


def test_a_lost_socket_leaves_the_table_and_the_next_one_counts_as_a_reconnect() -> None:
    p = pool()
    socket = open_socket(p)
    p.lost(socket)
    p.release(socket, clean=False)
    assert p.sockets == [] and p.closable() == []
    assert p.acquire(ALICE) == Open(replacing=True)
    assert p.opened(ALICE).generation == 2


def test_a_failed_open_lets_the_next_turn_try() -> None:
    p = pool()
    assert isinstance(p.acquire(ALICE), Open)
    assert isinstance(p.acquire(ALICE), Wait)
    p.open_failed()
    assert p.acquire(ALICE) == Open(replacing=False)


# --- Dialer: backoff and what a refused upgrade means ---------------------------------------------


def test_backoff_doubles_up_to_the_cap_and_the_first_attempt_waits_nothing() -> None:
    policy = ReconnectPolicy(max_attempts=6, initial_delay_s=0.1, max_delay_s=0.5, jitter=0.0)
    dialer = Dialer(policy)
    delays = []
    while (delay := dialer.next_delay()) is not None:
        delays.append(delay)
    assert delays == [0.0, 0.1, 0.2, 0.4, 0.5, 0.5]


def test_jitter_only_shortens_the_wait() -> None:
    policy = ReconnectPolicy(initial_delay_s=1.0, jitter=0.25)
    assert policy.delay(1, rand=0.0) == 1.0
    assert policy.delay(1, rand=0.999) == pytest.approx(0.75, abs=1e-3)
    assert [Dialer(policy, random=lambda: 0.5).next_delay() for _ in range(2)] == [0.0, 0.0]


@pytest.mark.parametrize(
    ("status", "verdict"),
    [
        (None, Verdict.RETRY),
        (500, Verdict.RETRY),
        (503, Verdict.RETRY),
        (408, Verdict.RETRY),
        (429, Verdict.RETRY),
        (404, Verdict.FALL_BACK),
        (405, Verdict.FALL_BACK),
        (426, Verdict.FALL_BACK),
        (401, Verdict.REJECT),
        (403, Verdict.REJECT),
    ],
)
def test_what_a_refused_upgrade_means(status: int | None, verdict: Verdict) -> None:
    assert upgrade_verdict(status) is verdict


def test_a_spent_reconnect_budget_falls_back_and_says_why() -> None:
    dialer = Dialer(ReconnectPolicy(max_attempts=2))
    assert dialer.next_delay() == 0.0
    assert dialer.failed(503, "HTTP 503") is Verdict.RETRY
    assert dialer.next_delay() is not None
    assert dialer.failed(None, "connection refused") is Verdict.FALL_BACK
    assert dialer.reason == "could not open a WebSocket after 2 attempts (connection refused)"
    assert dialer.next_delay() is None


def test_a_fallback_status_falls_back_at_once() -> None:
    dialer = Dialer(ReconnectPolicy(max_attempts=4))
    dialer.next_delay()
    assert dialer.failed(426, "upgrade refused with HTTP 426") is Verdict.FALL_BACK
    assert dialer.reason == "upgrade refused with HTTP 426"


# --- TurnAttempts: resend in full, once, only while it can be hidden --------------------------------


def test_resend_rule_only_for_lost_chains_and_retired_sockets() -> None:
    assert should_resend("previous_response_not_found", chained=True)
    assert not should_resend("previous_response_not_found", chained=False)
    assert should_resend("websocket_connection_limit_reached", chained=False)
    assert should_resend("server_shutting_down", chained=False)
    assert not should_resend("invalid_value", chained=True)
    assert not should_resend(None, chained=True)


def test_a_lost_chain_is_resent_in_full_once() -> None:
    turn = TurnAttempts()
    assert turn.begin(can_chain=True)
    turn.sent(100)
    assert turn.error("previous_response_not_found") is Verdict.RETRY
    assert turn.begin(can_chain=True) is False, "the resend goes in full"
    turn.sent(5000)
    assert turn.error("previous_response_not_found") is Verdict.REJECT


def test_a_caller_chosen_previous_response_id_is_never_resent() -> None:
    turn = TurnAttempts()
    turn.begin(can_chain=False)
    turn.sent(100)
    assert turn.error("previous_response_not_found") is Verdict.REJECT


def test_an_invalid_request_is_never_resent() -> None:
    turn = TurnAttempts()
    turn.begin(can_chain=True)
    turn.sent(100)
    assert turn.error("invalid_value") is Verdict.REJECT
    assert turn.clean


@pytest.mark.parametrize("code", [1001, 1006, 1011, 1012])
def test_a_recoverable_close_before_anything_was_delivered_is_resent(code: int) -> None:
    turn = TurnAttempts()
    turn.begin(can_chain=True)
    turn.sent(100)
    assert not turn.clean
    assert turn.closed(code) is Verdict.RETRY
    turn.begin(can_chain=True)
    turn.sent(100)
    assert turn.closed(code) is Verdict.REJECT, "only once"


def test_a_close_after_events_reached_a_stream_cannot_be_hidden() -> None:
    turn = TurnAttempts()
    turn.begin(can_chain=False)
    turn.sent(100)
    turn.delivering()
    assert turn.closed(1011) is Verdict.REJECT


def test_a_policy_violation_close_is_not_retried_once_the_frame_left() -> None:
    turn = TurnAttempts()
    turn.begin(can_chain=False)
    turn.sent(100)
    assert turn.closed(1008) is Verdict.REJECT


def test_any_close_before_the_frame_left_is_retried() -> None:
    turn = TurnAttempts()
    turn.begin(can_chain=False)
    assert turn.closed(1008) is Verdict.RETRY


def test_a_1009_teaches_the_frame_limit_and_sends_this_turn_over_http() -> None:
    limit = FrameLimit()
    turn = TurnAttempts(frame_limit=limit)
    turn.begin(can_chain=False)
    assert turn.fits(10_000)
    turn.sent(10_000)
    assert turn.closed(1009) is Verdict.FALL_BACK
    assert (limit.nbytes, limit.refusals) == (10_000, 1)
    later = TurnAttempts(frame_limit=limit)
    later.begin(can_chain=False)
    assert not later.fits(10_000) and later.fits(9_999)


def test_the_frame_limit_keeps_the_smallest_refused_size() -> None:
    limit = FrameLimit()
    limit.learn(8000)
    limit.learn(12_000)
    assert (limit.nbytes, limit.refusals) == (8000, 2)


def test_a_finished_turn_leaves_its_lane_clean() -> None:
    turn = TurnAttempts()
    turn.begin(can_chain=False)
    turn.sent(100)
    assert not turn.clean
    turn.finished()
    assert turn.clean


# --- Replicas: where the next socket is opened -----------------------------------------------------


def test_a_failed_attempt_moves_to_the_next_replica_and_wraps_around() -> None:
    replicas = Replicas(["ws://b/responses", "ws://c/responses"])
    replicas.set_primary("ws://a/responses")
    seen = []
    for _ in range(4):
        seen.append(replicas.current)
        replicas.failed()
    assert seen == ["ws://a/responses", "ws://b/responses", "ws://c/responses", "ws://a/responses"]


def test_without_failover_urls_every_attempt_goes_to_the_session_url() -> None:
    replicas = Replicas()
    replicas.set_primary("ws://a/responses")
    replicas.failed()
    assert replicas.current == "ws://a/responses"


def test_over_http_a_turn_goes_where_the_sockets_go_now_then_to_the_other_replicas() -> None:
    replicas = Replicas(["ws://b/v1/responses", "ws://c/v1/responses"], bases=["http://b/v1", "http://c/v1/"])
    replicas.set_primary("ws://a/v1/responses")
    own = "http://a/v1/chat/completions"
    assert replicas.http_order(own, "/chat/completions") == [
        own,
        "http://b/v1/chat/completions",
        "http://c/v1/chat/completions",
    ]
    replicas.failed()
    assert replicas.http_order(own, "/responses") == ["http://b/v1/responses", "http://c/v1/responses", own]
    assert Replicas().http_order(own, "/responses") == [own]
