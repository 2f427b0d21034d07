"""What a turn works with: the server-wide environment, the prepared plan, and the result.

Plain data, apart from the pipeline in `turn.py` that fills it, so the stages' inputs and
outputs can be read (and built in tests) without the pipeline's control flow; and the two
lookups a turn starts with (the previous response, the models for an unknown one).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from . import metrics
from .backends.base import Backend, BackendRequest, Carry, Routed
from .backends.chat_convert import render_items
from .callids import with_calls
from .checks import Check, CheckOutcome
from .compaction import PROCESS_KEY
from .eager import on_task, on_task_for
from .errors import APIError, BackendError
from .footprint import footprint_in_slices
from .history import History
from .items import CALL_TYPES, Item
from .limits import DEFAULT_LIMITS, RequestLimits
from .postinference import PostInference
from .requests import CreateRequest
from .safety import Classifier, Validator
from .stages import StageClock
from .state import ConnectionCache, ResponseState, ResponseStore, RunningResponses, shared_tools
from .tokens import NOT_COUNTED, TokenCount, TokenCounter
from .tools import ChatTools
from .turn_settings import Derived

_CACHE_HITS = metrics.CACHE_LOOKUPS.labels("hit")


@dataclass
class TurnEnv:
    """What every turn on a server shares."""

    backend: Backend
    store: ResponseStore
    validators: Sequence[Validator] = ()
    classifiers: Sequence[Classifier] = ()
    post_inference: PostInference = field(default_factory=PostInference)
    serves_model: Callable[[str], bool] = field(default=lambda model: True)
    """Whether some backend serves this public model name; checked before anything else."""
    hosted_policy: Callable[[str, str | None], str] = field(default=lambda model, sticky: "drop")
    """The hosted-tool policy (drop, refuse, pass) of the deployment this model and sticky route go to."""
    context_window: Callable[[str, str | None], int | None] = field(default=lambda model, sticky: None)
    """The context window (tokens) of the deployment this model and sticky route go to, when configured."""
    limits: RequestLimits = DEFAULT_LIMITS
    checks: Callable[[str], Sequence[Check]] = field(default=lambda model: ())
    """The stateful checks for a public model name (`checks.py`); run beside inference when `overlap_checks`."""
    overlap_checks: bool = True
    token_counter: Callable[[str], TokenCounter | None] = field(default=lambda model: None)
    """The tokenizer of the deployments serving a model, when configured (`tokens.py`)."""
    compaction_key: bytes = PROCESS_KEY
    """Signs the compaction items this server makes (`compaction.py`); from `compaction_secret` when set."""
    running: RunningResponses = field(default_factory=RunningResponses)
    """Stored responses streaming now: chaining from one is `previous_response_in_progress`."""


@dataclass(slots=True)
class TurnPlan:
    """The prepared turn: validated new items appended to the previous history.

    `plan_turn` passes its fields by position: a class called with keyword arguments gets them as a dict (CPython
    3.11's `type.__call__`; ~400 instructions per keyword here), and a call of more than 15 keyword arguments
    (`nargs + 2 * nkwargs > 30`) is compiled into a dict and `CALL_FUNCTION_EX` (~10,000 instructions more)."""

    new_items: list[Item]
    tools: ChatTools
    chat_tools: list | None
    history: History
    sent_history: History
    """What the backend gets: `history`, or its tail when `truncation: auto` had to fit a context window."""
    call_ids: Set[str]
    previous_items: int
    deployment: str | None
    carry: Mapping[str, Any]
    labels: dict[str, str]
    backend_tools: list[dict[str, Any]] | None
    """The client's tools as a backend gets them: hosted ones left out unless the deployment's policy is `pass`."""
    base_held: int
    """Memory of the history this turn extends (shared with the previous state, not its own)."""
    derived: Derived
    """What the turn derives from the request's settings alone (the backend's fields...: `turn_settings`)."""
    echoed: dict[str, Any] = field(default_factory=dict)
    """The request fields its Response objects echo (`Derived.echo`), read once for the turn."""
    held: RequestHeld = field(default_factory=lambda: RequestHeld(None, {}))
    """What the request's tools and echoed containers hold, measured in slices (`request_held`)."""
    checks: CheckOutcome = field(default_factory=CheckOutcome)
    """What the checks run before inference found; merged with those run beside it."""
    prior_checks: dict[str, Any] = field(default_factory=dict)
    prior_output: list[Item] = field(default_factory=list)
    later_checks: list[Check] = field(default_factory=list)
    previous: ResponseState | None = None
    counting: TokenCount = NOT_COUNTED
    """Set when the turn runs (`TokenCount.start`)."""
    tokens: tuple[str, int] | None = None

    @property
    def new_messages(self) -> list[dict[str, Any]]:
        """The new items as chat messages: what a token count tokenizes (`tokens.py`), rendered only when a model
        has a counter (none by default: ~3,000 instructions a turn for nothing)."""
        return render_items(self.new_items)

    def route(self, delta: Carry | Routed) -> None:
        """What the backend decided for the conversation's next turn."""
        if isinstance(delta, Routed):
            self.deployment = delta.deployment
        self.carry = delta.carry if isinstance(delta, Routed) else delta.values

    def state(self, response: dict[str, Any], request: CreateRequest, tenant: str | None) -> ResponseState:
        """What the finished turn leaves for the next one: its Response object (`response_object`'s, from the memo
        `derived`: see `response_held.made_held`), its history through the output."""
        output = response["output"]
        return ResponseState(  # the first seven by position, in order (keywords cost a dict: see `TurnPlan`)
            response,
            self.new_items,  # input_items
            output,  # output_items
            shared_tools(request.tools or [], response, self.previous),  # tools
            self.tools,  # chat_tools
            self.history.extend(output),  # history
            with_calls(self.call_ids, called) if (called := _calls_in(output)) else self.call_ids,  # call_ids
            deployment=self.deployment,
            carry=dict(self.carry),
            tenant=tenant,
            base_held=self.base_held,
            tools_held=self.held.tools,
            echo_held=self.held.echo,
            checks=self.prior_checks | self.checks.states,
            tokens=self.tokens,
            parent=self.previous,
            template=self.derived,
        )

    def backend_request(self, request: CreateRequest, connection_id: str | None, stages: StageClock) -> BackendRequest:
        """What the backend gets for this turn."""
        return BackendRequest(  # every field but `served_by` by position, in order (keywords: see `TurnPlan`)
            request.model,
            self.sent_history,  # history
            request.instructions,
            self.backend_tools,  # tools
            request.tool_choice,
            self.tools,  # chat_tools
            request.max_output_tokens,
            {**self.derived.options},  # options
            {**self.derived.fields},  # responses_fields
            self.previous_items,
            self.deployment,
            connection_id,
            self.carry,
            stages,
        )


