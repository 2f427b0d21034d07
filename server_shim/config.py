"""The sidecar config file: server settings, deployments and the routing policy (TOML).

Secrets never live in the file: a deployment names the environment variable that holds its key.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator

from .check_config import CheckConfig
from .settings import SIMULATED, Settings, http_url

NEEDS_BASE_URL = frozenset({"openai_compatible", "cerebras", "responses"})
"""Built-in kinds that cannot run without a `base_url`; a plugin's kind checks its own settings."""

if TYPE_CHECKING:
    ServerSection = BaseModel
else:
    ServerSection = create_model(
        "ServerSection",
        __config__=ConfigDict(extra="forbid"),
        __doc__="The `[server]` table: the fields of `Settings`, validated from the file alone (no environment).",
        **{name: (field.annotation, field) for name, field in Settings.model_fields.items()},
    )


class Quirks(BaseModel):
    """Per-deployment differences from the OpenAI wire format."""

    model_config = ConfigDict(extra="forbid")

    drop_params: list[str] = Field(default_factory=list, description="request fields this server refuses")
    tool_choice: list[str] | None = Field(
        default=None, description="tool_choice modes it accepts (e.g. ['auto', 'none']); others map to 'auto'"
    )
    stream_usage: bool = Field(default=True, description="send stream_options.include_usage")


class DeploymentConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    kind: str = Field(
        min_length=1,
        description="a backend kind: openai_compatible, cerebras, responses, simulated, or one a plugin provides",
    )
    base_url: str | None = None
    api_key_env: str | None = Field(default=None, description="environment variable holding the API key")
    api_key: str | None = Field(default=None, repr=False, description="prefer api_key_env; set by --backend-api-key")
    models: dict[str, str] = Field(min_length=1, description="public model alias -> backend model name")
    priority: int = 0
    max_concurrency: int | None = Field(default=None, ge=1)
    tokens_per_minute: int | None = Field(default=None, ge=1)
    timeout_s: float = 300.0
    first_token_timeout_s: float = Field(default=60.0, gt=0, description="a turn with no token by then fails (504)")
    response_timeout_s: float = Field(default=180.0, gt=0, description="a turn still streaming by then fails (504)")
    quirks: Quirks | None = Field(default=None, description="defaults per kind; cerebras has its own")
    upstream_websocket: bool = Field(
        default=False, description="kind 'responses': one upstream WebSocket per client connection, chained upstream"
    )
    rate_limit_reserve_tokens: int = Field(
        default=2048, ge=0, description="route elsewhere when the backend reports fewer tokens left this minute"
    )
    context_window: int | None = Field(
        default=None,
        ge=1,
        description="tokens the backend model takes in: a longer conversation is truncated (truncation: auto) "
        "or refused with context_length_exceeded",
    )
    hosted_tools: Literal["drop", "refuse", "pass"] | None = Field(
        default=None,
        description="hosted tools (web_search, mcp, ...) in a request: drop them (listed in the response metadata), "
        "refuse the request (unsupported_tool), or pass them on; default 'pass' for kind 'responses', else 'drop'",
    )
    simulated_ttft_s: float = 0.0
    simulated_tokens_per_s: float = 0.0
    simulated_guard: dict[str, list[str]] | None = Field(
        default=None, description="kind 'simulated': answer as a guard model, {category: [words]} (see simulated.py)"
    )
    options: dict[str, Any] = Field(
        default_factory=dict, description="settings for the kind's factory, passed to it as keyword arguments"
    )
    checks: list[CheckConfig] = Field(
        default_factory=list, description="built-in checks for the requests to this deployment's model aliases"
    )
    tokenizer: Literal["estimate", "llama.cpp", "llama-cpp-python", "vllm"] = Field(
        default="estimate", description="how usage is counted when the backend sends none (server_shim/tokens.py)"
    )
    tokenizer_url: str | None = Field(
        default=None, description="where the tokenize endpoint lives; default base_url without /v1"
    )
    template_tokens_per_message: int = Field(default=0, ge=0, description="chat-template tokens around each message")

    @model_validator(mode="after")
    def _needs_url(self) -> DeploymentConfig:
        if self.kind in NEEDS_BASE_URL and not self.base_url:
            raise ValueError(f"deployment {self.name!r}: kind {self.kind!r} needs a base_url")
        if self.kind in NEEDS_BASE_URL and not http_url(str(self.base_url)):
            raise ValueError(f"deployment {self.name!r}: base_url must be an http:// or https:// URL")
        return self

    @property
    def hosted_policy(self) -> Literal["drop", "refuse", "pass"]:
        return self.hosted_tools or ("pass" if self.kind == "responses" else "drop")

    def resolved_api_key(self) -> str | None:
        if self.api_key_env and os.environ.get(self.api_key_env):
            return os.environ[self.api_key_env]
        return self.api_key


class RoutingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    policy: Literal["priority", "least_latency"] = "priority"
    fast_lane: dict[str, str] = Field(
        default_factory=dict, description="model alias -> deployment preferred while healthy and under its limits"
    )
    failure_threshold: int = Field(default=3, ge=1)
    cooldown_s: float = Field(default=30.0, gt=0)
    health_interval_s: float = Field(default=15.0, gt=0)
    ewma_alpha: float = Field(default=0.3, gt=0, le=1)


class ShimConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    server: ServerSection = Field(default_factory=ServerSection)
    deployments: list[DeploymentConfig] = Field(default_factory=list)
    routing: RoutingConfig = Field(default_factory=RoutingConfig)
    checks: list[CheckConfig] = Field(default_factory=list, description="built-in checks for every request")

    @model_validator(mode="after")
    def _consistent(self) -> ShimConfig:
        names = [d.name for d in self.deployments]
        if len(set(names)) != len(names):
            raise ValueError("deployment names must be unique")
        aliases = {alias for d in self.deployments for alias in d.models}
        for alias, name in self.routing.fast_lane.items():
            if name not in names:
                raise ValueError(f"routing.fast_lane[{alias!r}] names unknown deployment {name!r}")
            if alias not in aliases:
                raise ValueError(f"routing.fast_lane names unknown model alias {alias!r}")
        for check in [*self.checks, *(c for d in self.deployments for c in d.checks)]:
            if check.model is not None and check.model not in aliases and "*" not in aliases:
                raise ValueError(f"check {check.key!r}: no deployment serves its guard model {check.model!r}")
        return self

    @classmethod
    def load(cls, path: str | Path) -> ShimConfig:
        return cls.model_validate(tomllib.loads(Path(path).read_text()))

    def settings(self, **overrides: Any) -> Settings:
        values = self.server.model_dump(exclude_unset=True)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return Settings(**values)

    @classmethod
    def from_settings(cls, settings: Settings) -> ShimConfig:
        """The one-deployment config that `--backend` means when no file is given."""
        if settings.backend == SIMULATED:
            deployment = DeploymentConfig(
                name="simulated",
                kind="simulated",
                models={settings.default_model: settings.default_model},
                first_token_timeout_s=settings.first_token_timeout_s,
                response_timeout_s=settings.response_timeout_s,
                simulated_ttft_s=settings.simulated_ttft_s,
                simulated_tokens_per_s=settings.simulated_tokens_per_s,
            )
        else:
            deployment = DeploymentConfig(
                name="default",
                kind="openai_compatible",
                base_url=settings.backend,
                api_key=settings.backend_api_key,
                models={"*": "*"},
                timeout_s=settings.backend_timeout_s,
                first_token_timeout_s=settings.first_token_timeout_s,
                response_timeout_s=settings.response_timeout_s,
            )
        return cls(deployments=[deployment])

    def routing_table(self) -> list[tuple[str, str, str, str]]:
        """(alias, deployment, backend model, why) rows in the order the router tries them."""
        rows = []
        aliases = sorted({alias for d in self.deployments for alias in d.models})
        for alias in aliases:
            serving = sorted((d for d in self.deployments if alias in d.models), key=lambda d: -d.priority)
            fast = self.routing.fast_lane.get(alias)
            serving.sort(key=lambda d: d.name != fast)
            for d in serving:
                why = "fast lane" if d.name == fast else f"{self.routing.policy} (priority {d.priority})"
                rows.append((alias, d.name, d.models[alias], why))
        return rows
