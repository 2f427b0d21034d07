"""Chat Completions <-> Responses mapping, shared by the client (`ws_transport`) and the server (`server_shim`).

Pure functions on JSON dicts, no I/O, importing neither side: `messages` maps a chat request's
messages and tools to Responses items and tools (raising `Unmapped` where no faithful mapping
exists), `replies` maps a Responses answer and its stream events back to `ChatCompletion` and
`ChatCompletionChunk` JSON. The client uses them to ride a WebSocket session, the server to
serve `POST /v1/chat/completions` from the same turn pipeline as `POST /v1/responses`.
"""

from .messages import Malformed, Unmapped, as_dict, message_items, messages_to_items, tool, tool_choice
from .replies import (
    ChunkStream,
    answer_message,
    chat_logprobs,
    chat_usage,
    completion_from_response,
    error_chunk,
    finish_reason,
)

__all__ = [
    "ChunkStream",
    "Malformed",
    "Unmapped",
    "answer_message",
    "as_dict",
    "chat_logprobs",
    "chat_usage",
    "completion_from_response",
    "error_chunk",
    "finish_reason",
    "message_items",
    "messages_to_items",
    "tool",
    "tool_choice",
]
