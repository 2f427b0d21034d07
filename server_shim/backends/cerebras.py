"""Cerebras inference, through its OpenAI-compatible HTTP API.

Why HTTP rather than `cerebras_cloud_sdk`: the SDK serializes the whole message list on every
call, while this backend sends the cached, already-encoded history as bytes (the point of the
shim); it also needs the rate-limit headers of the streaming answer, which the SDK's stream
object hides; and it shares the pooled client and stream parser with the other
OpenAI-compatible servers. The wire format is the same one the SDK speaks.

Cerebras' documented differences: it refuses `parallel_tool_calls`, `frequency_penalty`,
`presence_penalty`, `logit_bias` and `service_tier` (dropped here); `tool_choice` is `auto` or
`none` only (others become `auto`); usage comes in the last stream chunk; every answer carries
`x-ratelimit-*` headers, which the router reads to route elsewhere before a 429.
"""

from __future__ import annotations

from ..config import Quirks
from .openai_compatible import OpenAICompatibleBackend

CEREBRAS_URL = "https://api.cerebras.ai/v1"

CEREBRAS_QUIRKS = Quirks(
    drop_params=["parallel_tool_calls", "frequency_penalty", "presence_penalty", "logit_bias", "service_tier"],
    tool_choice=["auto", "none"],
)


class CerebrasBackend(OpenAICompatibleBackend):
    def __init__(self, base_url: str = CEREBRAS_URL, *, quirks: Quirks | None = None, **kwargs: object) -> None:
        super().__init__(base_url, quirks=quirks or CEREBRAS_QUIRKS, **kwargs)  # type: ignore[arg-type]
