"""The router: sticky routes, fast lane, failover before the first token, circuit breaker.

Time is a number these tests advance (the router's injected clock): nothing sleeps."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from server_shim.backends import BackendRequest, SimulatedBackend, TextDelta
from server_shim.backends.base import Delta, Routed
from server_shim.backends.rate_limits import RateLimitState
from server_shim.config import RoutingConfig
from server_shim.deployment_state import Deployment
from server_shim.errors import BackendError
from server_shim.health import Health
from server_shim.history import History
from server_shim.router import Router


class Clock:
    """A monotonic clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Flaky:
    """A real simulated backend that fails its first `fail_times` streams, before or after a token."""

    def __init__(self, name: str, fail_times: int = 0, *, after_first_token: bool = False, status: int = 503):
        self.name = name
        self.inner = SimulatedBackend(model=name)
        self.fail_times = fail_times
        self.after_first_token = after_first_token
        self.status = status
        self.calls = 0
        self.models_ok = True

    async def models(self) -> list[str]:
        if not self.models_ok:
            raise BackendError(f"{self.name} down")
        return [self.name]

    async def aclose(self) -> None:
        return None

    async def stream(self, request: BackendRequest) -> AsyncIterator[Delta]:
        self.calls += 1
        failing = self.calls <= self.fail_times
        if failing and not self.after_first_token:
            raise BackendError(f"{self.name} unavailable", status=self.status, retry_after_s=0.05)
        async for delta in self.inner.stream(request):
            yield delta
            if failing:
                raise BackendError(f"{self.name} cut the stream")


def router(*backends: Flaky, priorities: tuple[int, ...] = (), clock: Clock | None = None, **routing: object) -> Router:
    config = RoutingConfig(**{"failure_threshold": 2, "cooldown_s": 0.2, **routing})
    deployments = [
        Deployment(
            name=b.name,
            backend=b,
            models={"m": f"{b.name}-model"},
            health=Health(config.failure_threshold, config.cooldown_s, config.ewma_alpha),
            priority=priorities[i] if priorities else -i,
        )
        for i, b in enumerate(backends)
    ]
    return Router(deployments, config, clock=clock or Clock())


def request(deployment: str | None = None) -> BackendRequest:
    history = History().extend([{"type": "message", "role": "user", "content": "hi"}])
    return BackendRequest(model="m", history=history, max_output_tokens=3, deployment=deployment)


async def run(router: Router, req: BackendRequest) -> tuple[str, str]:
    """The text, and the deployment the router's decision (`Routed`, its last delta) names."""
    deltas = [d async for d in router.stream(req)]
    assert isinstance(deltas[-1], Routed), "the router yields its decision last"
    return "".join(d.text for d in deltas if isinstance(d, TextDelta)), deltas[-1].deployment


async def text(router: Router, req: BackendRequest) -> str:
    return (await run(router, req))[0]


async def served_by(router: Router, req: BackendRequest) -> str:
    return (await run(router, req))[1]


async def test_routes_by_priority_and_reports_the_deployment_used():
    gpu, cloud = Flaky("gpu"), Flaky("cloud")
    r = router(gpu, cloud, priorities=(1, 5))
    req = request()
    assert await served_by(r, req) == "cloud"
    assert req.deployment is None, "the router writes nothing into the request"
    assert (gpu.calls, cloud.calls) == (0, 1)


async def test_sticky_route_is_reused_without_resolving_again():
    a, b = Flaky("a"), Flaky("b")
    r = router(a, b)
    first = await served_by(r, request())
    for _ in range(5):
        await text(r, request(deployment=first))
    assert r.stats.resolutions == 1
    assert r.stats.sticky_reuses == 5


async def test_a_deployment_past_its_tokens_per_minute_is_tried_last_until_its_window_passes():
    clock = Clock()
    a, b = Flaky("a"), Flaky("b")
    r = router(a, b, clock=clock)
    r.deployments["a"].tokens_per_minute = 5
    assert await served_by(r, request()) == "a"  # its input and 3 output tokens: 5 or more
    assert await served_by(r, request()) == "b", "a has no capacity left this minute"
    assert await served_by(r, request(deployment="a")) == "a", "a sticky route is not moved by the token window"
    clock.advance(61)
    assert await served_by(r, request()) == "a"


