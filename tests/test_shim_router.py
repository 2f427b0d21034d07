"""The router: sticky routes, fast lane, failover before the first token, circuit breaker."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from server_shim.backends import BackendRequest, SimulatedBackend, TextDelta
from server_shim.backends.base import Delta
from server_shim.config import RoutingConfig
from server_shim.errors import BackendError
from server_shim.render import ChatPrompt
from server_shim.router import Deployment, Health, Router


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

    async def release(self, connection_id: str) -> None:
        return None

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


def router(*backends: Flaky, priorities: tuple[int, ...] = (), **routing: object) -> Router:
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
    return Router(deployments, config)


def request(deployment: str | None = None) -> BackendRequest:
    prompt = ChatPrompt().extend([{"role": "user", "content": "hi"}])
    return BackendRequest(model="m", prompt=prompt, max_output_tokens=3, deployment=deployment)


async def text(router: Router, req: BackendRequest) -> str:
    return "".join([d.text async for d in router.stream(req) if isinstance(d, TextDelta)])


async def test_routes_by_priority_and_reports_the_deployment_used():
    gpu, cloud = Flaky("gpu"), Flaky("cloud")
    r = router(gpu, cloud, priorities=(1, 5))
    req = request()
    assert await text(r, req)
    assert req.deployment == "cloud"
    assert (gpu.calls, cloud.calls) == (0, 1)


async def test_sticky_route_is_reused_without_resolving_again():
    a, b = Flaky("a"), Flaky("b")
    r = router(a, b)
    first = request()
    await text(r, first)
    for _ in range(5):
        await text(r, request(deployment=first.deployment))
    assert r.stats.resolutions == 1
    assert r.stats.sticky_reuses == 5


async def test_failure_before_first_token_fails_over_and_output_is_not_duplicated():
    a, b = Flaky("a", fail_times=1), Flaky("b")
    r = router(a, b)
    req = request()
    out = await text(r, req)
    assert out == "simulated reply from "
    assert req.deployment == "b"
    assert r.stats.failovers == 1


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
    import asyncio

    a, b = Flaky("a", fail_times=2), Flaky("b")
    r = router(a, b)
    await text(r, request())
    await text(r, request())
    assert r.deployments["a"].health.state == "open"
    await text(r, request())
    assert a.calls == 2, "an open breaker is skipped"
    await asyncio.sleep(0.25)
    req = request()
    await text(r, req)
    assert req.deployment == "a"
    assert r.deployments["a"].health.state == "closed"


async def test_sticky_route_moves_when_its_deployment_fails():
    a, b = Flaky("a", fail_times=10), Flaky("b")
    r = router(b, a)
    req = request(deployment="a")
    await text(r, req)
    assert req.deployment == "b"


async def test_fast_lane_preferred_while_healthy_then_gpu():
    gpu, fast = Flaky("gpu"), Flaky("fast", fail_times=100, status=503)
    r = router(gpu, fast, priorities=(10, 0), fast_lane={"m": "fast"})
    req = request()
    await text(r, req)
    assert fast.calls == 1 and req.deployment == "gpu"
    await text(r, request())
    assert fast.calls == 2
    await text(r, request())
    assert fast.calls == 2, "the fast lane's breaker is open: traffic stays on the GPU"


async def test_rate_limited_deployment_is_skipped_until_its_reset():
    import asyncio

    fast, gpu = Flaky("fast", fail_times=1, status=429), Flaky("gpu")
    r = router(fast, gpu, fast_lane={"m": "fast"})
    await text(r, request())
    assert not r.deployments["fast"].health.available
    await asyncio.sleep(0.1)
    req = request()
    await text(r, req)
    assert req.deployment == "fast"


async def test_least_latency_policy_prefers_the_faster_deployment():
    slow, quick = Flaky("slow"), Flaky("quick")
    r = router(slow, quick, policy="least_latency")
    r.deployments["slow"].health.success(ttft_s=0.5)
    r.deployments["quick"].health.success(ttft_s=0.01)
    req = request()
    await text(r, req)
    assert req.deployment == "quick"


async def test_health_checks_close_and_open_breakers():
    a = Flaky("a")
    r = router(a, failure_threshold=1)
    a.models_ok = False
    assert await r.check_health() == {"a": False}
    assert r.deployments["a"].health.state == "open"
    a.models_ok = True
    assert await r.check_health() == {"a": True}
    assert r.deployments["a"].health.available


async def test_no_deployment_for_the_model_is_a_clear_error():
    r = router(Flaky("a"))
    req = request()
    req.model = "other"
    with pytest.raises(BackendError, match="no available deployment serves model 'other'"):
        await text(r, req)
