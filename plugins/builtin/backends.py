"""The backend kinds that ship with responses-ws, provided through the same hook as any plugin's."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..hookspecs import hookimpl

if TYPE_CHECKING:
    from collections.abc import Callable

    from server_shim.backends import OpenAICompatibleBackend
    from server_shim.backends.base import Backend
    from server_shim.config import DeploymentConfig


def simulated(spec: DeploymentConfig) -> Backend:
    from server_shim.backends import SimulatedBackend

    return SimulatedBackend(
        ttft_s=spec.simulated_ttft_s,
        tokens_per_s=spec.simulated_tokens_per_s,
        model=next(iter(spec.models)),
    )


def openai_compatible(spec: DeploymentConfig) -> Backend:
    from server_shim.backends import OpenAICompatibleBackend

    return _chat_backend(OpenAICompatibleBackend, spec)


def cerebras(spec: DeploymentConfig) -> Backend:
    from server_shim.backends.cerebras import CerebrasBackend

    return _chat_backend(CerebrasBackend, spec)


def responses(spec: DeploymentConfig) -> Backend:
    from server_shim.backends.responses_passthrough import ResponsesPassthroughBackend

    assert spec.base_url is not None
    return ResponsesPassthroughBackend(
        spec.base_url,
        api_key=spec.resolved_api_key(),
        timeout_s=spec.timeout_s,
        name=spec.name,
        websocket=spec.upstream_websocket,
    )


def _chat_backend(cls: type[OpenAICompatibleBackend], spec: DeploymentConfig) -> Backend:
    assert spec.base_url is not None
    return cls(
        spec.base_url,
        api_key=spec.resolved_api_key(),
        timeout_s=spec.timeout_s,
        name=spec.name,
        quirks=spec.quirks,
        rate_limit_reserve_tokens=spec.rate_limit_reserve_tokens,
    )


@hookimpl
def responses_ws_backend_kinds() -> dict[str, Callable[[DeploymentConfig], Backend]]:
    return {
        "simulated": simulated,
        "openai_compatible": openai_compatible,
        "cerebras": cerebras,
        "responses": responses,
    }
