"""`POST /v1/chat/completions`: Chat Completions over HTTP, answered by the same turns as `/v1/responses`.

A chat request becomes a Responses turn (`chat_requests.py`), one per choice (`n`), run through
the turn pipeline on the router and its backends; the answer comes back as the SDK's
`ChatCompletion` or a stream of `ChatCompletionChunk`s (`chat_mapping.replies`), with `stop`
applied here. This is the HTTP baseline a chat-completions framework is measured against, and
where `ws_transport.wrap()` sends the calls it cannot translate (`n > 1`, `stop`, `logit_bias`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from chat_mapping import ChunkStream, completion_from_response, error_chunk

from . import metrics, tracing
from .chat_requests import ChatRequest, parse_chat
from .errors import APIError, internal_error
from .events import new_id
from .http import complete_turns, error_response, json_body, json_response, log, read_body
from .tenants import scope_tenant
from .turn import Turn

if TYPE_CHECKING:
    from .app import ShimState

Json = dict[str, Any]
DONE = b"data: [DONE]\n\n"


async def create_chat_completion(request: Request) -> Response:
    shim: ShimState = request.app.state.shim
    refusal = shim.gate.admit_request()
    if refusal is not None:
        return error_response(refusal.api_error())
    try:
        raw = await read_body(request, shim.settings.max_body_bytes)
        chat = parse_chat(json_body(raw, shim), shim.env.limits)
        turns = [_turn(chat, shim, request) for _ in range(chat.choices)]
        for turn in turns:
            await turn.prepare()
    except APIError as error:
        return error_response(error)
    except Exception:
        log.exception("chat request refused by an unexpected error")
        return error_response(internal_error())
    tenant = turns[0].tenant
    refusal = shim.limiter.acquire(tenant, shim.clock())
    if refusal is not None:
        return error_response(refusal.api_error())
    if chat.stream:
        return StreamingResponse(_sse(chat, turns, shim), media_type="text/event-stream")
    outcome = await complete_turns(request, shim, turns)
    return outcome if isinstance(outcome, Response) else json_response(completion(chat, outcome))


def _turn(chat: ChatRequest, shim: ShimState, request: Request) -> Turn:
    turn = Turn(chat.create, shim.env, cache=None, transport="http", tenant=scope_tenant(request.scope))
    turn.result.trace_carrier = tracing.carrier(request.scope["headers"])
    return turn


def completion(chat: ChatRequest, responses: list[Json]) -> Json:
    """One `ChatCompletion` from each choice's response: choices in order, usage summed, `stop` applied."""
    answer = completion_from_response(responses[0])
    answer["id"] = new_id("chatcmpl")
    choices = []
    for index, response in enumerate(responses):
        choice = completion_from_response(response)["choices"][0]
        choice["index"] = index
        message = choice["message"]
        stop = StopText(chat.stops)
        if message["content"] is not None:
            message["content"] = stop.feed(message["content"]) + stop.flush()
        if stop.hit:
            message.pop("tool_calls", None)
            choice["finish_reason"] = "stop"
        choices.append(choice)
    answer["choices"] = choices
    answer["usage"] = _summed([completion_from_response(r)["usage"] for r in responses])
    return answer


async def _sse(chat: ChatRequest, turns: list[Turn], shim: ShimState) -> AsyncIterator[bytes]:
    """The choices' chunks as they come (interleaved when `n > 1`), then the usage chunk, then `[DONE]`."""
    completion_id = new_id("chatcmpl")
    queue: asyncio.Queue[Json | None] = asyncio.Queue()
    tasks = [asyncio.ensure_future(_choice(chat, turn, index, queue)) for index, turn in enumerate(turns)]
    usages: list[Json | None] = []
    usage_chunk: Json = {}
    running = len(tasks)
    try:
        while running:
            chunk = await queue.get()
            if chunk is None:
                running -= 1
                continue
            if "error" in chunk:  # the SDK raises `APIError` with its message; the stream ends here
                metrics.ERRORS.labels(chunk["error"].get("code") or "server_error").inc()
                yield _frame(chunk)
                break
            chunk["id"] = completion_id
            if not chunk["choices"]:  # a choice's usage: one chunk with the sum, at the end
                usages.append(chunk["usage"])
                usage_chunk = chunk
                continue
            yield _frame(chunk)
            await asyncio.sleep(0)  # let a dropped client be noticed (see http._sse)
        else:
            if chat.include_usage and usages:
                yield _frame({**usage_chunk, "usage": _summed(usages)})
        yield DONE
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        shim.limiter.release(turns[0].tenant)
        for turn in turns:
            shim.record_turn(turn)


async def _choice(chat: ChatRequest, turn: Turn, index: int, queue: asyncio.Queue[Json | None]) -> None:
    """One choice's turn as chunks on `queue`, then None."""
    chunks = ChunkStream(chat.include_usage, index=index)
    stop = StoppedChunks(StopText(chat.stops))
    try:
        async with contextlib.aclosing(turn.events()) as events:
            async for event in events:
                if event["type"] == "response.failed":
                    continue  # the `error` event after it carries the API error's code (`backend_error`, ...)
                for chunk in chunks.feed(event):
                    for out in stop.feed(chunk):
                        queue.put_nowait(out)
    except Exception:
        log.exception("chat turn failed unexpectedly")
        queue.put_nowait(error_chunk(internal_error().body()))
    finally:
        queue.put_nowait(None)


def _frame(chunk: Json) -> bytes:
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def _summed(usages: list[Json | None]) -> Json | None:
    """The usage of all choices: the prompt once, the completions added."""
    present = [u for u in usages if u]
    if not present:
        return None
    total = dict(present[0])
    for usage in present[1:]:
        total["completion_tokens"] += usage["completion_tokens"]
    total["total_tokens"] = total["prompt_tokens"] + total["completion_tokens"]
    return total


@dataclass
class StopText:
    """Cuts text at the first stop sequence, across deltas: the tail that may begin one is held back."""

    stops: tuple[str, ...]
    held: str = ""
    hit: bool = False

    def feed(self, text: str) -> str:
        if self.hit or not self.stops:
            return "" if self.hit else text
        text = self.held + text
        found = [i for i in (text.find(stop) for stop in self.stops) if i >= 0]
        if found:
            self.hit, self.held = True, ""
            return text[: min(found)]
        keep = max((k for stop in self.stops for k in range(1, len(stop)) if text.endswith(stop[:k])), default=0)
        self.held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]

    def flush(self) -> str:
        held, self.held = self.held, ""
        return held


@dataclass
class StoppedChunks:
    """A choice's chunks with `stop` applied: content cut at the stop sequence, nothing after it but the
    finishing chunk (`finish_reason: stop`), held-back text released before the finish."""

    stop: StopText

    def feed(self, chunk: Json) -> list[Json]:
        if not self.stop.stops or not chunk.get("choices"):
            return [chunk]
        choice = chunk["choices"][0]
        delta = choice["delta"]
        if choice["finish_reason"] is not None:
            tail = self.stop.flush()
            if self.stop.hit:
                choice["finish_reason"] = "stop"
            before = [_with_delta(chunk, {"content": tail})] if tail else []
            return [*before, chunk]
        if self.stop.hit:
            return []
        if delta.get("content"):
            delta["content"] = self.stop.feed(delta["content"])
            return [chunk] if delta["content"] else []
        return [chunk]


def _with_delta(chunk: Json, delta: Json) -> Json:
    choice = {**chunk["choices"][0], "delta": delta, "finish_reason": None}
    return {**chunk, "choices": [choice]}