async def test_failure_before_first_token_fails_over_and_output_is_not_duplicated():
    a, b = Flaky("a", fail_times=1), Flaky("b")
    r = router(a, b)
    out, deployment = await run(r, request())
    assert out == "simulated reply from "
    assert deployment == "b"
    assert r.stats.failovers == 1


async def test_a_sticky_deployment_failing_before_its_first_token_fails_over_to_the_others_once():
    a, b, c = Flaky("a"), Flaky("b"), Flaky("c")
    r = router(a, b, c)
    assert await served_by(r, request()) == "a"
    a.fail_times = 2  # its next stream fails (its first call served the turn above)
    b.fail_times = 1
    out, deployment = await run(r, request(deployment="a"))
    assert (out, deployment) == ("simulated reply from ", "c"), "a, then each other deployment once, in order"
    assert (a.calls, b.calls, c.calls) == (2, 1, 1)
    assert (r.stats.resolutions, r.stats.sticky_reuses, r.stats.failovers) == (1, 1, 2)


async def test_failure_after_first_token_surfaces_instead_of_retrying():
    a, b = Flaky("a", fail_times=1, after_first_token=True), Flaky("b")
    r = router(a, b)
    seen: list[str] = []
    with pytest.raises(BackendError, match="cut the stream"):
        async for delta in r.stream(request()):
            if isinstance(delta, TextDelta):
                seen.append(delta.text)
    assert seen == ["simulated "]
    assert b.calls == 0


async def test_breaker_opens_after_consecutive_failures_and_recovers_after_cooldown():
    clock = Clock()
    a, b = Flaky("a", fail_times=2), Flaky("b")
    r = router(a, b, clock=clock)
    await text(r, request())
    await text(r, request())
    assert r.deployments["a"].health.state(clock()) == "open"
    await text(r, request())
    assert a.calls == 2, "an open breaker is skipped"
    clock.advance(0.19)
    assert await served_by(r, request()) == "b", "still open just before the cooldown ends"
    clock.advance(0.01)
    assert r.deployments["a"].health.state(clock()) == "half_open"
    assert await served_by(r, request()) == "a"
    assert r.deployments["a"].health.state(clock()) == "closed"


async def test_sticky_route_moves_when_its_deployment_fails():
    a, b = Flaky("a", fail_times=10), Flaky("b")
    r = router(b, a)
    assert await served_by(r, request(deployment="a")) == "b"


async def test_fast_lane_preferred_while_healthy_then_gpu():
    gpu, fast = Flaky("gpu"), Flaky("fast", fail_times=100, status=503)
    r = router(gpu, fast, priorities=(10, 0), fast_lane={"m": "fast"})
    assert await served_by(r, request()) == "gpu"
    assert fast.calls == 1
    await text(r, request())
    assert fast.calls == 2
    await text(r, request())
    assert fast.calls == 2, "the fast lane's breaker is open: traffic stays on the GPU"


async def test_rate_limited_deployment_is_skipped_until_its_reset():
    clock = Clock()
    fast, gpu = Flaky("fast", fail_times=1, status=429), Flaky("gpu")
    r = router(fast, gpu, fast_lane={"m": "fast"}, clock=clock)
    assert await served_by(r, request()) == "gpu"
    assert not r.deployments["fast"].health.available(clock())
    assert r.deployments["fast"].health.state(clock()) == "closed", "a 429 pauses, it is no failure"
    clock.advance(0.05)  # the 429's retry delay
    assert await served_by(r, request()) == "fast"


