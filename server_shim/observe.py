"""What a finished turn leaves behind for operators: its metrics, and one INFO line per response.

The line (logger `responses_ws.responses`) carries the facts as structured fields, so the JSON log
format (`--log-format json`) gives one object per response; it never carries keys or content.
"""

from __future__ import annotations

import logging

from . import metrics, tracing
from .turn import Turn

log = logging.getLogger("responses_ws.responses")

ANONYMOUS = "-"


def turn_finished(turn: Turn) -> None:
    """Metrics and the log line for a turn that produced a response; refusals count only as errors."""
    result = turn.result
    response = result.response
    if response is None:
        return
    stages = result.stages
    deployment = result.deployment or ANONYMOUS
    usage = response.get("usage") or {}
    tokens = (  # input, cached, output
        int(usage.get("input_tokens") or 0),
        int((usage.get("input_tokens_details") or {}).get("cached_tokens") or 0),
        int(usage.get("output_tokens") or 0),
    )
    duration = stages.elapsed()
    ttft = stages.ttft_s
    metrics.observe_turn(
        turn.transport, deployment, response["status"], stages.intervals, tokens, ttft, duration, result.plugin_s
    )
    if not (log.isEnabledFor(logging.INFO) or tracing.enabled()):
        return  # nobody reads the fields: not built
    fields = {
        "tenant": turn.tenant or ANONYMOUS,
        "connection": turn.connection_id or ANONYMOUS,
        "response": response["id"],
        "transport": turn.transport,
        "status": response["status"],
        "model": response.get("model"),
        "deployment": deployment,
        "input_tokens": tokens[0],
        "cached_tokens": tokens[1],
        "output_tokens": tokens[2],
        "ttft_ms": None if ttft is None else round(ttft * 1000, 2),
        "duration_ms": round(duration * 1000, 2),
        "shim_ms": round(sum(stages.seconds.get(s, 0.0) for s in metrics.SHIM_STAGES) * 1000, 3),
    }
    log.info("response %s %s", response["id"], response["status"], extra={"fields": fields})
    tracing.record(turn, result.trace_carrier, {f"responses_ws.{key}": value for key, value in fields.items()})
