"""The router built from the configuration: one backend per deployment, made by its kind's factory.

Kept apart from `router.py` (the per-turn routing) since it runs once, at start-up and in `check-config`.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable

from .backends.base import Backend, BackendFactory
from .config import DeploymentConfig, ShimConfig
from .deadlines import Deadlines
from .deployment_state import Deployment
from .health import Health
from .router import Router


def build_router(
    config: ShimConfig, kinds: dict[str, BackendFactory], *, clock: Callable[[], float] = time.monotonic
) -> Router:
    """One backend per deployment, made by the factory registered for its kind."""
    routing = config.routing
    deployments = [
        Deployment(
            name=spec.name,
            backend=make_backend(spec, kinds),
            models=dict(spec.models),
            health=Health(routing.failure_threshold, routing.cooldown_s, routing.ewma_alpha),
            priority=spec.priority,
            max_concurrency=spec.max_concurrency,
            tokens_per_minute=spec.tokens_per_minute,
            deadlines=Deadlines(spec.first_token_timeout_s, spec.response_timeout_s),
            hosted_tools=spec.hosted_policy,
            context_window=spec.context_window,
        )
        for spec in config.deployments
    ]
    return Router(deployments, routing, clock=clock)


def make_backend(spec: DeploymentConfig, kinds: dict[str, BackendFactory]) -> Backend:
    """`factory(spec, **spec.options)` for the deployment's kind."""
    return factory_for(spec, kinds)(spec, **spec.options)


def factory_for(spec: DeploymentConfig, kinds: dict[str, BackendFactory]) -> BackendFactory:
    """The factory of the deployment's kind; a `ValueError` naming the deployment when no plugin
    provides the kind or its factory does not take the deployment's options."""
    factory = kinds.get(spec.kind)
    if factory is None:
        raise ValueError(
            f"deployment {spec.name!r}: no plugin provides backend kind {spec.kind!r} (known: {', '.join(sorted(kinds))})"
        )
    try:
        inspect.signature(factory).bind(spec, **spec.options)
    except TypeError as exc:
        raise ValueError(f"deployment {spec.name!r}: kind {spec.kind!r} does not take these options: {exc}") from None
    return factory
