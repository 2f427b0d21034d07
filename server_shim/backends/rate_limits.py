"""Rate-limit headers, read on every answer so a deployment is avoided before it answers 429.

Header names as Cerebras documents them (`x-ratelimit-{limit,remaining,reset}-{requests-day,
tokens-minute}`, reset in seconds), and OpenAI's (`x-ratelimit-remaining-{requests,tokens}`,
reset as a duration such as `6m0s` or `20ms`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass

_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m(?!s))?(?:(\d+(?:\.\d+)?)s)?(?:(\d+(?:\.\d+)?)ms)?$")


@dataclass
class RateLimitState:
    reserve_tokens: int = 2048
    remaining_tokens: int | None = None
    remaining_requests: int | None = None
    tokens_reset_at: float = 0.0
    requests_reset_at: float = 0.0

    def update(self, headers: Mapping[str, str]) -> None:
        now = time.monotonic()
        tokens = _first(headers, "x-ratelimit-remaining-tokens-minute", "x-ratelimit-remaining-tokens")
        if tokens is not None:
            self.remaining_tokens = int(float(tokens))
            reset = _seconds(_first(headers, "x-ratelimit-reset-tokens-minute", "x-ratelimit-reset-tokens"))
            self.tokens_reset_at = now + (reset if reset is not None else 60.0)
        requests = _first(headers, "x-ratelimit-remaining-requests-day", "x-ratelimit-remaining-requests")
        if requests is not None:
            self.remaining_requests = int(float(requests))
            reset = _seconds(_first(headers, "x-ratelimit-reset-requests-day", "x-ratelimit-reset-requests"))
            self.requests_reset_at = now + (reset if reset is not None else 60.0)

    def exhausted(self) -> bool:
        """True while the last answer said this minute's tokens or the day's requests are (nearly) gone."""
        now = time.monotonic()
        if (
            self.remaining_tokens is not None
            and self.remaining_tokens < self.reserve_tokens
            and now < self.tokens_reset_at
        ):
            return True
        return self.remaining_requests == 0 and now < self.requests_reset_at

    def retry_after(self, headers: Mapping[str, str]) -> float | None:
        """How long a 429 asks us to wait: `retry-after`, else the token window's reset."""
        return _seconds(headers.get("retry-after")) or _seconds(
            _first(headers, "x-ratelimit-reset-tokens-minute", "x-ratelimit-reset-tokens")
        )


def _first(headers: Mapping[str, str], *names: str) -> str | None:
    for name in names:
        value = headers.get(name)
        if value is not None:
            return value
    return None


def _seconds(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        match = _DURATION.match(value.strip())
        if not match or not any(match.groups()):
            return None
        hours, minutes, seconds, millis = (float(g) if g else 0.0 for g in match.groups())
        return hours * 3600 + minutes * 60 + seconds + millis / 1000
