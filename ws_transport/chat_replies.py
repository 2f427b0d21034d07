"""A chat call's answer as the HTTP endpoint would give it, from its turn on the session. No I/O.

The mapping itself (a `Response` as a `ChatCompletion`, events as chunks) is `chat_mapping.replies`,
shared with the server's `/v1/chat/completions`; here the answer is framed (SSE or JSON) and the
answered turn remembered for chaining.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from chat_mapping import ChunkStream, answer_message, completion_from_response

from .chat_completions import ChatBook, ChatPlan

Json = dict[str, Any]
TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})


@dataclass
class ChatReply:
    """How a chat call's turn answers the HTTP call that carried it, and how its answer is remembered.

    `http_body` is the call as Chat Completions over HTTP sends it (the fallback sends it unchanged).
    A completed turn is recorded in `book` with the chain the session recorded for it (`link`), so
    the next call that continues it sends only its new messages.
    """

    plan: ChatPlan
    book: ChatBook
    encode_call: Callable[[], bytes]
    """The call's own chat body, built only if it goes over HTTP (it holds the whole history)."""
    chunks: ChunkStream = field(default_factory=ChunkStream)
    _http_body: bytes | None = None

    @property
    def http_body(self) -> bytes:
        if self._http_body is None:
            self._http_body = self.encode_call()
        return self._http_body

    def sse(self, event: Json, link: Any) -> bytes:
        """The SSE bytes for one event: its chunks, and `[DONE]` after the last."""
        kind = event.get("type")
        if kind in ("response.completed", "response.incomplete"):
            self.remember(event["response"], link)
        out = b"".join(b"data: " + orjson.dumps(chunk) + b"\n\n" for chunk in self.chunks.feed(event))
        return out + b"data: [DONE]\n\n" if kind in TERMINAL else out

    def final(self, response: Json, link: Any) -> bytes:
        """The `ChatCompletion` JSON for the final response."""
        self.remember(response, link)
        return orjson.dumps(completion_from_response(response))

    def remember(self, response: Json, link: Any) -> None:
        if link is not None:
            self.book.record(self.plan, answer_message(response), response["id"], link)
