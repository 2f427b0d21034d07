"""The backend kinds that ship with responses-ws, provided through the same hook as any plugin's.

Each factory has the documented signature `factory(deployment, **options)`; the built-in kinds
take no options, so a `[deployments.options]` table on one of them fails at start-up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..hookspecs import hookimpl

if TYPE_CHECKING:
    from ..config import DeploymentConfig
    from .base import Backend, BackendFactory
    from .openai_compatible import OpenAICompatibleBackend

BUILTIN_KINDS = ("openai_compatible", "cerebras", "responses", "simulated")


def simulated(deployment: DeploymentConfig) -> Backend:
    from .simulated import SimulatedBackend

    return SimulatedBackend(
        ttft_s=deployment.simulated_ttft_s,
        tokens_per_s=deployment.simulated_tokens_per_s,
        model=next(iter(deployment.models)),
        guard=deployment.simulated_guard,
    )


def openai_compatible(deployment: DeploymentConfig) -> Backend:
    from .openai_compatible import OpenAICompatibleBackend

    return _chat_backend(OpenAICompatibleBackend, deployment)


def cerebras(deployment: DeploymentConfig) -> Backend:
    from .cerebras import CerebrasBackend

    return _chat_backend(CerebrasBackend, deployment)


def responses(deployment: DeploymentConfig) -> Backend:
    from .responses_passthrough import ResponsesPassthroughBackend

    return ResponsesPassthroughBackend(**_http(deployment), websocket=deployment.upstream_websocket)


def _chat_backend(cls: type[OpenAICompatibleBackend], deployment: DeploymentConfig) -> Backend:
    return cls(
        **_http(deployment), quirks=deployment.quirks, rate_limit_reserve_tokens=deployment.rate_limit_reserve_tokens
    )


def _http(deployment: DeploymentConfig) -> dict[str, Any]:
    """What every HTTP backend takes from its deployment (the config requires a base_url for these kinds)."""
    assert deployment.base_url is not None
    return {
        "base_url": deployment.base_url,
        "api_key": deployment.resolved_api_key(),
        "timeout_s": deployment.timeout_s,
        "name": deployment.name,
    }


@hookimpl
def responses_ws_backend_kinds() -> dict[str, BackendFactory]:
    return {
        "simulated": simulated,
        "openai_compatible": openai_compatible,
        "cerebras": cerebras,
        "responses": responses,
    }
