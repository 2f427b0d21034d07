"""Stateful incremental checks: one fold over the conversation, whether it arrives in pieces or whole.

A check keeps a per-conversation state (any JSON value) that it updates from new items only.
The state after a turn belongs to the response of that turn (`ResponseState.checks`), so it is
cached with the connection state, stored with stored responses, and a fork from any earlier
`previous_response_id` starts from that response's state. States are never changed in place:
a check returns a new value (copy on write), so every fork sees its own history.

The conversation is cut into *runs*: maximal sequences of input items (what users and tools
add) and of output items (what the model produced: assistant messages, calls, reasoning). A
check `inspect`s each input run (it may refuse, label or rewrite it) and `observe`s each output
run (state only). A chained turn folds the previous response's output and then the new input,
starting from the previous response's state; a turn without `previous_response_id` (the
stateless HTTP path, which carries the whole history) folds every run from the initial state.
Both see the same runs in the same order, so both give the same verdicts and labels: the
labels of a turn are those of its last input run, and any run may refuse. (A turn whose
response has no output, such as a `generate: false` warm-up, is the one place where the two
cut differently: its input and the next turn's input form one run over HTTP.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable

from .errors import APIError
from .items import Item
from .safety import call_hook

log = logging.getLogger(__name__)

Side = Literal["input", "output"]
MODEL_ITEM_TYPES = frozenset({"function_call", "custom_tool_call", "reasoning", "compaction"})
"""Item types only a model produces (with assistant messages): they make up output runs."""

LABEL_PREFIX = "check."
T = TypeVar("T")


class CheckRefused(Exception):
    """A check refused the turn (or failed closed) while inference ran; `error` is what the client gets."""

    def __init__(self, error: APIError) -> None:
        super().__init__(str(error))
        self.error = error


@dataclass(frozen=True, slots=True)
class Finding:
    """What a check concluded about one input run."""

    labels: Mapping[str, str] = field(default_factory=dict)
    """Added to the response metadata as `check.<key>`."""
    refusal: APIError | None = None
    """Refuse the turn with this error (e.g. code `content_policy_violation`)."""
    items: list[Item] | None = None
    """The run rewritten (e.g. redacted); only honoured for checks with `mutates = True`."""


@runtime_checkable
class Check(Protocol):
    """A stateful, incremental check. States are JSON values and are never changed in place.

    `mutates`: the check rewrites input, so it runs before inference (and its rewrite is what the
    backend sees and what is kept). Otherwise it runs beside inference, and `blocking` says whether
    the client's first token waits for it (a check that can refuse must be blocking).
    """

    name: str
    mutates: bool
    blocking: bool

    def initial(self) -> Any: ...

    def observe(self, state: Any, items: list[Item]) -> Any: ...

    def inspect(self, state: Any, items: list[Item]) -> tuple[Any, Finding] | Awaitable[tuple[Any, Finding]]: ...


@dataclass(slots=True)
class CheckOutcome:
    """The fold's result for one turn."""

    states: dict[str, Any] = field(default_factory=dict)
    """The state after this turn of each check that ran."""
    labels: dict[str, str] = field(default_factory=dict)
    items: list[Item] = field(default_factory=list)
    """The new items, rewritten by mutating checks."""

    def merge(self, other: CheckOutcome) -> None:
        self.states.update(other.states)
        self.labels.update(other.labels)


def side(item: Item) -> Side:
    """Which run an item belongs to: output if a model produced it, input otherwise."""
    kind = item.get("type", "message")
    if kind == "message":
        return "output" if item.get("role") == "assistant" else "input"
    return "output" if kind in MODEL_ITEM_TYPES else "input"


def runs(items: Sequence[Item]) -> list[tuple[Side, list[Item]]]:
    """Maximal runs of same-side items, in order."""
    cut: list[tuple[Side, list[Item]]] = []
    for item in items:
        which = side(item)
        if cut and cut[-1][0] == which:
            cut[-1][1].append(item)
        else:
            cut.append((which, [item]))
    return cut


async def fold(
    checks: Sequence[Check], states: Mapping[str, Any], prior_output: list[Item], new_items: list[Item]
) -> CheckOutcome:
    """Run `checks` over `prior_output + new_items`, starting from `states`; raise the first refusal.

    `states` maps check names to the previous response's states (a check missing there starts from
    its initial state). A check that raises anything but `APIError` fails the turn (`server_error`).
    """
    outcome = CheckOutcome(items=list(new_items))
    for check in checks:
        start = states[check.name] if check.name in states else await call_hook(check.initial)
        await _fold_one(check, start, outcome, prior_output)
    return outcome


