"""Which history each response answered: the rule that decides when a request may continue a response."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Sequence

from langchain_core.messages import AIMessage, BaseMessage


def split_at_last_response(messages: Sequence[BaseMessage]) -> tuple[Sequence[BaseMessage], str | None]:
    """The messages after the newest `AIMessage` with a Responses id, and that id (None: no such message).

    Scans backwards and stops at that message, so its cost is the number of new messages.
    """
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if isinstance(message, AIMessage):
            response_id = message.response_metadata.get("id")
            if isinstance(response_id, str) and response_id.startswith("resp_"):
                return messages[index + 1 :], response_id
    return messages, None


class Lineage:
    """Which history each response answered, so a request continues a response only from that same history.

    The server's chain under a response id is the history that response answered plus its output.
    If the messages before that response are no longer that history (a summarization or trimming
    middleware rewrote them, a dynamic system prompt changed, the app branched), continuing the
    chain would diverge from what HTTP sends, so the request goes in full instead. An id this
    model never produced (another model, another process) also goes in full.

    The response's own message must also still say what the server has (its text and tool calls):
    an answer a middleware redacted or the app corrected goes in full too.

    The check costs an identity or message-id compare per message; content is compared only for a
    message that is neither the same object nor carries the same id. Only the newest response of
    each chain is kept, at most `capacity` chains (least recently used dropped first).
    """

    def __init__(self, capacity: int = 1024) -> None:
        self.capacity = capacity
        self._histories: OrderedDict[str, tuple[tuple[BaseMessage, ...], BaseMessage]] = OrderedDict()
        self._lock = threading.Lock()

    def record(self, response_id: str, history: Sequence[BaseMessage], answer: BaseMessage) -> None:
        """Note the history `response_id` answered, and its answer (streamed: all its chunks added up)."""
        with self._lock:
            if response_id in self._histories:
                return
            _, previous_id = split_at_last_response(history)
            if previous_id is not None:
                self._histories.pop(previous_id, None)
            self._histories[response_id] = (tuple(history), answer)
            while len(self._histories) > self.capacity:
                self._histories.popitem(last=False)

    def continues(self, response_id: str, history: Sequence[BaseMessage], answer: BaseMessage) -> bool:
        """Whether `history` is what the response answered and `answer` (its message) is still its answer."""
        with self._lock:
            known = self._histories.get(response_id)
            if known is not None:
                self._histories.move_to_end(response_id)
        if known is None or len(known[0]) != len(history) or _said(known[1]) != _said(answer):
            return False
        return all(
            a is b or (a.id is not None and a.id == b.id) or a == b for a, b in zip(known[0], history, strict=True)
        )


def _said(message: BaseMessage) -> tuple[str, tuple[tuple[str, str], ...]]:
    """What an answer says, as the server holds it: its text and its tool calls."""
    calls = getattr(message, "tool_calls", None) or []
    return str(message.text), tuple((call["name"], json.dumps(call["args"], sort_keys=True)) for call in calls)
