"""The backend protocol: Responses items in, a stream of deltas out; optional abilities as their own protocols."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import orjson

from ..history import History

if TYPE_CHECKING:
    from ..stages import StageClock
    from ..tools import ChatTools
    from .rate_limits import RateLimitState


@dataclass(slots=True)
class BackendRequest:
    """One turn for a backend: the conversation as Responses items, and the request's settings.

    A backend converts what it needs itself: chat backends render `history` into messages
    (`chat_convert.chat_prompt`, which continues the rendering cached for the previous turn), a
    `responses` upstream sends the items, `tools`, `tool_choice` and `responses_fields` as they are.
    """

    model: str
    history: History
    """The whole conversation through this turn's input: earlier turns' input and output items, then the new ones."""
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    """Responses tool definitions as the client sent them (checked by the turn)."""
    tool_choice: Any = None
    """The Responses `tool_choice` as the client sent it (checked against `tools`)."""
    chat_tools: ChatTools | None = None
    """`tools` as a chat backend sends them, cached with the conversation (`tools.chat_tools`)."""
    max_output_tokens: int | None = None
    options: dict[str, Any] = field(default_factory=dict)
    """Further Chat Completions fields (`request_fields.chat_options`)."""
    responses_fields: dict[str, Any] = field(default_factory=dict)
    """The same fields as the client sent them, for a `responses` upstream (`request_fields.responses_fields`)."""
    previous_items: int = 0
    """How many items of `history` the previous turn already had (its input and output)."""
    deployment: str | None = None
    """The deployment that served the previous turn (the conversation's sticky route), for the router."""
    connection_id: str | None = None
    """The client connection this turn runs on (None over HTTP), for backends that keep state per connection."""
    carry: Mapping[str, Any] = field(default_factory=dict)
    """What this backend kept for the conversation on its previous turn (its `Carry`); empty when the
    previous turn ran on another deployment."""
    stages: StageClock | None = None
    """The turn's stage clock: a router marks the end of `route` on it; backends leave it alone."""
    served_by: str | None = None
    """The deployment streaming the turn, set by the router when one takes it: a turn its client cancels
    before the router's closing `Routed` is still billed to the deployment that produced its tokens."""

    @property
    def new_items(self) -> tuple[dict[str, Any], ...]:
        """The items after the previous turn's: this turn's input."""
        return self.history.after(self.previous_items)

    def estimate_input_tokens(self) -> int:
        return estimate_tokens(self.history.nbytes + len(self.instructions or ""))


@dataclass(slots=True, frozen=True)
class TextDelta:
    text: str
    logprobs: tuple[dict[str, Any], ...] = ()
    """The tokens of `text` with their log probabilities, when asked for and the backend sent them
    (Responses' `Logprob` shape: `token`, `bytes`, `logprob`, `top_logprobs`; see `as_logprobs`)."""


def as_logprobs(entries: Any) -> tuple[dict[str, Any], ...]:
    """Chat Completions' `choices[].logprobs.content`, or a Responses delta's `logprobs`, as Responses'
    output `Logprob`s. The two use the same keys; `bytes` (null or absent) becomes the token's UTF-8
    and a missing `top_logprobs` an empty list. Entries without a string token and a numeric
    logprob are left out: what reaches the client always parses as the SDK's types."""
    if not isinstance(entries, list):
        return ()
    return tuple(
        {**_token(entry), "top_logprobs": [_token(top) for top in entry.get("top_logprobs") or () if _valid(top)]}
        for entry in entries
        if _valid(entry)
    )


def _valid(entry: Any) -> bool:
    logprob = entry.get("logprob") if isinstance(entry, dict) else None
    return isinstance(entry.get("token"), str) and isinstance(logprob, (int, float)) and not isinstance(logprob, bool)


def _token(entry: dict[str, Any]) -> dict[str, Any]:
    raw = entry.get("bytes")
    data = raw if isinstance(raw, list) and all(isinstance(b, int) for b in raw) else list(entry["token"].encode())
    return {"token": entry["token"], "bytes": data, "logprob": entry["logprob"]}


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


@dataclass(slots=True, frozen=True)
class Carry:
    """What a backend keeps for the conversation's next turn (an upstream response id, say).

    Yielded once, anywhere in the stream, by a backend that needs it; the next turn of the conversation
    gets it back as `request.carry` while it stays on the same deployment.
    """

    values: Mapping[str, Any]


@dataclass(slots=True, frozen=True)
class Routed:
    """The router's decision, yielded after a turn's last delta: the deployment that served it and
    what its backend carries. The turn stores both with the response, for the next turn."""

    deployment: str
    carry: Mapping[str, Any]


Delta = TextDelta | ToolCallDelta | Usage | Finish | Carry | Routed


class Backend(Protocol):
    """One inference backend: `stream` and `aclose`, plus `models` for `/v1/models` and health checks.

    `stream` yields deltas for one request and raises `BackendError` when the backend is
    unreachable, answers with an error status, or ends the stream before finishing. It must
    release its HTTP resources when the consumer stops early (the generator is closed).
    `aclose` releases pooled connections; the backend is unusable afterwards. Optional
    abilities are the protocols below; the server checks for them with `isinstance`.
    """

    name: str

    def stream(self, request: BackendRequest) -> AsyncGenerator[Delta, None]: ...

    async def models(self) -> list[str]: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class ConnectionScoped(Protocol):
    """A backend that keeps state per client connection: `release` is called when one ends."""

    async def release(self, connection_id: str) -> None: ...


@runtime_checkable
class ServesModels(Protocol):
    """A backend that knows which public model names it serves; others are refused (404) before a turn starts."""

    def serves_model(self, model: str) -> bool: ...


@runtime_checkable
class HostedToolPolicy(Protocol):
    """A backend whose deployments differ in what they do with hosted tools: the policy (`drop`, `refuse`,
    `pass`) of the deployment a conversation's next turn will most likely run on."""

    def hosted_policy(self, model: str, sticky: str | None) -> str: ...


@runtime_checkable
class ContextWindows(Protocol):
    """A backend whose deployments declare their model's context window: the window (tokens) of the
    deployment a conversation's next turn will most likely run on, None where not configured."""

    def context_window(self, model: str, sticky: str | None) -> int | None: ...


@runtime_checkable
class HasBackgroundWork(Protocol):
    """A backend with work of its own while the server runs (health checks): the app's lifespan awaits
    `start` once before serving; it must return promptly (a bounded wait at most)."""

    async def start(self) -> None: ...


@runtime_checkable
class ReportsStatus(Protocol):
    """A backend whose state `/readyz` shows: `status()` maps a part's name to its state, `available` among it."""

    def status(self) -> dict[str, dict[str, object]]: ...


@runtime_checkable
class RepliesAtOnce(Protocol):
    """A backend that sometimes has a whole reply without waiting for anything (in-process and unpaced, as
    the simulator mostly is): `ready` returns the deltas `stream` would yield for the request, or None
    when `stream` would wait. The router then hands them on without a generator to drive or a deadline to
    watch; a backend whose `stream` awaits anything (I/O, pacing, the loop) returns None for it."""

    def ready(self, request: BackendRequest) -> Sequence[Delta] | None: ...


@runtime_checkable
class ReportsRateLimits(Protocol):
    """A backend that reads its server's rate-limit headers, so the router can skip it before a 429."""

    rate_limit: RateLimitState


BackendFactory = Callable[..., Backend]
"""What a backend kind provides: `factory(deployment: DeploymentConfig, **options) -> Backend`.

Called once per deployment of its kind when the server starts; `options` is the deployment's
`[deployments.options]` table.
"""


def estimate_tokens(nbytes: int) -> int:
    """About four bytes per token, at least one: used only when a backend reports no usage. A conditional, not
    `max`: on 3.11 the builtin parses its arguments as keywords (~1k instructions), and the simulator asks twice
    a turn."""
    tokens = nbytes // 4
    return tokens if tokens > 1 else 1


def loads(data: bytes | str) -> Any:
    return orjson.loads(data)


def encode(value: Any) -> bytes:
    """Canonical JSON (sorted keys): the same value always encodes to the same bytes."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
