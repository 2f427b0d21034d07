"""Compaction items this shim makes: opaque to clients, expanded back into the items they stand for.

`encrypted_content` is `responses-ws.v1:`, the conversation's items as base64 JSON, `.` and an
HMAC-SHA256 (hex) over the tenant and that base64, keyed by the server's `compaction_secret`.
The content is signed, not encrypted: whoever holds the item can read it, but nobody without the
secret can forge one, and one tenant's item does not expand for another. What an item expands to
is held to the same limits as `input` itself (`limits.py`), since it becomes input.

The compaction output lists the user messages and then this item, and clients send it back as it
is: the item, with the user messages directly before it, is replaced by the whole conversation,
in its order. A compaction item from elsewhere (OpenAI's are encrypted) is left alone, and
dropped for chat backends.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from typing import Any

import orjson

from .errors import APIError, invalid
from .limits import RequestLimits, check_expanded_items, deeper_than

COMPACTION_PREFIX = "responses-ws.v1:"
PROCESS_KEY = secrets.token_bytes(32)
"""The key when no `compaction_secret` is set: items expand only in the process that made them."""


def compaction_key(secret: str | None) -> bytes:
    return secret.encode() if secret else PROCESS_KEY


def pack(items: list[dict[str, Any]], key: bytes, tenant: str | None) -> str:
    payload = base64.b64encode(orjson.dumps(items)).decode()
    return f"{COMPACTION_PREFIX}{payload}.{_mac(key, tenant, payload)}"


def expand_compactions(
    items: list[dict[str, Any]], key: bytes, tenant: str | None, limits: RequestLimits
) -> list[dict[str, Any]]:
    """Replace each compaction item this shim made by the items it stands for; others stay as they are."""
    for item in items:  # a loop, not `any(...)`: no generator made for each turn (~2,000 instructions)
        if _ours(item):
            break
    else:
        return items
    expanded: list[dict[str, Any]] = []
    for index, item in enumerate(items):
        if not _ours(item):
            expanded.append(item)
            continue
        inner = _unpack(item["encrypted_content"], key, tenant, index)
        if deeper_than(inner, limits.max_json_depth - 1):
            raise invalid(
                "invalid_value",
                f"The compaction item input[{index}] holds JSON nested deeper than {limits.max_json_depth} levels.",
                f"input[{index}]",
            )
        while expanded and expanded[-1].get("type", "message") == "message" and expanded[-1].get("role") == "user":
            expanded.pop()  # the user messages the compaction output lists before it: the item holds them too
        expanded.extend(inner)
    check_expanded_items(expanded, limits)
    return expanded


def _unpack(content: str, key: bytes, tenant: str | None, index: int) -> list[Any]:
    payload, _, mac = content[len(COMPACTION_PREFIX) :].rpartition(".")
    if not payload or not hmac.compare_digest(mac, _mac(key, tenant, payload)):
        raise _damaged(index, "was not made by this server for this caller, or was changed")
    try:
        inner = orjson.loads(base64.b64decode(payload, validate=True))
    except ValueError:
        raise _damaged(index, "is damaged") from None
    if not isinstance(inner, list):
        raise _damaged(index, "is damaged")
    return inner


def _mac(key: bytes, tenant: str | None, payload: str) -> str:
    return hmac.new(key, f"{tenant or ''}\0{payload}".encode(), hashlib.sha256).hexdigest()


def _ours(item: Any) -> bool:
    return (
        isinstance(item, dict)
        and item.get("type") == "compaction"
        and isinstance(item.get("encrypted_content"), str)
        and item["encrypted_content"].startswith(COMPACTION_PREFIX)
    )


def _damaged(index: int, why: str) -> APIError:
    return invalid(
        "invalid_encrypted_content", f"The compaction item input[{index}] {why}.", f"input[{index}].encrypted_content"
    )
