"""`POST /v1/chat/completions`: Chat Completions over HTTP, answered by the same turns as `/v1/responses`.

A chat request becomes a Responses turn (`chat_requests.py`), one per choice (`n`), run through
the turn pipeline on the router and its backends; the answer comes back as the SDK's
`ChatCompletion` or a stream of `ChatCompletionChunk`s (`chat_mapping.replies`), with `stop`
applied here: a choice ends (its turn stopped, the backend request with it) as soon as its text
reaches a stop sequence. This is the HTTP baseline a chat-completions framework is measured
against, and where `ws_transport.wrap()` sends the calls it cannot translate (`n > 1`, `stop`, `logit_bias`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from chat_mapping import ChunkStream, completion_from_response, error_chunk

from . import metrics, tracing
from .chat_requests import ChatRequest, parse_chat
from .errors import APIError, internal_error, invalid
from .events import new_id
from .http import complete_turns, error_response, json_body, json_response, log, read_body
from .tenants import scope_tenant
from .turn import Turn

if TYPE_CHECKING:
    from .app import ShimState

Json = dict[str, Any]
T = TypeVar("T")
DONE = b"data: [DONE]\n\n"


def chat_completion_id() -> str:
    """`chatcmpl-` and 128 random bits, the prefix OpenAI's chat completion ids have (Responses ids use `_`)."""
    return "chatcmpl-" + new_id("").removeprefix("_")


async def create_chat_completion(request: Request) -> Response:
    shim: ShimState = request.app.state.shim
    refusal = shim.gate.admit_request()
    if refusal is not None:
        return error_response(refusal.api_error())
    try:
        raw = await read_body(request, shim.settings.max_body_bytes)
        body, _ = await json_body(raw, shim)  # the chat fields nest deeper as items: their depth is walked
        chat = parse_chat(body, shim.env.limits)
    except APIError as error:
        return error_response(error)
    turns = [_turn(chat, shim, request, index) for index in range(chat.choices)]
    admitted = _admit(shim, turns[0].tenant, len(turns))
    if admitted is not None:
        return error_response(admitted)
    try:
        for turn in turns:
            await turn.prepare()
    except Exception as exc:
        shim.limiter.release(turns[0].tenant, len(turns))
        if isinstance(exc, APIError):
            return error_response(chat.chat_error(exc))
        log.exception("chat request refused by an unexpected error")
        return error_response(internal_error())
    if chat.stream:
        return StreamingResponse(_sse(chat, turns, shim), media_type="text/event-stream")
    outcome = await complete_turns(request, shim, turns, lambda turn: _complete_choice(turn, chat.stops))
    return outcome if isinstance(outcome, Response) else json_response(completion(chat, outcome))


def _admit(shim: ShimState, tenant: str | None, choices: int) -> APIError | None:
    """The tenant's limits for `choices` responses (one per choice), checked before any is prepared."""
    limit = shim.limiter.never_admits(choices)
    if limit is not None:
        message = f"'n' ({choices}) is over this API key's limit of {limit} responses at once or per minute."
        return invalid("invalid_value", message, "n")
    refusal = shim.limiter.acquire(tenant, shim.clock(), choices)
    return refusal.api_error() if refusal is not None else None


def _turn(chat: ChatRequest, shim: ShimState, request: Request, index: int) -> Turn:
    turn = Turn(chat.choice(index), shim.env, cache=None, transport="http", tenant=scope_tenant(request.scope))
    turn.result.trace_carrier = tracing.carrier(request.scope["headers"])
    return turn


async def _complete_choice(turn: Turn, stops: tuple[str, ...]) -> Json | None:
    """A non-streamed choice to its end, or to its stop sequence: then its turn is stopped (the backend
    stops generating) and the response, `completed` with the usage of what was generated, stands."""
    stop = StopText(stops)
    terminal: Json | None = None
    async with contextlib.aclosing(turn.events()) as events:
        async for batch in events:
            for event in batch:
                if event["type"] in ("response.completed", "response.incomplete"):
                    terminal = event["response"]
                elif stops and event["type"] == "response.output_text.delta":
                    stop.feed(event["delta"])
                    if stop.hit:
                        break
            if stop.hit:
                turn.ends_at_stop_sequence = True
                break
    return turn.result.response if stop.hit else terminal


def completion(chat: ChatRequest, responses: list[Json]) -> Json:
    """One `ChatCompletion` from each choice's response: choices in order, usage summed, `stop` applied."""
    answer = completion_from_response(responses[0])
    answer["id"] = chat_completion_id()
    choices = []
    ids = DistinctCallIds()
    for index, response in enumerate(responses):
        choice = completion_from_response(response)["choices"][0]
        choice["index"] = index
        message = choice["message"]
        ids.fix(index, message.get("tool_calls") or [])
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
    """The choices' chunks as they come (interleaved when `n > 1`), then the usage chunk, then `[DONE]`.

    Whatever ends the stream (the last choice, an error, the client going away), the tenant's slots
    are released first, without awaiting anything: a dropped client's stream is cancelled here, and
    a cancelled await would skip what follows it."""
    completion_id = chat_completion_id()
    choices = [_choice(chat, turn, index, shim) for index, turn in enumerate(turns)]
    usages: list[Json | None] = []
    usage_chunk: Json = {}
    ids = DistinctCallIds()
    try:
        async with contextlib.aclosing(interleaved(choices)) as chunks:
            async for chunk in chunks:
                if "error" in chunk:  # the SDK raises `APIError` with its message; the stream ends here
                    metrics.ERRORS.labels(chunk["error"].get("code") or "server_error").inc()
                    yield _frame(chunk)
                    break
                chunk["id"] = completion_id
                if not chunk["choices"]:  # a choice's usage: one chunk with the sum, at the end
                    usages.append(chunk["usage"])
                    usage_chunk = chunk
                    continue
                choice = chunk["choices"][0]
                ids.fix(choice["index"], choice["delta"].get("tool_calls") or [])
                yield _frame(chunk)
                await asyncio.sleep(0)  # let a dropped client be noticed (see http._sse)
            else:
                if chat.include_usage and usages:
                    yield _frame({**usage_chunk, "usage": _summed(usages)})
        yield DONE
    finally:
        shim.limiter.release(turns[0].tenant, len(turns))


