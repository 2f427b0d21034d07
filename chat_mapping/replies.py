"""Responses answers as Chat Completions answers: a `Response` as a `ChatCompletion`, events as chunks. No I/O.

Both work on JSON dicts (the client's transport frames them as the HTTP endpoint would and the
SDK parses them into its own `ChatCompletion` / `ChatCompletionChunk`; the server sends them
from `POST /v1/chat/completions`), so a caller cannot tell the answer rode a WebSocket or a
Responses turn: the same content, tool calls, finish reason and usage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Json = dict[str, Any]


def finish_reason(response: Json) -> str:
    """`tool_calls` when the model called a function; `length`/`content_filter` when it was cut off."""
    if any(item.get("type") == "function_call" for item in response.get("output") or ()):
        return "tool_calls"
    details = response.get("incomplete_details") or {}
    if response.get("status") == "incomplete":
        return "content_filter" if details.get("reason") == "content_filter" else "length"
    return "stop"


def answer_message(response: Json) -> Json:
    """The assistant message of a completed response, as `ChatCompletionMessage` JSON."""
    texts: list[str] = []
    refusals: list[str] = []
    calls: list[Json] = []
    for item in response.get("output") or ():
        kind = item.get("type")
        if kind == "message":
            for part in item.get("content") or ():
                if part.get("type") == "output_text":
                    texts.append(part.get("text", ""))
                elif part.get("type") == "refusal":
                    refusals.append(part.get("refusal", ""))
        elif kind == "function_call":
            function = {"name": item["name"], "arguments": item.get("arguments", "")}
            calls.append({"id": item["call_id"], "type": "function", "function": function})
    message: Json = {
        "role": "assistant",
        "content": "".join(texts) if texts else None,
        "refusal": "".join(refusals) if refusals else None,
    }
    if calls:
        message["tool_calls"] = calls
    return message


def chat_logprobs(logprobs: list[Json] | None) -> Json | None:
    """A choice's `logprobs` from the output text's: the entries have the same fields in both APIs
    (token, logprob, bytes, top_logprobs); None when there are none (not asked for, or not given)."""
    return {"content": logprobs, "refusal": None} if logprobs else None


def _text_logprobs(response: Json) -> list[Json]:
    return [
        logprob
        for item in response.get("output") or ()
        if item.get("type") == "message"
        for part in item.get("content") or ()
        if part.get("type") == "output_text"
        for logprob in part.get("logprobs") or ()
    ]


def chat_usage(usage: Json | None) -> Json | None:
    """`CompletionUsage` JSON from the Responses usage."""
    if not usage:
        return None
    input_details = usage.get("input_tokens_details") or {}
    output_details = usage.get("output_tokens_details") or {}
    return {
        "prompt_tokens": usage.get("input_tokens", 0),
        "completion_tokens": usage.get("output_tokens", 0),
        "total_tokens": usage.get("total_tokens", usage.get("input_tokens", 0) + usage.get("output_tokens", 0)),
        "prompt_tokens_details": {"cached_tokens": input_details.get("cached_tokens", 0)},
        "completion_tokens_details": {"reasoning_tokens": output_details.get("reasoning_tokens", 0)},
    }


def completion_from_response(response: Json) -> Json:
    """`ChatCompletion` JSON for a completed (or incomplete) response."""
    completion: Json = {
        "id": response["id"],
        "object": "chat.completion",
        "created": int(response.get("created_at") or 0),
        "model": response.get("model", ""),
        "choices": [
            {
                "index": 0,
                "message": answer_message(response),
                "finish_reason": finish_reason(response),
                "logprobs": chat_logprobs(_text_logprobs(response)),
            }
        ],
        "usage": chat_usage(response.get("usage")),
    }
    if response.get("service_tier") is not None:
        completion["service_tier"] = response["service_tier"]
    return completion


def error_chunk(error: Json | None) -> Json:
    """What a chat stream carries for a failure: the SDK raises `APIError` with this message."""
    error = dict(error or {})
    error.setdefault("message", "The response failed.")
    error.setdefault("type", "server_error")
    return {"error": error}


@dataclass
class ChunkStream:
    """Responses stream events in, `ChatCompletionChunk` JSON out, in order. One per streamed call.

    The first chunk carries `role: assistant`; text, refusal and argument deltas follow; the last
    choice chunk has an empty delta and the finish reason; with `include_usage`, every chunk has
    `usage: null` and a final chunk with no choices carries the usage (as the chat stream does).
    """

    include_usage: bool = False
    index: int = 0
    """The choice this stream is (a request with `n > 1` runs one per choice)."""
    head: Json = field(default_factory=dict)
    started: bool = False
    failed: bool = False
    tool_index: dict[int, int] = field(default_factory=dict)

    def feed(self, event: Json) -> list[Json]:
        kind = event.get("type")
        if kind == "response.created":
            self._start(event["response"])
            return [self._chunk({"role": "assistant", "content": "", "refusal": None})]
        if kind == "response.output_text.delta":
            return [self._chunk({"content": event.get("delta", "")}, logprobs=event.get("logprobs"))]
        if kind == "response.refusal.delta":
            return [self._chunk({"refusal": event.get("delta", "")})]
        if kind == "response.output_item.added" and event["item"].get("type") == "function_call":
            return [self._call_started(event["output_index"], event["item"])]
        if kind == "response.function_call_arguments.delta" and event.get("output_index") in self.tool_index:
            call = {"index": self.tool_index[event["output_index"]], "function": {"arguments": event.get("delta", "")}}
            return [self._chunk({"tool_calls": [call]})]
        if kind in ("response.completed", "response.incomplete"):
            return self.finish(event["response"])
        if kind == "response.failed":
            self.failed = True
            return [error_chunk((event.get("response") or {}).get("error"))]
        if kind == "error" and not self.failed:
            self.failed = True
            return [error_chunk(event.get("error") or event)]
        return []

    def _start(self, response: Json) -> None:
        self.started = True
        self.head = {
            "id": response["id"],
            "object": "chat.completion.chunk",
            "created": int(response.get("created_at") or 0),
            "model": response.get("model", ""),
        }

    def _call_started(self, output_index: int, item: Json) -> Json:
        index = self.tool_index[output_index] = len(self.tool_index)
        function = {"name": item["name"], "arguments": item.get("arguments") or ""}
        return self._chunk(
            {"tool_calls": [{"index": index, "id": item["call_id"], "type": "function", "function": function}]}
        )

    def finish(self, response: Json | None, reason: str | None = None) -> list[Json]:
        """The last chunks: an empty delta with `reason` (by default what `response` ended with), then,
        with `include_usage`, the usage chunk. A server that ends a choice early (a stop sequence) calls it."""
        response = response or {}
        chunks = [self._chunk({}, finish=reason or finish_reason(response))]
        if self.include_usage:
            chunks.append({**self.head, "choices": [], "usage": chat_usage(response.get("usage"))})
        return chunks

    def _chunk(self, delta: Json, finish: str | None = None, logprobs: list[Json] | None = None) -> Json:
        choice = {"index": self.index, "delta": delta, "finish_reason": finish, "logprobs": chat_logprobs(logprobs)}
        chunk: Json = {**self.head, "choices": [choice]}
        if self.include_usage:
            chunk["usage"] = None
        return chunk
