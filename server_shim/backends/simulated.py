"""The simulated backend: deterministic, paced, and labelled as a simulator wherever it shows.

Contract (also in the README): it streams a deterministic text reply of
`max_output_tokens` tokens (default 16); if the newest user message or tool output has a line
`call NAME {json}` and NAME is a function tool of the request (a namespace member by
`namespace__name`), it emits that function call with those arguments instead; a line
`custom NAME text...` calls the custom tool NAME with everything after the name, the
following lines included, as its input. When `tool_choice` forces a tool (or is
`required`) and no directive names one, it calls the forced (or first) tool with the
simplest arguments its schema accepts. When the newest input item is a tool output, it
replies with text that contains that output. With `text.format` json_schema it answers
with one JSON instance of the schema (deterministic, valid against it); with
json_object, `{}`-shaped JSON.

Guard mode (`guard = {category: [words]}`, e.g. `simulated_guard = { S1 = ["attack"] }` on a
simulated deployment): it answers as Llama Guard does, deterministically: `unsafe` and the
categories (in the order given) whose words appear, as whole words in any case, in the newest
user message, or `safe` when none does. The built-in `guard` check uses it in tests.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import zlib
from collections.abc import AsyncGenerator, Iterator
from itertools import chain, cycle, islice
from typing import Any

from .base import BackendRequest, Delta, Finish, TextDelta, ToolCallDelta, Usage, encode, estimate_tokens
from .chat_convert import ChatPrompt, Message, chat_prompt, chat_tools_and_choice, render_items, renders
from .json_instance import json_text

DEFAULT_TOKENS = 16
MAX_OUTPUT_TOKENS = 32_768
"""The simulator never streams more, whatever `max_output_tokens` asks (then it finishes with 'length')."""
CHARS_PER_TOKEN = 8
"""Structured output and call arguments stream in pieces of this many characters, one token each."""
WORDS = ("simulated ", "reply ", "from ", "the ", "responses-ws ", "simulator ", "token ", "stream ")
WORD_DELTAS = tuple(TextDelta(word) for word in WORDS)
"""The text reply's tokens, in turn: a delta is immutable, so every reply streams these same objects."""
STOPPED, LENGTH, CALLED = Finish("stop"), Finish("length"), Finish("tool_calls")
YIELD_EVERY = 64
"""Unpaced, the simulator gives the loop a turn before every 64th token: a shorter reply never waits."""
READY_WORDS = tuple(islice(cycle(WORD_DELTAS), YIELD_EVERY - 1))
"""The text reply's tokens for any reply that never waits (a prefix of them)."""