class HeaderLimited(Flaky):
    """A backend that reads its server's rate-limit headers (`ReportsRateLimits`), as the pooled backends do."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.rate_limit = RateLimitState(reserve_tokens=100)


async def test_a_deployment_whose_headers_say_its_tokens_are_gone_is_skipped_until_they_come_back():
    limited, other = HeaderLimited("limited"), Flaky("other")
    r = router(limited, other)
    assert await served_by(r, request()) == "limited"
    limited.rate_limit.update({"x-ratelimit-remaining-tokens": "50", "x-ratelimit-reset-tokens": "60"})
    assert await served_by(r, request()) == "other", "under its reserve: not tried (no 429 asked for)"
    assert limited.calls == 1
    limited.rate_limit.update({"x-ratelimit-remaining-tokens": "5000", "x-ratelimit-reset-tokens": "60"})
    assert await served_by(r, request()) == "limited"


async def test_least_latency_policy_prefers_the_faster_deployment():
    slow, quick = Flaky("slow"), Flaky("quick")
    r = router(slow, quick, policy="least_latency")
    r.deployments["slow"].health.success(ttft_s=0.5)
    r.deployments["quick"].health.success(ttft_s=0.01)
    assert await served_by(r, request()) == "quick"


async def test_health_checks_close_and_open_breakers():
    a = Flaky("a")
    r = router(a, failure_threshold=1)
    a.models_ok = False
    assert await r.check_health() == {"a": False}
    assert r.deployments["a"].health.state(r.clock()) == "open"
    a.models_ok = True
    assert await r.check_health() == {"a": True}
    assert r.deployments["a"].health.available(r.clock())


async def test_no_deployment_for_the_model_is_a_clear_error():
    r = router(Flaky("a"))
    req = request()
    req.model = "other"
    with pytest.raises(BackendError, match="no available deployment serves model 'other'"):
        await text(r, req)


class Ticking(Clock):
    """A clock that moves a millisecond each time it is read."""

    def __call__(self) -> float:
        self.now += 0.001
        return self.now


async def test_a_reply_ready_at_once_is_routed_and_measured_as_a_streamed_one():
    """The unpaced simulator hands the router its whole reply (`ready`) rather than a stream: the same deltas,
    the same decision, the breaker's estimates and the token window from the same clock, nothing in flight."""
    simulator = SimulatedBackend(model="a")
    simulator.name = "a"
    ready, streamed = router(simulator, clock=Ticking()), router(Flaky("a"), clock=Ticking())
    assert ready.deployments["a"].ready is not None and streamed.deployments["a"].ready is None
    for r in (ready, streamed):
        r.deployments["a"].tokens_per_minute = 1000
    req = request()
    for _ in range(2):
        assert [d async for d in ready.stream(req)] == [d async for d in streamed.stream(req)]
    assert req.served_by == "a"
    for r in (ready, streamed):
        a = r.deployments["a"]
        assert a.in_flight == 0 and a.health.answered and a.tokens.total(r.clock()) == 2 * (7 + 3)
    health = ready.deployments["a"].health  # the first token one tick after the start; the end two after it
    assert (health.ttft_s, health.tokens_per_s) == (pytest.approx(0.001), pytest.approx(3 / 0.002))


class Scoped(Flaky):
    """A backend that keeps state per client connection (`ConnectionScoped`)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.released: list[str] = []

    async def release(self, connection_id: str) -> None:
        self.released.append(connection_id)


async def test_a_closed_connection_is_released_by_every_deployment_that_keeps_state_per_connection():
    scoped, plain, also = Scoped("scoped"), Flaky("plain"), Scoped("also")
    r = router(scoped, plain, also)
    await r.release("conn_1")
    assert scoped.released == also.released == ["conn_1"]


@given(
    st.lists(st.lists(st.sampled_from(["m", "n", "*", "o"]), max_size=3), min_size=1, max_size=3),
    st.sampled_from(["m", "n", "o", "*", "p", ""]),
)
def test_serves_model_is_any_deployment_serving(models: list[list[str]], alias: str) -> None:
    """`serves_model` reads the aliases gathered once: the same answer as asking each deployment (`serves`)."""
    config = RoutingConfig()
    deployments = [
        Deployment(
            name=f"d{i}",
            backend=Flaky(f"d{i}"),
            models={name: name for name in names},
            health=Health(config.failure_threshold, config.cooldown_s, config.ewma_alpha),
        )
        for i, names in enumerate(models)
    ]
    routed = Router(deployments, config)
    assert routed.serves_model(alias) == any(d.serves(alias) for d in deployments)
