"""The turn sequence the overhead and peer suites share: ~4 KB of new user input per turn.

Fifty turns build ~200 KB of history. No tools, so the simulated backend answers each turn
with text of `max_output_tokens` tokens (1 here): generation costs next to nothing, and what
a turn costs beyond it is overhead.
"""

from __future__ import annotations

from typing import Any

from server_shim.demo import MODEL, as_input, tool_result

USER_BYTES = 4000
OUTPUT_TOKENS = 1

__all__ = ["MODEL", "OUTPUT_TOKENS", "USER_BYTES", "as_input", "assistant_message", "user_message"]


def user_message(turn: int, nbytes: int = USER_BYTES) -> dict[str, Any]:
    """Turn `turn` (0-based): a deterministic user message of about `nbytes` bytes."""
    return {"role": "user", "content": f"Turn {turn + 1}: read these records.\n" + tool_result(turn + 1, nbytes)}


def assistant_message(text: str) -> dict[str, Any]:
    """The reply as a Chat Completions history message."""
    return {"role": "assistant", "content": text}


def expected_backend_messages(turn: int) -> int:
    """Messages the backend must receive on turn `turn` (0-based) when the whole history is forwarded."""
    return 2 * turn + 1
