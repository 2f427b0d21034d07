"""Server settings: flags, environment (`RESPONSES_WS_*`) and an optional TOML file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import orjson
from pydantic import AfterValidator, Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

SIMULATED = "simulated"


def backend_url(value: str) -> str:
    """'simulated' or an http(s) URL with a host: `vllm` or `127.0.0.1:8000` would fail on every request instead."""
    if value == SIMULATED or http_url(value):
        return value
    raise ValueError("expected 'simulated' or an http:// or https:// URL such as http://127.0.0.1:8000/v1")


def http_url(value: str) -> bool:
    parts = urlsplit(value)
    return parts.scheme in ("http", "https") and bool(parts.hostname)


class Settings(BaseSettings):
    """Everything the shim needs to run; every field can be set by env var `RESPONSES_WS_<NAME>`.

    List settings (`RESPONSES_WS_API_KEYS`) take entries separated by commas or newlines, or a JSON list.
    """

    model_config = SettingsConfigDict(env_prefix="RESPONSES_WS_", extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(default=8787, ge=0, le=65535)
    backend: Annotated[str, AfterValidator(backend_url)] = Field(
        default=SIMULATED,
        description="'simulated' or the base URL of an OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1",
    )
    backend_api_key: str | None = None
    backend_timeout_s: float = Field(default=300.0, gt=0)
    first_token_timeout_s: float = Field(default=60.0, gt=0, description="no token from the backend by then: 504")
    response_timeout_s: float = Field(default=180.0, gt=0, description="a response still streaming by then: 504")
    api_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Bearer keys clients must present, each 'KEY' or 'TENANT KEY'; from the environment a JSON "
        "list or entries separated by commas or newlines.",
    )
    api_keys_file: str | None = Field(
        default=None,
        description="File of keys, one 'KEY' or 'TENANT KEY' a line (whole-line '#' comments), read at start-up; "
        "a line that is anything else stops start-up",
    )
    allowed_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="web origins (scheme://host[:port]) whose browser pages may call the server, '*' for any; a "
        "request with another Origin header gets 403 origin_not_allowed",
    )
    allowed_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Host header names answered besides loopback ones ('*': any); bound to loopback, any other gets "
        "403 host_not_allowed (DNS rebinding)",
    )
    metrics_key: str | None = Field(
        default=None,
        repr=False,
        description="a key that opens /metrics only (a Prometheus scraper's bearer token); /metrics also takes any API key",
    )
    metrics_open: bool = Field(
        default=False,
        description="serve /metrics without a key even when keys are configured (a scraper on a private network: "
        "it shows deployment names and counts)",
    )
    default_model: str = "simulated-1"
    compaction_secret: str | None = Field(
        default=None,
        description="Key that signs compaction items; unset: a random key per process (set it for replicas and restarts)",
    )

    max_frame_bytes: int = Field(default=4 * 1024 * 1024, gt=0)
    max_body_bytes: int = 16 * 1024 * 1024
    sliced_parse_bytes: int = Field(
        default=256 * 1024,
        ge=0,
        description="frames and bodies this large are parsed in slices, letting other connections run (0: never)",
    )
    max_json_depth: int = Field(
        default=64,
        ge=2,
        le=200,
        description="nesting of any request value (at most 200: orjson encodes ~254 levels, and events, states and "
        "the store wrap request values a few levels deeper)",
    )
    max_json_values: int = Field(
        default=100_000,
        ge=1,
        description="JSON values (scalars, arrays, objects) one frame or request body may hold, counted before parsing",
    )
    max_input_items: int = 5_000
    max_item_references: int = 256
    max_reference_bytes: int = 4 * 1024 * 1024
    max_tools: int = 128
    max_tool_schema_depth: int = 32
    max_conversation_bytes: int = Field(default=16 * 1024 * 1024, gt=0)
    connection_max_age_s: float = Field(default=3600.0, gt=0)
    max_lanes: int = Field(default=32, ge=1)
    max_in_flight: int = Field(default=16, ge=1)
    drain_timeout_s: float = Field(default=30.0, ge=0)
    max_connections: int = Field(default=1024, ge=1, description="WebSocket connections per process; 503 beyond")
    tenant_max_connections: int | None = Field(
        default=None,
        ge=0,
        description="WebSocket connections per tenant, 503 beyond (0: no limit); unset: half of max_connections "
        "when the keys name two or more tenants, else no limit",
    )
    max_queued_requests: int = Field(default=64, ge=1, description="queued per connection; reading stops beyond")
    max_queued_bytes: int = Field(default=16 * 1024 * 1024, gt=0, description="frame bytes queued per connection")
    send_timeout_s: float = Field(
        default=30.0, gt=0, description="a client not reading this long is closed (WebSocket 1008; HTTP aborted)"
    )
    http_header_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="an HTTP request head not complete this long after the connection or the "
        "previous response: 408 and closed",
    )
    http_body_timeout_s: float = Field(
        default=60.0, gt=0, description="an HTTP request body not complete this long after its head: 408 and closed"
    )
    max_http_connections: int = Field(
        default=1024, ge=1, description="open HTTP connections per process (idle kept-alive ones too); 503 beyond"
    )
    idle_timeout_s: float = Field(default=600.0, gt=0, description="a connection with no frames and nothing in flight")
    tenant_max_concurrent: int = Field(default=0, ge=0, description="responses in flight per tenant (0: no limit)")
    tenant_turns_per_minute: int = Field(
        default=0, ge=0, description="responses started per tenant per minute (0: no limit)"
    )

    cache_max_responses: int = Field(default=256, ge=1)
    cache_max_bytes: int = Field(default=32 * 1024 * 1024, gt=0)
    cache_budget_bytes: int | None = Field(
        default=None,
        gt=0,
        description="memory all connection caches hold together; past it the oldest cached responses of the "
        "tenant holding the most are dropped (unset: a quarter of the memory limit, at least 64 MiB)",
    )
    tenant_cache_max_bytes: int = Field(
        default=0, ge=0, description="memory one tenant's connection caches hold together (0: the whole budget)"
    )
    store_max_responses: int = Field(default=10_000, ge=1)
    store_max_bytes: int = Field(default=512 * 1024 * 1024, gt=0)
    store_tenant_max_responses: int = Field(
        default=0, ge=0, description="stored responses per tenant, its own oldest dropped beyond (0: no quota)"
    )
    store_tenant_max_bytes: int = Field(
        default=0, ge=0, description="memory of one tenant's stored responses, its own oldest dropped beyond (0: none)"
    )
    store: str = Field(
        default="memory",
        description="'memory' (per process) or a Redis URL shared by workers and replicas, e.g. redis://127.0.0.1:6379/0",
    )
    store_ttl_s: float = Field(default=30 * 86400, gt=0, description="how long a stored response can be continued")
    store_max_entry_bytes: int = Field(default=32 * 1024 * 1024, ge=1024, description="largest stored response")
    store_timeout_s: float = Field(
        default=2.0, gt=0, description="Redis connect and command timeout: one store operation, retries included"
    )
    readyz_requires_store: bool = Field(
        default=False,
        description="/readyz answers 503 while the shared store does not answer (default: ready, the body says it)",
    )

    usage_ledger: Literal["auto", "sqlite", "redis", "off"] = Field(
        default="auto",
        description="where one usage record per response goes: 'auto' is the Redis stream when the store is Redis, "
        "else the SQLite file at usage_path",
    )
    usage_path: str = Field(
        default_factory=lambda: str(_state_dir() / "usage.db"),
        description="the SQLite ledger; its write-ahead journal lives beside it in '<usage_path>.journal/'",
    )
    usage_flush_interval_s: float = Field(default=0.2, gt=0, description="how often accepted records are written")
    usage_flush_records: int = Field(
        default=1000, ge=1, description="write accepted records at once when this many wait, without the interval"
    )

    checks_overlap: bool = Field(
        default=True,
        description="run checks that do not rewrite the input beside inference, holding the first token until the "
        "blocking ones pass; false: run every check before the response is created",
    )

    simulated_ttft_s: float = Field(default=0.0, ge=0)
    simulated_tokens_per_s: float = Field(default=0.0, ge=0)

    log_format: Literal["text", "json"] = Field(
        default="text", description="'json': one JSON object per log line (the per-response line included)"
    )
    otel: bool = Field(
        default=False,
        description="OpenTelemetry spans per turn and stage, exported over OTLP/HTTP (OTEL_* variables); "
        "needs the otel extra",
    )

    @field_validator("store")
    @classmethod
    def _known_store(cls, value: str) -> str:
        if value != "memory" and not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("store must be 'memory' or a redis://, rediss:// or unix:// URL")
        return value

    @field_validator("api_keys", "allowed_origins", "allowed_hosts", mode="before")
    @classmethod
    def _split_keys(cls, value: Any) -> Any:
        return split_list(value)


def split_list(value: Any) -> Any:
    """A JSON list or entries separated by commas or newlines (the environment); a list passes through."""
    if not isinstance(value, str):
        return value
    if value.lstrip().startswith("["):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return value  # reported by validation as "expected a valid list"
    return [entry.strip() for entry in value.replace(",", "\n").splitlines() if entry.strip()]


def _state_dir() -> Path:
    """`$XDG_STATE_HOME/responses-ws`, or `~/.local/state/responses-ws`."""
    return Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "responses-ws"
