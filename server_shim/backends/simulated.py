"""The simulated backend: deterministic, paced, and labelled as a simulator wherever it shows.

Contract (also in the README): it streams a deterministic text reply of
`max_output_tokens` tokens (default 16); if the newest user message has a line
`call NAME {json}` and NAME is a function tool of the request, it emits that function
call with those arguments instead; when the newest input item is a tool output, it
replies with text that contains that output.
"""

from __future__ import annotations

import asyncio
import json
import time
import zlib
from collections.abc import AsyncGenerator
from typing import Any

from .base import BackendRequest, Delta, Finish, TextDelta, ToolCallDelta, Usage, estimate_tokens

DEFAULT_TOKENS = 16
WORDS = ("simulated ", "reply ", "from ", "the ", "responses-ws ", "simulator ", "token ", "stream ")


class SimulatedBackend:
    name = "simulated"

    def __init__(self, *, ttft_s: float = 0.0, tokens_per_s: float = 0.0, model: str = "simulated-1") -> None:
        self.ttft_s = ttft_s
        self.tokens_per_s = tokens_per_s
        self.model = model

    async def models(self) -> list[str]:
        return [self.model]

    async def release(self, connection_id: str) -> None:
        return None

    async def aclose(self) -> None:
        return None

    async def stream(self, request: BackendRequest) -> AsyncGenerator[Delta, None]:
        call = _requested_call(request)
        pieces = _call_pieces(call, len(request.prompt.messages)) if call else _text_pieces(request)
        pacer = _Pacer(self.ttft_s, self.tokens_per_s)
        for index, piece in enumerate(pieces):
            await pacer.wait(index)
            yield piece
        output_tokens = len(pieces)
        input_tokens = request.estimate_input_tokens()
        cached = estimate_tokens(request.cached_prefix_nbytes) if request.cached_prefix_nbytes else 0
        yield Usage(input_tokens, output_tokens, min(cached, input_tokens))
        yield Finish("tool_calls" if call else "stop")


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


def _text_pieces(request: BackendRequest) -> list[Delta]:
    count = request.max_output_tokens if request.max_output_tokens is not None else DEFAULT_TOKENS
    last = request.prompt.messages[-1] if request.prompt.messages else None
    pieces: list[Delta] = []
    if last is not None and last["role"] == "tool":
        pieces.append(TextDelta(f"Tool {last['tool_call_id']} returned: {last['content']}"))
    pieces.extend(TextDelta(WORDS[i % len(WORDS)]) for i in range(max(0, count - len(pieces))))
    return pieces


def _requested_call(request: BackendRequest) -> tuple[str, str] | None:
    messages = request.prompt.messages
    if not messages or messages[-1]["role"] != "user" or not request.tools:
        return None
    names = {tool["function"]["name"] for tool in request.tools if tool.get("type") == "function"}
    for line in _text(messages[-1]["content"]).splitlines():
        parts = line.strip().split(" ", 2)
        if len(parts) == 3 and parts[0] == "call" and parts[1] in names:
            try:
                arguments = json.loads(parts[2])
            except json.JSONDecodeError:
                continue
            return parts[1], json.dumps(arguments)
    return None


def _call_pieces(call: tuple[str, str], turn: int) -> list[Delta]:
    name, arguments = call
    call_id = f"call_sim_{zlib.crc32(f'{turn}:{name}:{arguments}'.encode()):08x}"
    middle = len(arguments) // 2
    return [
        ToolCallDelta(0, arguments[:middle], call_id=call_id, name=name),
        ToolCallDelta(0, arguments[middle:]),
    ]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if isinstance(part, dict))