class SimulatedBackend:
    name = "simulated"

    def __init__(
        self,
        *,
        ttft_s: float = 0.0,
        tokens_per_s: float = 0.0,
        model: str = "simulated-1",
        guard: dict[str, list[str]] | None = None,
    ) -> None:
        self.ttft_s = ttft_s
        self.tokens_per_s = tokens_per_s
        self.model = model
        self.guard = {
            c: re.compile("|".join(rf"\b{re.escape(w)}\b" for w in words), re.I)
            for c, words in (guard or {}).items()
            if words
        }

    async def models(self) -> list[str]:
        return [self.model]

    async def aclose(self) -> None:
        return None

    async def stream(self, request: BackendRequest) -> AsyncGenerator[Delta, None]:
        prompt, pieces, finish = self._reply(request)
        pacer = _Pacer(self.ttft_s, self.tokens_per_s) if self.ttft_s > 0 or self.tokens_per_s > 0 else None
        output_tokens = 0
        for piece in pieces:
            if pacer is not None:
                await pacer.wait(output_tokens)
            elif output_tokens % YIELD_EVERY == YIELD_EVERY - 1:
                await asyncio.sleep(0)  # unpaced: other connections still get the loop every 64 tokens
            output_tokens += 1
            yield piece
        yield _usage(request, prompt, output_tokens)
        yield finish

    def ready(self, request: BackendRequest) -> list[Delta] | None:
        """The whole reply, as `stream` yields it, when `stream` would never wait (unpaced, and fewer pieces
        than `YIELD_EVERY`); None otherwise. The router then hands the deltas on without a generator to
        drive or a deadline to watch (`RepliesAtOnce`): nothing in between could wait for anything. A subclass
        that streams otherwise (overrides `stream`) gets None: its own `stream` is what it yields."""
        if self.ttft_s > 0 or self.tokens_per_s > 0 or type(self).stream is not SimulatedBackend.stream:
            return None
        prompt, pieces, finish = self._reply(request)
        if not isinstance(pieces, tuple):
            return None
        return [*pieces, _usage(request, prompt, len(pieces)), finish]

    def _reply(self, request: BackendRequest) -> tuple[ChatPrompt, tuple[Delta, ...] | Iterator[Delta], Finish]:
        """The prompt as a chat backend reads it, the reply's pieces (a tuple when fewer than `YIELD_EVERY`,
        else made as they are taken) and how it finishes."""
        prompt = chat_prompt(request.history)  # the simulator reads the conversation as a chat backend does
        if self.guard:
            return prompt, (TextDelta(self._guard_verdict(prompt)),), STOPPED
        chat = request.chat_tools
        if chat is not None and chat.tools is None and request.tool_choice is None:  # most turns: nothing to call
            last, call = prompt.last_tool_message, None  # only a tool's echo reads the newest message
        else:
            last = prompt.last_message  # decoded once: a directive, a forced call and a tool's echo all read it
            call = _requested_call(request, last)
        if call:
            arguments, cut = _bounded(call[1], _budget(request) * CHARS_PER_TOKEN)
            return prompt, _call_pieces((call[0], arguments), prompt.count), LENGTH if cut else CALLED
        response_format = request.options.get("response_format")
        structured = None if response_format is None else _structured(response_format)
        if structured is None:
            asked = request.max_output_tokens
            cut = asked is not None and asked > MAX_OUTPUT_TOKENS
            return prompt, _text_pieces(asked, last), LENGTH if cut else STOPPED
        text, cut = _bounded(structured, _budget(request) * CHARS_PER_TOKEN)
        return prompt, _chunks(text), LENGTH if cut else STOPPED

    def _guard_verdict(self, prompt: ChatPrompt) -> str:
        users = [m for m in prompt.messages if m["role"] == "user"]
        text = _text(users[-1]["content"]) if users else ""
        hit = [category for category, pattern in self.guard.items() if pattern.search(text)]
        return f"unsafe\n{','.join(hit)}" if hit else "safe"


class _Pacer:
    """Releases token i at ttft + i/tps after the start; bursts when the loop falls behind."""

    def __init__(self, ttft_s: float, tokens_per_s: float) -> None:
        self.start = time.perf_counter()
        self.ttft_s = ttft_s
        self.interval = 1.0 / tokens_per_s if tokens_per_s > 0 else 0.0

    async def wait(self, index: int) -> None:
        due = self.start + self.ttft_s + index * self.interval
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        elif index % 64 == 63:
            await asyncio.sleep(0)


def _usage(request: BackendRequest, prompt: ChatPrompt, output_tokens: int) -> Usage:
    """Estimated from the prompt's JSON bytes; what the prompt had before this turn's input counts as cached
    (never more than the input). Conditionals, not `min`, and `Usage` by position: on 3.11 `min` parses its
    arguments as keywords and a keyword costs the call a dict (~1k instructions each)."""
    input_tokens = estimate_tokens(prompt.nbytes + len(request.instructions or ""))
    cached_nbytes = prompt.nbytes - _new_nbytes(request, prompt)
    cached = estimate_tokens(cached_nbytes) if cached_nbytes > 0 else 0
    return Usage(input_tokens, output_tokens, cached if cached < input_tokens else input_tokens, True)


def _new_nbytes(request: BackendRequest, prompt: ChatPrompt) -> int:
    """The JSON bytes of this turn's input as chat messages: what the prompt adds to the previous turn's.

    When the input is the history's newest batch (every chained turn), the rendering's newest
    segment already holds it (a batch renders into one segment, or none when nothing in it is a
    chat message), so nothing is rendered again; otherwise the new items are rendered on their own.
    """
    history = request.history
    if history.own and history.count - len(history.own) == request.previous_items:
        return prompt.own_nbytes if renders(history.own) else 0
    return sum(len(encode(m)) + 1 for m in render_items(request.new_items))


def _budget(request: BackendRequest) -> int:
    """The output tokens this response may have: `max_output_tokens`, never more than `MAX_OUTPUT_TOKENS`."""
    asked = request.max_output_tokens
    return MAX_OUTPUT_TOKENS if asked is None else min(asked, MAX_OUTPUT_TOKENS)


