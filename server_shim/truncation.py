"""`truncation: "auto"`: drop the oldest part of a conversation until it fits the deployment's context window.

The rule (the README's "Clients" section repeats it): the leading `developer` / `system` messages
stay (they are the agent's standing instructions); after them, the kept part starts at a user
message, so no tool output loses its call and no answer loses its question; the oldest turns go
first. The window must also hold the instructions, the tools and `max_output_tokens`; sizes are
estimated at four bytes a token. When even the newest user turn does not fit, or `truncation` is
`"disabled"` and the conversation does not fit, the request is refused with
`context_length_exceeded` (400) before anything runs. Only what is sent is truncated: the
conversation kept for the next turn stays whole, so a later turn can fit it anew.

"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from .errors import invalid
from .history import History, Item
from .requests import CreateRequest

BYTES_PER_TOKEN = 4


def item_nbytes(item: Item) -> int:
    return len(orjson.dumps(item)) + 1


def fit(items: Sequence[Item], budget_tokens: int, sizes: Sequence[int] | None = None) -> list[Item] | None:
    """The items to send within `budget_tokens`: all of them, a suffix after the pinned head, or None.

    `sizes` are the items' encoded sizes in bytes when the caller has them.
    """
    budget = budget_tokens * BYTES_PER_TOKEN
    sizes = [item_nbytes(item) for item in items] if sizes is None else sizes
    if sum(sizes) <= budget:
        return list(items)
    pinned = 0
    while pinned < len(items) and _is_instruction(items[pinned]):
        pinned += 1
    head = sum(sizes[:pinned])
    tail = sum(sizes[pinned:])
    for start in range(pinned, len(items)):
        if _is_user(items[start]) and head + tail <= budget:
            return [*items[:pinned], *items[start:]]
        tail -= sizes[start]
    return None


def _is_instruction(item: Item) -> bool:
    return item.get("type", "message") == "message" and item.get("role") in ("developer", "system")


def _is_user(item: Item) -> bool:
    return item.get("type", "message") == "message" and item.get("role") == "user"


def fit_history(
    history: History, context_window: int | None, request: CreateRequest, tools: list[dict[str, Any]] | None
) -> History:
    """The history to send within `context_window` tokens: this one, its tail, or `context_length_exceeded`.

    A tail has no cached renderings (its prefix changed): its backend renders it whole.
    """
    if context_window is None:
        return history
    fixed = len(request.instructions or "") + (len(orjson.dumps(tools)) if tools else 0)
    budget = context_window - (request.max_output_tokens or 0) - fixed // BYTES_PER_TOKEN
    if history.nbytes <= budget * BYTES_PER_TOKEN:
        return history
    items = history.items
    kept = fit(items, budget)
    auto = request.truncation == "auto"
    if kept is None or (not auto and len(kept) < len(items)):
        why = "even its newest turn does not fit" if auto else "set truncation to 'auto' to drop the oldest turns"
        raise invalid(
            "context_length_exceeded",
            f"The conversation is longer than this model's {context_window}-token context window; {why}.",
            "input",
        )
    return history if len(kept) == len(items) else History.from_batches([kept])
