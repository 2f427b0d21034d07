"""Log set-up for `responses-ws`: readable lines, or one JSON object per line for log pipelines.

A record may carry structured facts in `extra={"fields": {...}}`: the JSON form puts them at the
top level of the object; the readable form shows them as `key=value` after the message.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import orjson

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
QUIET_LOGGERS = ("httpx2", "httpx", "httpcore")
"""Client libraries whose per-request INFO lines would repeat ours; shown only at DEBUG."""


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = getattr(record, "fields", None)
        if fields:
            line += " " + " ".join(f"{key}={_text(value)}" for key, value in fields.items())
        return line


class JsonFormatter(logging.Formatter):
    """`{"ts": ..., "level": ..., "logger": ..., "message": ..., **fields}`, one object per line."""

    def format(self, record: logging.LogRecord) -> str:
        body: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if fields:
            body.update(fields)
        if record.exc_info:
            body["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(body, default=str).decode()


def configure_logging(level: str, fmt: str) -> None:
    """Root handler on stderr for our loggers and uvicorn's (whose own handlers are turned off)."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.DEBUG if level == "DEBUG" else logging.WARNING)


def uvicorn_log_config() -> dict[str, Any]:
    """uvicorn logs through the root handler above, so its lines get the same format (JSON included)."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "loggers": {
            name: {"handlers": [], "propagate": True} for name in ("uvicorn", "uvicorn.error", "uvicorn.access")
        },
    }


def _text(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    text = str(value)
    return text if text and " " not in text else repr(text)
