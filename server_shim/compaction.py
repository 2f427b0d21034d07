"""Compaction items this shim makes: opaque to clients, expanded back into the items they stand for.

`encrypted_content` is `responses-ws.v1:` and the conversation's items as base64 JSON. The
compaction output lists the user messages and then this item, and clients send it back as it
is: the item, with the user messages directly before it, is replaced by the whole conversation,
in its order. A compaction item from elsewhere (OpenAI's are encrypted) is left alone, and
dropped for chat backends.
"""

from __future__ import annotations

import base64
from typing import Any

import orjson

from .errors import invalid

COMPACTION_PREFIX = "responses-ws.v1:"


def pack(items: list[dict[str, Any]]) -> str:
    return COMPACTION_PREFIX + base64.b64encode(orjson.dumps(items)).decode()


def expand_compactions(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Replace each compaction item this shim made by the items it stands for; others stay as they are."""
    if not any(_ours(item) for item in items):
        return items
    expanded: list[dict[str, Any]] = []
    for index, item in enumerate(items):
        if not _ours(item):
            expanded.append(item)
            continue
        try:
            inner = orjson.loads(base64.b64decode(item["encrypted_content"][len(COMPACTION_PREFIX) :], validate=True))
        except ValueError:
            raise _damaged(index) from None
        if not isinstance(inner, list):
            raise _damaged(index)
        while expanded and expanded[-1].get("type", "message") == "message" and expanded[-1].get("role") == "user":
            expanded.pop()  # the user messages the compaction output lists before it: the item holds them too
        expanded.extend(inner)
    return expanded


def _ours(item: Any) -> bool:
    return (
        isinstance(item, dict)
        and item.get("type") == "compaction"
        and isinstance(item.get("encrypted_content"), str)
        and item["encrypted_content"].startswith(COMPACTION_PREFIX)
    )


def _damaged(index: int) -> Exception:
    return invalid("invalid_encrypted_content", "This compaction item is damaged.", f"input[{index}].encrypted_content")
