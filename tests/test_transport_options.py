"""`SessionOptions`, `ReconnectPolicy` and `SessionStats`: the defaults, and that each option reaches the session."""

from __future__ import annotations

import dataclasses
import time

import pytest
from openai import OpenAI
from support.clock import FakeClock

import ws_transport
from ws_transport import ReconnectPolicy, SessionOptions, SessionStats


def test_defaults_suit_the_openai_api_and_the_shim() -> None:
    options = SessionOptions()
    assert options.max_connection_age_s < 60 * 60, "before the server's 60-minute limit"
    assert options.lanes and options.max_in_flight == 16
    assert options.clock is time.monotonic
    assert options.reconnect == ReconnectPolicy()


def test_options_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        SessionOptions().lanes = False  # type: ignore[misc]


def test_keyword_options_reach_the_session_and_its_pool() -> None:
    clock = FakeClock()
    with OpenAI(base_url="http://127.0.0.1:9/v1", api_key="k") as plain:
        client = ws_transport.wrap(plain, clock=clock, max_connections=2, lanes=False, max_connection_age_s=30)
        session = ws_transport.session_of(client)
        assert session.pool.clock is clock
        assert (session.pool.max_connections, session.pool.capacity, session.pool.max_age_s) == (2, 1, 30)


@pytest.mark.parametrize(
    ("code", "recoverable"), [(1001, True), (1006, True), (1011, True), (1000, False), (1008, False)]
)
def test_recoverable_close_codes_are_the_sdks(code: int, recoverable: bool) -> None:
    assert ReconnectPolicy().recoverable(code) is recoverable


def test_the_first_attempt_never_waits() -> None:
    assert ReconnectPolicy(initial_delay_s=5).delay(0) == 0.0


def test_bytes_saved_is_what_http_would_have_sent_minus_what_was_sent() -> None:
    stats = SessionStats(bytes_sent=1_000, bytes_http_equivalent=25_000)
    assert stats.bytes_saved == 24_000