async def interleaved(sources: list[AsyncGenerator[T, None]]) -> AsyncGenerator[T, None]:
    """The items of all `sources` as they come, each source pulled only as fast as the caller takes
    items: the queue between them holds one item per source, so a client that stops reading stops
    its choices' turns (and their backends) instead of filling the server's memory. Closing this
    cancels the sources, which close themselves in their own tasks (nothing is awaited here)."""
    queue: asyncio.Queue[tuple[T] | None] = asyncio.Queue(maxsize=len(sources))
    pumps = [asyncio.ensure_future(_pump(source, queue)) for source in sources]
    running = len(pumps)
    try:
        while running:
            item = await queue.get()
            if item is None:
                running -= 1
            else:
                yield item[0]
    finally:
        for pump in pumps:
            pump.cancel()


async def _pump(source: AsyncGenerator[T, None], queue: asyncio.Queue[tuple[T] | None]) -> None:
    async with contextlib.aclosing(source):
        async for item in source:
            await queue.put((item,))
    await queue.put(None)


async def _choice(chat: ChatRequest, turn: Turn, index: int, shim: ShimState) -> AsyncGenerator[Json, None]:
    """One choice's turn as chunks, ended (its turn stopped) at a stop sequence; recorded however it ends."""
    chunks = ChunkStream(chat.include_usage, index=index)
    stopped = StoppedChunks(StopText(chat.stops))
    try:
        async with contextlib.aclosing(turn.events()) as events:
            async for batch in events:
                for event in batch:
                    if event["type"] == "response.failed":
                        continue  # the `error` event after it carries the API error's code (`backend_error`, ...)
                    for chunk in chunks.feed(event):
                        for out in stopped.feed(chunk):
                            yield out
                    if stopped.stop.hit:
                        break
                if stopped.stop.hit:
                    turn.ends_at_stop_sequence = True
                    break
        if stopped.stop.hit:  # the turn is stopped now, `completed`: its usage is what was generated
            for out in chunks.finish(turn.result.response, "stop"):
                yield out
    except Exception:
        log.exception("chat turn failed unexpectedly")
        yield error_chunk(internal_error().body())
    finally:
        shim.record_turn(turn)


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
class DistinctCallIds:
    """Tool-call ids unique across a request's choices. A deterministic backend (the simulator) gives
    every choice the same id for the same call, and a client answering calls of two choices could
    not tell them apart: an id an earlier choice has gets `_<choice index>` appended."""

    owners: dict[str, int] = field(default_factory=dict)

    def fix(self, index: int, calls: list[Json]) -> None:
        for call in calls:
            if call.get("id") is None:  # a streamed call's later chunks carry only its arguments
                continue
            if self.owners.setdefault(call["id"], index) != index:
                call["id"] = f"{call['id']}_{index}"


@dataclass
class StopText:
    """Cuts text at the first stop sequence to be completed, across deltas: the tail that may begin one
    is held back. "First completed" (of two that end together, the one that began first) makes the cut
    the same however the text is split into deltas, as if it came one character at a time.

    Linear in the text fed: only the last `len(stop) - 1` characters can begin a match, so a
    delta is searched together with at most that held tail (stop sequences are bounded in length,
    `chat_requests.MAX_STOP_CHARS`)."""

    stops: tuple[str, ...]
    held: str = ""
    hit: bool = False

    def feed(self, text: str) -> str:
        if self.hit or not self.stops:
            return "" if self.hit else text
        text = self.held + text
        found = [(at + len(stop), at) for stop in self.stops if (at := text.find(stop)) >= 0]
        if found:
            self.hit, self.held = True, ""
            return text[: min(found)[1]]
        keep = max(_partial(text, stop) for stop in self.stops)
        self.held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]

    def flush(self) -> str:
        held, self.held = self.held, ""
        return held


def _partial(text: str, stop: str) -> int:
    """The length of the longest end of `text` that begins `stop` (shorter than it), found by `str.find`
    of its first character in the last `len(stop) - 1` characters."""
    at = text.find(stop[0], max(0, len(text) - len(stop) + 1))
    while at >= 0:
        if stop.startswith(text[at:]):
            return len(text) - at
        at = text.find(stop[0], at + 1)
    return 0


@dataclass
class StoppedChunks:
    """A choice's chunks with `stop` applied: content cut at the stop sequence (the caller ends the
    choice there), held-back text released before the finishing chunk."""

    stop: StopText

    def feed(self, chunk: Json) -> list[Json]:
        if not self.stop.stops or not chunk.get("choices"):
            return [chunk]
        choice = chunk["choices"][0]
        delta = choice["delta"]
        if choice["finish_reason"] is not None:
            tail = self.stop.flush()
            before = [_with_delta(chunk, {"content": tail})] if tail else []
            return [*before, chunk]
        if delta.get("content"):
            delta["content"] = self.stop.feed(delta["content"])
            return [chunk] if delta["content"] else []
        return [chunk]


def _with_delta(chunk: Json, delta: Json) -> Json:
    choice = {**chunk["choices"][0], "delta": delta, "finish_reason": None}
    return {**chunk, "choices": [choice]}