async def _fold_one(check: Check, state: Any, outcome: CheckOutcome, prior_output: list[Item]) -> None:
    labels: Mapping[str, str] = {}
    rewritten: list[Item] = []
    for which, run in runs([*prior_output, *outcome.items]):
        if which == "output":
            state = await call_hook(check.observe, state, run)
            rewritten.extend(run)
            continue
        state, finding = await call_hook(check.inspect, state, run)
        if finding.refusal is not None:
            raise finding.refusal
        labels = finding.labels
        rewritten.extend(finding.items if check.mutates and finding.items is not None else run)
    outcome.states[check.name] = state
    outcome.labels.update((f"{LABEL_PREFIX}{key}", value) for key, value in labels.items())
    outcome.items = rewritten[len(prior_output) :]


@dataclass(slots=True)
class PendingChecks:
    """Checks started beside inference: `passed()` waits for the blocking ones, `outcome()` for all."""

    blocking: asyncio.Task[CheckOutcome] | None
    flagging: asyncio.Task[CheckOutcome] | None
    started: float = field(default_factory=time.perf_counter)
    seconds: float = 0.0
    """How long the checks ran beside inference (start to the last one done), once `outcome()` returned."""

    @classmethod
    def start(
        cls, checks: Sequence[Check], states: Mapping[str, Any], prior_output: list[Item], new_items: list[Item]
    ) -> PendingChecks:
        if not checks:
            return NOTHING_PENDING
        blocking = [check for check in checks if check.blocking]
        flagging = [check for check in checks if not check.blocking]
        return cls(_task(blocking, states, prior_output, new_items), _task(flagging, states, prior_output, new_items))

    @property
    def started_any(self) -> bool:
        """Whether a check runs beside inference (else `outcome` has nothing to wait for or merge)."""
        return self.blocking is not None or self.flagging is not None

    async def passed(self) -> None:
        """Returns when every blocking check has passed; raises the refusal otherwise."""
        if self.blocking is not None:
            await self.blocking

    async def outcome(self, base: CheckOutcome) -> CheckOutcome:
        """`base` (the checks run before inference) merged with every check started here."""
        if not self.started_any:
            return base
        for task in (self.blocking, self.flagging):
            if task is not None:
                base.merge(await task)
        self.seconds = time.perf_counter() - self.started
        return base

    def cancel(self) -> None:
        """Stop what still runs; a finished task's error is taken here, so it is not reported as lost."""
        for task in (self.blocking, self.flagging):
            if task is None:
                continue
            if not task.done():
                task.cancel()
            elif not task.cancelled():
                task.exception()


def _task(
    checks: Sequence[Check], states: Mapping[str, Any], prior_output: list[Item], new_items: list[Item]
) -> asyncio.Task[CheckOutcome] | None:
    if not checks:
        return None
    return asyncio.get_running_loop().create_task(fold(checks, states, prior_output, new_items))


async def prepare_checks(
    checks: Sequence[Check],
    states: Mapping[str, Any],
    prior_output: list[Item],
    new_items: list[Item],
    *,
    overlap: bool,
) -> tuple[CheckOutcome, list[Check]]:
    """Run what must finish before inference; return its outcome and the checks left to run beside it.

    Mutating checks always run first (the backend must see their rewrite). With `overlap` off,
    every check runs here, before the response is created, so a refusal is a plain `error`.
    """
    now = [check for check in checks if check.mutates or not overlap]
    later = [check for check in checks if not (check.mutates or not overlap)]
    before = await fold([c for c in now if c.mutates], states, prior_output, new_items)
    before.merge(await fold([c for c in now if not c.mutates], states, prior_output, before.items))
    return before, later


NOTHING_PENDING = PendingChecks(None, None)
"""What `PendingChecks.start` makes of no checks (most turns), shared: with no task, nothing in it changes."""


def gated(source: AsyncGenerator[T, None], pending: PendingChecks) -> AsyncGenerator[T, None]:
    """`source` itself when no blocking check runs beside it (no extra task per turn), else held."""
    return source if pending.blocking is None else hold_until_passed(source, pending)


async def hold_until_passed(source: AsyncIterator[T], pending: PendingChecks) -> AsyncGenerator[T, None]:
    """`source`'s items, none before every blocking check has passed; read meanwhile, so both overlap.

    A refusal (or a failing check) raises `CheckRefused` before anything is yielded, and closes
    `source`, which cancels the backend request.
    """
    queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
    pump = asyncio.get_running_loop().create_task(_pump(source, queue))
    try:
        try:
            await pending.passed()
        except APIError as error:
            raise CheckRefused(error) from error
        while True:
            kind, value = await queue.get()
            if kind == "item":
                yield value
            elif kind == "error":
                raise value
            else:
                return
    finally:
        pump.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await pump


async def _pump(source: AsyncIterator[T], queue: asyncio.Queue[tuple[str, Any]]) -> None:
    """Read `source` into `queue`; its end or its error is the last entry; closing it on cancel."""
    try:
        async for item in source:
            queue.put_nowait(("item", item))
    except Exception as exc:
        queue.put_nowait(("error", exc))
    else:
        queue.put_nowait(("end", None))
    finally:
        aclose = getattr(source, "aclose", None)
        if aclose is not None:
            await aclose()
