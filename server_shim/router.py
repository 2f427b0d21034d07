"""Route each request to a deployment, and keep that choice for the rest of the conversation.

The router is itself a `Backend`: the turn pipeline hands it a request whose `deployment`
names the previous turn's choice (the conversation's sticky route). A sticky route is reused
without resolving again while its deployment is healthy; otherwise the router resolves by
model alias and policy. Failures before the first delta move on to the next candidate;
after the first delta they surface, so no output is ever duplicated. The router writes
nothing into the request: it yields its decision, `Routed(deployment, carry)`, after the
turn's last delta. Every time it reads comes from the clock it is given; the breaker itself
is the plain state machine in `health.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import replace
from types import MappingProxyType
from typing import Any

from . import metrics
from .backends.base import (
    BackendRequest,
    Carry,
    ConnectionScoped,
    Delta,
    Routed,
    TextDelta,
    ToolCallDelta,
    Usage,
)
from .config import RoutingConfig
from .deadlines import Timer, Watch
from .deployment_state import WILDCARD, Deployment
from .eager import on_task
from .errors import BackendError
from .health import CLOSED
from .trim import Count, Counts

log = logging.getLogger(__name__)

STARTUP_PROBE_S = 5.0
"""How long start-up waits for the first health probe of the deployments before serving anyway."""


class RouterStats(Counts):
    """How turns were routed: updated in place (`Counts`), as most turns bump one of them."""

    resolutions = Count()
    sticky_reuses = Count()
    failovers = Count()


PIECES = (TextDelta, ToolCallDelta)
"""The deltas that are output pieces: what the first token and the tokens per second count."""
RESOLUTIONS, STICKY_REUSES = RouterStats.resolutions.index, RouterStats.sticky_reuses.index
"""Where a turn's bump goes in `RouterStats.cells` (in C, not through the fields' `__get__` and `__set__`)."""


class Router:
    """A `Backend` over several deployments; every time it reads comes from `clock` (seconds, monotonic)."""

    name = "router"

    def __init__(
        self,
        deployments: Sequence[Deployment],
        routing: RoutingConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.deployments = {d.name: d for d in deployments}
        self._served = frozenset(alias for d in deployments for alias in d.models)
        """Every alias some deployment names (`WILDCARD` among them when one serves any): `serves_model`, asked every
        turn, is then one set lookup or two rather than a `Deployment.serves` call per deployment."""
        self._scoped = [d.backend for d in deployments if isinstance(d.backend, ConnectionScoped)]
        """The backends that keep state per connection, found once (deployments are made with the router)."""
        self.routing = routing
        self.clock = clock
        self.stats = RouterStats()
        self._health_task: asyncio.Task[None] | None = None
        self._probed = asyncio.Event()
        self._reachable: dict[str, bool] = {}
        self._published: dict[str, str] = {}
        self._timer: Timer | None = None
        self._windows = any(d.context_window is not None for d in deployments)
        """Whether any deployment declares a context window (read once: deployments are made with the router)."""
        self._routed = {d.name: Routed(d.name, MappingProxyType({})) for d in deployments}
        """Each deployment's decision when its backend carries nothing, made once (the turn copies the carry)."""
        self._replies_at_once = any(d.ready is not None for d in deployments)
        """Whether any deployment ever has a reply at once (`ready`): else `ready` looks nothing up."""

    async def models(self) -> list[str]:
        """The public aliases, plus what each `"*"` deployment lists; an error rather than an empty list
        when nothing is named and no `"*"` deployment answers (an empty list would read as "serves nothing")."""
        aliases = {alias for d in self.deployments.values() for alias in d.models if alias != WILDCARD}
        failure: BackendError | None = None
        for d in self.deployments.values():
            if WILDCARD in d.models:
                try:
                    aliases.update(await d.backend.models())
                except BackendError as exc:
                    failure = exc
        if not aliases and failure is not None:
            raise failure
        return sorted(aliases)

    def serves_model(self, alias: str) -> bool:
        """Whether some deployment `serves` this alias."""
        return alias in self._served or WILDCARD in self._served

    def hosted_policy(self, alias: str, sticky: str | None) -> str:
        """The hosted-tool policy of the deployment a turn will most likely run on."""
        deployment = self._likely(alias, sticky)
        return deployment.hosted_tools if deployment is not None else "drop"

    def context_window(self, alias: str, sticky: str | None) -> int | None:
        """The context window of the deployment a turn will most likely run on (None: not configured).
        Asked every turn: with no window configured anywhere (the usual case) nothing is looked up."""
        if not self._windows:
            return None
        deployment = self._likely(alias, sticky)
        return deployment.context_window if deployment is not None else None

    def _likely(self, alias: str, sticky: str | None) -> Deployment | None:
        """The deployment a turn will most likely run on: its first candidate, read-only (no stats)."""
        deployment = self.deployments.get(sticky) if sticky is not None else None
        if deployment is None or not deployment.health.available(self.clock()) or not deployment.serves(alias):
            resolved = self._resolve(alias)
            deployment = resolved[0] if resolved else None
        return deployment

    def _sticky(self, alias: str, sticky: str | None) -> Deployment | None:
        """The conversation's sticky deployment if it is usable (counted as a sticky reuse), else None."""
        if sticky is not None:
            deployment = self.deployments.get(sticky)
            if deployment is not None and deployment.health.available(self.clock()) and deployment.serves(alias):
                self.stats.cells[STICKY_REUSES] += 1
                return deployment
        return None

    def _others(self, alias: str, first: Deployment) -> list[Deployment]:
        return [d for d in self._resolve(alias) if d is not first]

    def _resolve(self, alias: str) -> list[Deployment]:
        serving = [d for d in self.deployments.values() if d.serves(alias)]
        if self.routing.policy == "least_latency":
            serving.sort(key=lambda d: (d.health.ttft_s or 0.0, -d.priority))
        else:
            serving.sort(key=lambda d: -d.priority)
        fast = self.routing.fast_lane.get(alias)
        now = self.clock()
        usable = [d for d in serving if d.health.available(now) and d.has_capacity(now)]
        usable.sort(key=lambda d: d.name != fast)
        rest = [d for d in serving if d not in usable and d.health.available(now)]
        return usable + rest

    def ready(self, request: BackendRequest) -> list[Delta] | None:
        """The whole reply when its deployment has it at once (`RepliesAtOnce`), routed and measured as `stream`
        would (stats, in flight, first token, token window, breaker, the decision last); else None, with nothing
        counted, and `stream` routes it (a `ready` that raises too: `stream` fails over from it).
        The caller walks a list: no generator, deadline watch or awaitable per delta, as nothing waits."""
        if not self._replies_at_once:
            return None
        deployment = self._likely(request.model, request.deployment)
        if deployment is None or deployment.ready is None:
            return None
        carry = request.carry if deployment.name == request.deployment else {}
        try:
            reply = deployment.ready(_routed(request, deployment, carry))
        except BackendError:
            return None
        if reply is None:
            return None
        self.stats.cells[STICKY_REUSES if deployment.name == request.deployment else RESOLUTIONS] += 1
        if request.stages is not None:
            request.stages.mark("route")
        request.served_by = deployment.name
        deployment.in_flight += 1  # as in `stream`, though nothing can look while a list is walked
        try:
            return self._measured(deployment, reply, carry)
        finally:
            deployment.in_flight -= 1

    def _measured(self, deployment: Deployment, reply: Sequence[Delta], carry: Mapping[str, Any]) -> list[Delta]:
        """A ready reply as `stream` hands it on, measured with the same clock reads; its carry taken out.
        The piece types a tuple made once, and the token window asked only when its limit reads it: a loop run
        for every delta of every ready reply."""
        clock = self.clock
        start = clock()
        first: float | None = None
        pieces = 0
        windowed = deployment.tokens_per_minute is not None
        deltas: list[Delta] = []
        for delta in reply:
            if isinstance(delta, PIECES):
                pieces += 1
                if first is None:
                    first = clock()
            elif isinstance(delta, Usage):
                if windowed:
                    self._count_tokens(deployment, delta)
            elif isinstance(delta, Carry):
                carry = delta.values
                continue
            deltas.append(delta)
        self._succeeded(deployment, start, first, pieces)
        deltas.append(Routed(deployment.name, carry) if carry else self._routed[deployment.name])
        return deltas

    async def stream(self, request: BackendRequest) -> AsyncGenerator[Delta, None]:
        """The first candidate's deltas; one that fails before its first delta hands over to the next.
        The deadlines (`Watch`) and the per-delta bookkeeping are applied here, in no generator of their own.

        The candidates, best first: the sticky deployment alone if usable, else a fresh resolution. A
        conversation that stays on its sticky deployment never resolves again: the others are resolved
        (and added to the list the loop walks) only when it fails over, and a turn that does not makes no
        iterator or generator for them (a `chain` with a never-started generator cost ~4k instructions).
        A reply ready at once (`ready`) is handed on as it is, without a deadline watch, as nothing waits.
        """
        ready = self.ready(request)
        if ready is not None:
            for delta in ready:
                yield delta
            return
        await on_task()  # its watch cancels the current task, and a backend may need one
        alias = request.model
        sticky = self._sticky(alias, request.deployment)
        if sticky is not None:
            candidates = [sticky]
        else:
            self.stats.cells[RESOLUTIONS] += 1
            candidates = self._resolve(alias)
        if request.stages is not None:
            request.stages.mark("route")
        last_error: BackendError | None = None
        previous: Deployment | None = None
        for deployment in candidates:
            if previous is not None:
                self.stats.failovers += 1
                log.warning("failing over from %s to %s", previous.name, deployment.name)
            previous = deployment
            started = False
            carry = request.carry if deployment.name == request.deployment else {}
            deployment.in_flight += 1
            request.served_by = deployment.name
            start = self.clock()
            first: float | None = None
            pieces = 0
            watch = Watch(deployment.deadlines, self._deadline_timer(), start)  # applied here: no generator
            try:
                stream = deployment.backend.stream(_routed(request, deployment, carry))
                while True:
                    if watch.expired:
                        watch.past_due()
                    watch.waiting = True
                    try:
                        delta = await anext(stream)
                    except StopAsyncIteration:
                        break
                    except asyncio.CancelledError:
                        watch.cut()  # DeadlineExceeded when the deadline cut the read
                        raise
                    watch.waiting = False
                    if watch.cancelled or watch.kick is not None:
                        watch.settle()
                    if isinstance(delta, PIECES):
                        pieces += 1
                        if first is None:
                            first = self.clock()
                            watch.token(first)
                    elif isinstance(delta, Usage):
                        self._count_tokens(deployment, delta)
                    elif isinstance(delta, Carry):
                        carry = delta.values
                        continue
                    started = True
                    yield delta
            except BackendError as exc:
                self._fault(deployment, exc)
                last_error = exc
                if started or not exc.retryable:
                    raise
                if deployment is sticky:
                    candidates += self._others(alias, sticky)  # walked next by this loop
                continue
            finally:
                watch.close()
                deployment.in_flight -= 1
            self._succeeded(deployment, start, first, pieces)
            yield Routed(deployment.name, carry) if carry else self._routed[deployment.name]
            return
        raise last_error or self._unavailable(alias)

    def _count_tokens(self, deployment: Deployment, usage: Usage) -> None:
        if deployment.tokens_per_minute is not None:  # only its limit reads the window
            deployment.tokens.record(usage.input_tokens + usage.output_tokens, self.clock())

    def settle(self) -> None:
        """Once after a burst of clients (the trim): disarm the deadline timer if nothing is watched."""
        if self._timer is not None:
            self._timer.settle()

    def _deadline_timer(self) -> Timer:
        """The one deadline timer of the running event loop (a router may outlive a loop, in tests)."""
        loop = asyncio.get_running_loop()
        timer = self._timer
        if timer is None or timer.loop is not loop:
            timer = self._timer = Timer(loop, self.clock)
        return timer

    def _unavailable(self, alias: str) -> BackendError:
        """No candidate: say whether none serves the model or which are resting, why, and for how long."""
        now = self.clock()
        resting = [d for d in self.deployments.values() if d.serves(alias)]
        if not resting:
            return BackendError(
                f"no available deployment serves model {alias!r}", status=503, retryable=False, public=True
            )
        reasons = [f"deployment {d.name!r} unavailable: {d.health.why_resting(now)}" for d in resting]
        wait = min(max(d.health.open_until, d.health.limited_until) - now for d in resting)
        return BackendError(
            "; ".join(reasons), status=503, retryable=False, public=True, retry_after_s=max(1.0, round(wait, 1))
        )

    def _fault(self, deployment: Deployment, exc: BackendError) -> None:
        """A failed stream: named after its deployment, and counted against it when it is the backend's fault."""
        exc.deployment = exc.deployment or deployment.name
        if exc.status == 429:
            deployment.health.rate_limited(exc.retry_after_s or self.routing.cooldown_s, self.clock())
        elif exc.backend_fault:  # a request the backend refused (4xx) is that client's, not the backend's
            deployment.health.failure(self.clock())
        self._publish(deployment)

    def _succeeded(self, deployment: Deployment, start: float, first: float | None, pieces: int) -> None:
        end = self.clock()
        ttft = (first - start) if first is not None else None
        tps = pieces / (end - first) if first is not None and end > first and pieces > 1 else None
        deployment.health.success(ttft, tps)
        if self._published.get(deployment.name) != CLOSED:  # a success closes the breaker (`Health.success`)
            self._publish(deployment)

    async def check_health(self, *, count_failures: bool = True) -> dict[str, bool]:
        """Probe every deployment once; a success closes its breaker, a failure counts. Changes are logged.

        The start-up probe passes `count_failures=False`: a deployment not up yet is reported (and
        `/readyz` waits for one that answers), but its breaker starts closed, as it would without a probe.
        """
        results: dict[str, bool] = {}
        for deployment in self.deployments.values():
            started = self.clock()
            try:
                await deployment.backend.models()
            except BackendError as exc:
                if count_failures:
                    deployment.health.failure(self.clock())
                results[deployment.name] = False
                if self._reachable.get(deployment.name) is not False:
                    log.warning("deployment %r does not answer: %s", deployment.name, exc)
            else:
                deployment.health.success()
                results[deployment.name] = True
                if self._reachable.get(deployment.name) is not True:
                    ms = (self.clock() - started) * 1000
                    log.info("deployment %r answers (health probe %.0f ms)", deployment.name, ms)
            self._reachable[deployment.name] = results[deployment.name]
            self._publish(deployment)
        if not any(results.values()) and not self._probed.is_set():
            log.warning("no deployment answers yet: /readyz says 503 until one does")
        self._probed.set()
        return results

    async def start(self) -> None:
        """The health checks: probe now, then every `health_interval_s`; returns once the first probe
        is in (at most `STARTUP_PROBE_S`), so the first `/readyz` already knows. The app's lifespan calls it."""
        if self._health_task is None:
            self._health_task = asyncio.create_task(self._health_loop())
        await self.first_probe(STARTUP_PROBE_S)

    async def first_probe(self, timeout_s: float) -> None:
        """Wait (bounded) for the start-up probe, so the first `/readyz` already knows."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._probed.wait(), timeout_s)

    async def _health_loop(self) -> None:
        first = True
        while True:
            try:
                await self.check_health(count_failures=not first)
            except Exception:
                log.exception("health probe failed unexpectedly")
            first = False
            await asyncio.sleep(self.routing.health_interval_s)

    def status(self) -> dict[str, dict[str, object]]:
        now = self.clock()
        return {
            d.name: {
                "available": d.health.available(now),
                "answered": d.health.answered,
                "breaker": d.health.state(now),
                "in_flight": d.in_flight,
                "ttft_s": d.health.ttft_s,
                "tokens_per_s": d.health.tokens_per_s,
            }
            for d in self.deployments.values()
        }

    def _publish(self, deployment: Deployment) -> None:
        """The breaker gauge, set when the state it shows changed (most turns change nothing)."""
        state = deployment.health.state(self.clock())
        if self._published.get(deployment.name) != state:
            metrics.BREAKER.labels(deployment.name).set(metrics.BREAKER_STATES[state])
            self._published[deployment.name] = state

    async def release(self, connection_id: str) -> None:
        await asyncio.gather(*(backend.release(connection_id) for backend in self._scoped))

    async def aclose(self) -> None:
        if self._health_task is not None:
            self._health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health_task
        await asyncio.gather(*(d.backend.aclose() for d in self.deployments.values()), return_exceptions=True)


def _routed(request: BackendRequest, deployment: Deployment, carry: Mapping[str, Any]) -> BackendRequest:
    """The request as `deployment` gets it: its own model name and carry (the same object when both are)."""
    model = deployment.backend_model(request.model)
    if model == request.model and (carry is request.carry or not (carry or request.carry)):
        return request
    return replace(request, model=model, carry=carry)
