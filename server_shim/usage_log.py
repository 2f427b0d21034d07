"""Usage sink: logs each finished response's token usage at DEBUG on `responses_ws.usage` (called only while
DEBUG is on for that logger: see `listening`)."""

from __future__ import annotations

import functools
import logging
from typing import Any

from .hookspecs import hookimpl

log = logging.getLogger("responses_ws.usage")


@hookimpl
def responses_ws_response_finished(response: dict[str, Any], transport: str) -> None:
    usage = response.get("usage") or {}
    log.debug(
        "%s %s %s model=%s input_tokens=%s cached_tokens=%s output_tokens=%s",
        transport,
        response["id"],
        response["status"],
        response["model"],
        usage.get("input_tokens"),
        (usage.get("input_tokens_details") or {}).get("cached_tokens"),
        usage.get("output_tokens"),
    )


responses_ws_response_finished.listening = functools.partial(  # type: ignore[attr-defined]
    log.isEnabledFor, logging.DEBUG
)  # asked every turn: the logger's own method, no function of ours around it