@dataclass(slots=True)
class TurnResult:
    """How the turn ended, for callers that need more than the events (metrics, the log line)."""

    response: dict | None = None
    error: APIError | None = None
    new_items: int = 0
    deployment: str | None = None
    stages: StageClock = field(default_factory=StageClock)
    plugin_s: dict[str, float] = field(default_factory=dict)
    """Seconds in validators and in classifiers, included in the `validate` stage."""
    trace_carrier: dict[str, str] = field(default_factory=dict)
    """The caller's W3C trace context (`traceparent`, `tracestate`), when tracing is on."""


def cached_previous(previous_id: str | None, cache: ConnectionCache | None) -> ResponseState | None:
    """The state a turn continues when the connection's cache has it (the common case: nothing to await)."""
    state = cache.get(previous_id) if cache is not None and previous_id is not None else None
    if state is not None:
        metrics.add(_CACHE_HITS)
    return state


async def resolve_previous(
    previous_id: str | None, cache: ConnectionCache | None, env: TurnEnv, tenant: str | None
) -> ResponseState | None:
    """The state a turn continues: the connection's cache first, then the store (this tenant's only)."""
    if previous_id is None:
        return None
    state = cached_previous(previous_id, cache)
    if state is not None:
        return state
    await on_task_for(env.store)
    state = await env.store.load(previous_id, tenant)
    metrics.STORE_OPERATIONS.labels("load", "miss" if state is None else "hit").inc()
    metrics.CACHE_LOOKUPS.labels("miss" if state is None else "store").inc()
    if state is None:
        raise env.running.missing(previous_id, tenant)
    return state


async def served_models(backend: Backend) -> list[str]:
    """For an unknown model's error message only: a backend that cannot list its models leaves the list out."""
    try:
        await on_task()  # the backend may ask its server (an HTTP client needs a current task)
        return await backend.models()
    except BackendError:
        return []


async def batch_held(batch: tuple[Item, ...]) -> int:
    """A large request's new items' footprint, walked in slices after giving way once (the item passes before
    it did not); `History` walks a small batch itself."""
    await asyncio.sleep(0)
    return await footprint_in_slices(batch)


class RequestHeld(NamedTuple):
    """Footprints measured while the turn is prepared, for its `ResponseState` (a named tuple: a frozen
    dataclass's `__init__` costs thousands of instructions, a field set through `object.__setattr__` each)."""

    tools: int | None
    """The request's tools (None: not measured, e.g. the previous state's list is kept)."""
    echo: dict[int, int]
    """The other request containers the Response echoes, by `id`."""


def _calls_in(output: list[Item]) -> list[str]:
    """The call ids a response's output introduces (a list, not a generator: none, most turns)."""
    return [item["call_id"] for item in output if item["type"] in CALL_TYPES]


def walked_tools(request: CreateRequest, previous: ResponseState | None) -> list[dict[str, Any]] | None:
    """The request's tools for `request_held` to walk: None when the state keeps the previous state's equal list
    (`shared_tools`, and its footprint with it)."""
    tools = request.tools
    if tools and previous is not None and previous.tools == tools:
        tools = None
    return tools or None


async def request_held(tools: list[dict[str, Any]] | None, derived: Derived) -> RequestHeld:
    """The footprints of `walked_tools`' tools and of the derivation's echoed containers (measured once per
    derivation, which a connection reuses while the settings stay the same), walked in slices that let other
    connections run (up to `max_json_values` values each: ~100 ms in one go)."""
    tools_held = await footprint_in_slices(tools) if tools else None
    if derived.echo_held is None:
        held: dict[int, int] = {}
        for part in derived.parts:
            if id(part) not in held:
                held[id(part)] = await footprint_in_slices(part)
        derived.echo_held = held
    return RequestHeld(tools_held, derived.echo_held)
