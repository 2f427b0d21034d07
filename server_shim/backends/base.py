"""The backend protocol: a rendered chat request in, a stream of deltas out."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from ..render import ChatPrompt, encode
from ..stages import StageClock


@dataclass(slots=True)
class BackendRequest:
    """A Chat Completions request whose message history is already encoded."""

    model: str
    prompt: ChatPrompt
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    max_output_tokens: int | None = None
    options: dict[str, Any] = field(default_factory=dict)
    """Further Chat Completions fields (`request_fields.chat_options`)."""
    responses_fields: dict[str, Any] = field(default_factory=dict)
    """The same fields as the client sent them, for a `responses` upstream (`request_fields.responses_fields`)."""
    cached_prefix_nbytes: int = 0
    """Bytes of the history already sent on an earlier turn: the part a prefix cache can reuse."""
    deployment: str | None = None
    """The conversation's route: in, the previous turn's deployment; out, the one that served."""
    connection_id: str | None = None
    """The client connection this turn runs on (None over HTTP), for backends that keep state per connection."""
    prefix_messages: int = 0
    """How many messages of `prompt` the previous turn already had (its input and output)."""
    carry: dict[str, Any] = field(default_factory=dict)
    """What a backend keeps for the conversation between turns (an upstream response id, say):
    in, the previous turn's; out, this turn's. Empty when the route changed deployment."""
    stages: StageClock | None = None
    """The turn's stage clock: a router marks the end of `route` on it; backends leave it alone."""

    def body(self, *, stream: bool = True, extra: dict[str, Any] | None = None) -> bytes:
        """The Chat Completions JSON body; the history is joined from cached bytes."""
        fields: dict[str, Any] = {"model": self.model, "stream": stream, **self.options}
        if stream:
            fields["stream_options"] = {"include_usage": True}
        if self.tools:
            fields["tools"] = self.tools
            if self.tool_choice is not None:
                fields["tool_choice"] = self.tool_choice
        if self.max_output_tokens is not None:
            fields["max_tokens"] = self.max_output_tokens
        if extra:
            fields.update(extra)
        head = encode(fields)
        return head[:-1] + b',"messages":' + self.prompt.encoded_messages(self.instructions) + b"}"

    def estimate_input_tokens(self) -> int:
        return estimate_tokens(self.prompt.nbytes + len(self.instructions or ""))


@dataclass(slots=True, frozen=True)
class TextDelta:
    text: str


@dataclass(slots=True, frozen=True)
class ToolCallDelta:
    """A piece of one tool call; `call_id` and `name` arrive with the first piece.

    `namespace` is set for a member of a namespace tool; `custom` marks a custom tool's call,
    whose `arguments` are then its free-form input text.
    """

    index: int
    arguments: str = ""
    call_id: str | None = None
    name: str | None = None
    namespace: str | None = None
    custom: bool = False


@dataclass(slots=True, frozen=True)
class Usage:
    input_tokens: int
    output_tokens: int
    cached_tokens: int = 0
    estimated: bool = field(default=False, compare=False)
    """The backend sent no usage and these are the shim's estimates (see `server_shim/tokens.py`)."""


@dataclass(slots=True, frozen=True)
class Finish:
    """The backend's finish reason: 'stop', 'length' or 'tool_calls'."""

    reason: str


Delta = TextDelta | ToolCallDelta | Usage | Finish


class Backend(Protocol):
    """One inference backend.

    `stream` yields deltas for one request and raises `BackendError` when the backend is
    unreachable, answers with an error status, or ends the stream before finishing. It must
    release its HTTP resources when the consumer stops early. `release` is called when a client
    connection ends, for what the backend kept for it. `aclose` releases pooled connections;
    the backend is unusable afterwards.
    """

    name: str

    def stream(self, request: BackendRequest) -> AsyncGenerator[Delta, None]: ...

    async def models(self) -> list[str]: ...

    async def release(self, connection_id: str) -> None: ...

    async def aclose(self) -> None: ...


BackendFactory = Callable[..., Backend]
"""What a backend kind provides: `factory(deployment: DeploymentConfig, **options) -> Backend`.

Called once per deployment of its kind when the server starts; `options` is the deployment's
`[deployments.options]` table.
"""


def estimate_tokens(nbytes: int) -> int:
    """About four bytes per token: used only when a backend reports no usage."""
    return max(1, nbytes // 4)


def loads(data: bytes | str) -> Any:
    return orjson.loads(data)
