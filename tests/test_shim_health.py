"""A deployment's health as a state machine driven by the time it is given: no clock read, no sleep."""

from __future__ import annotations

from server_shim.health import CLOSED, HALF_OPEN, OPEN, Health, TokenWindow


def health() -> Health:
    return Health(failure_threshold=2, cooldown_s=30.0, alpha=0.5)


def test_consecutive_failures_open_the_breaker_for_the_cooldown_then_half_open() -> None:
    h = health()
    h.failure(now=100.0)
    assert h.state(100.0) == CLOSED and h.available(100.0)
    h.failure(now=101.0)
    assert h.state(101.0) == OPEN and not h.available(130.9)
    assert h.state(131.0) == HALF_OPEN and h.available(131.0)
    h.failure(now=131.0)  # a failure while half-open opens it again
    assert h.state(131.0) == OPEN and not h.available(160.9)
    h.success()
    assert h.state(161.0) == CLOSED and h.answered


def test_a_rate_limit_pauses_without_counting_as_a_failure() -> None:
    h = health()
    h.rate_limited(5.0, now=10.0)
    h.rate_limited(1.0, now=11.0)  # a shorter pause never shortens the longer one
    assert not h.available(14.9) and h.available(15.0)
    assert h.state(12.0) == CLOSED and h.consecutive_failures == 0


def test_latency_estimates_are_moving_averages() -> None:
    h = health()
    h.success(ttft_s=1.0, tokens_per_s=100.0)
    h.success(ttft_s=0.0, tokens_per_s=200.0)
    assert (h.ttft_s, h.tokens_per_s) == (0.5, 150.0)


def test_the_token_window_forgets_what_is_older_than_a_minute() -> None:
    window = TokenWindow()
    window.record(100, now=0.0)
    window.record(50, now=30.0)
    assert window.total(now=59.0) == 150
    assert window.total(now=61.0) == 50
