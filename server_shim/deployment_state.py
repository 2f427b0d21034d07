"""A deployment as the router holds it: its backend, the model aliases it serves, its health and its limits.

Kept apart from `router.py` (the per-turn routing): what a deployment can take (`has_capacity`) and what it
serves are its own state, read by the router's policies and by `deployments.py`, which builds them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .backends.base import Backend, BackendRequest, Delta, RepliesAtOnce, ReportsRateLimits
from .backends.rate_limits import RateLimitState
from .deadlines import Deadlines
from .health import Health, TokenWindow

WILDCARD = "*"
"""A model alias that stands for every alias (`models = {"*": ...}`)."""


@dataclass
class Deployment:
    name: str
    backend: Backend
    models: dict[str, str]
    health: Health
    priority: int = 0
    max_concurrency: int | None = None
    tokens_per_minute: int | None = None
    hosted_tools: str = "drop"
    """The deployment's hosted-tool policy (`DeploymentConfig.hosted_tools`)."""
    context_window: int | None = None
    """Tokens its model takes in (`DeploymentConfig.context_window`); None: not configured, nothing truncated."""
    in_flight: int = 0
    tokens: TokenWindow = field(default_factory=TokenWindow)
    deadlines: Deadlines = field(default_factory=lambda: Deadlines(60.0, 180.0))
    ready: Callable[[BackendRequest], Sequence[Delta] | None] | None = field(init=False, repr=False, compare=False)
    """The backend's `ready` where it has one (`RepliesAtOnce`), looked up once rather than every turn."""
    rate_limit: RateLimitState | None = field(init=False, repr=False, compare=False)
    """The backend's rate-limit state where it reads one (`ReportsRateLimits`), looked up once: an `isinstance`
    against a runtime-checkable protocol walks the protocol's attributes on every call (~100k instructions on
    3.11), and every resolution (each conversation's first turn) asks `has_capacity`."""

    def __post_init__(self) -> None:
        self.ready = self.backend.ready if isinstance(self.backend, RepliesAtOnce) else None
        self.rate_limit = self.backend.rate_limit if isinstance(self.backend, ReportsRateLimits) else None

    def serves(self, alias: str) -> bool:
        return alias in self.models or WILDCARD in self.models

    def backend_model(self, alias: str) -> str:
        target = self.models.get(alias, self.models.get(WILDCARD, alias))
        return alias if target == WILDCARD else target

    def has_capacity(self, now: float) -> bool:
        if self.max_concurrency is not None and self.in_flight >= self.max_concurrency:
            return False
        if self.tokens_per_minute is not None and self.tokens.total(now) >= self.tokens_per_minute:
            return False
        return self.rate_limit is None or not self.rate_limit.exhausted()