def _bounded(chunks: Iterator[str], limit: int) -> tuple[str, bool]:
    """At most `limit` characters of lazily generated text, and whether there was more (never generated)."""
    parts: list[str] = []
    size = 0
    for chunk in chunks:
        if size + len(chunk) > limit:
            parts.append(chunk[: limit - size])
            return "".join(parts), True
        parts.append(chunk)
        size += len(chunk)
    return "".join(parts), False


def _text_pieces(asked: int | None, last: Message | None) -> tuple[Delta, ...] | Iterator[Delta]:
    """A tuple when shorter than `YIELD_EVERY`; else taken as streamed, never made all at once, and at most
    `MAX_OUTPUT_TOKENS` whatever was asked (bounded by conditionals: `min` and `max` cost ~1k instructions on 3.11)."""
    count = DEFAULT_TOKENS if asked is None else asked if asked < MAX_OUTPUT_TOKENS else MAX_OUTPUT_TOKENS
    if count < 0:
        count = 0
    if last is not None and last["role"] == "tool":
        echo = TextDelta(f"Tool {last['tool_call_id']} returned: {last['content']}\n")
        if count < YIELD_EVERY:
            return (echo, *READY_WORDS[: count - 1 if count else 0])
        return chain((echo,), islice(cycle(WORD_DELTAS), count - 1))
    return READY_WORDS[:count] if count < YIELD_EVERY else islice(cycle(WORD_DELTAS), count)


def _chunks(text: str) -> tuple[Delta, ...] | Iterator[Delta]:
    """Structured output in pieces of `CHARS_PER_TOKEN`: a tuple when fewer than `YIELD_EVERY`, else made as taken."""
    pieces = (TextDelta(text[i : i + CHARS_PER_TOKEN]) for i in range(0, len(text), CHARS_PER_TOKEN))
    return tuple(pieces) if len(text) <= (YIELD_EVERY - 1) * CHARS_PER_TOKEN else pieces


def _structured(response_format: Any) -> Iterator[str] | None:
    if not isinstance(response_format, dict):
        return None
    if response_format.get("type") == "json_schema":
        return json_text(response_format.get("json_schema", {}).get("schema", {}))
    if response_format.get("type") == "json_object":
        return iter([json.dumps({"simulated": True})])
    return None


def _requested_call(request: BackendRequest, last: Message | None) -> tuple[str, Iterator[str]] | None:
    tools, choice = chat_tools_and_choice(request)
    if not tools:
        return None
    schemas = {tool["function"]["name"]: tool["function"].get("parameters") for tool in tools}
    if last is not None and last["role"] in ("user", "tool"):  # a tool's output may ask for the next call
        lines = _text(last["content"]).splitlines()
        for index, line in enumerate(lines):
            call = _directive(line.strip(), lines[index + 1 :], schemas)
            if call is not None:
                return call
    forced = _forced(choice, schemas)
    if forced is None or (last is not None and last["role"] == "tool"):
        return None
    return forced, json_text(schemas[forced] or {"type": "object"})


def _directive(line: str, rest: list[str], schemas: dict[str, Any]) -> tuple[str, Iterator[str]] | None:
    parts = line.split(" ", 2)
    if len(parts) < 2 or parts[1] not in schemas:
        return None
    if parts[0] == "custom":
        return parts[1], iter([json.dumps({"input": "\n".join([*parts[2:], *rest])})])
    if parts[0] == "call" and len(parts) == 3:
        try:
            return parts[1], iter([json.dumps(json.loads(parts[2]))])
        except json.JSONDecodeError:
            return None
    return None


def _forced(choice: Any, schemas: dict[str, Any]) -> str | None:
    if isinstance(choice, dict) and choice.get("function", {}).get("name") in schemas:
        return choice["function"]["name"]
    if choice == "required":
        return next(iter(schemas))
    return None


def _call_pieces(call: tuple[str, str], turn: int) -> tuple[Delta, ...]:
    name, arguments = call
    call_id = f"call_sim_{zlib.crc32(f'{turn}:{name}:{arguments}'.encode()):08x}"
    middle = len(arguments) // 2
    return (
        ToolCallDelta(0, arguments[:middle], call_id=call_id, name=name),
        ToolCallDelta(0, arguments[middle:]),
    )


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if isinstance(part, dict))
