"""Server settings: flags, environment (`RESPONSES_WS_*`) and an optional TOML file."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

SIMULATED = "simulated"


class Settings(BaseSettings):
    """Everything the shim needs to run; every field can be set by env var `RESPONSES_WS_<NAME>`."""

    model_config = SettingsConfigDict(env_prefix="RESPONSES_WS_", extra="forbid")

    host: str = "127.0.0.1"
    port: int = 8787
    backend: str = Field(
        default=SIMULATED,
        description="'simulated' or the base URL of an OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1",
    )
    backend_api_key: str | None = None
    backend_timeout_s: float = 300.0
    api_keys: list[str] = Field(default_factory=list, description="Bearer keys clients must present.")
    default_model: str = "simulated-1"

    max_frame_bytes: int = 4 * 1024 * 1024
    connection_max_age_s: float = 3600.0
    max_lanes: int = 32
    max_in_flight: int = 16
    drain_timeout_s: float = 30.0

    cache_max_responses: int = 256
    cache_max_bytes: int = 64 * 1024 * 1024
    store_max_responses: int = 10_000

    simulated_ttft_s: float = 0.0
    simulated_tokens_per_s: float = 0.0
