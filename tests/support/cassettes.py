"""Replaying the cassettes of documented cloud API traffic (`tests/cassettes/`) with vcrpy.

Requests to loopback pass through, so a test can drive the shim with the SDK while the
shim's calls to the cloud API are answered from the cassette.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import vcr

CASSETTES = Path(__file__).parent.parent / "cassettes"


def replay(name: str, bodies: list[dict[str, Any]] | None = None) -> Any:
    """Replay one cassette (repeatedly); optionally capture the JSON bodies really sent."""

    def captured(r1: Any, r2: Any) -> None:
        if bodies is not None:
            bodies.append(json.loads(r1.body))

    recorder = vcr.VCR(record_mode="none", ignore_localhost=True)
    recorder.register_matcher("captured", captured)
    return recorder.use_cassette(
        str(CASSETTES / name), match_on=["method", "scheme", "host", "path", "captured"], allow_playback_repeats=True
    )
