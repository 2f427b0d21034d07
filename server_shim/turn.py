"""One turn as a pipeline: resolve -> validate new items -> extend the history -> backend -> events -> finalize.

Only this module (and `turn_prepare`, for the stages before inference) knows the order of the
stages. Each stage sees what it needs: validators and classifiers get the new items and read-only
previous state, the backend gets the history as Responses items (with its renderings cached) and
converts it itself. Nothing here touches a socket, so the WebSocket and HTTP paths share it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any, cast

from . import metrics
from .backends.base import BackendRequest, Carry, Delta, Routed, TextDelta, ToolCallDelta, Usage
from .batches import Emit, Send, pulled, unsent
from .checks import NOTHING_PENDING, CheckRefused, PendingChecks, gated
from .eager import on_task, on_task_for
from .errors import APIError, BackendError
from .event_frames import ResponseFrames
from .events import Event, EventSequence, OutputAssembler, Sent, new_id, not_stored, response_object
from .history import History
from .requests import CreateRequest
from .state import ConnectionCache, ResponseState
from .steer import SteerSlot
from .tokens import Counted, TokenCount, account
from .tools import restore_calls, restores_calls
from .turn_plan import TurnEnv, TurnPlan, TurnResult
from .turn_prepare import plan_turn
from .turn_settings import SettingsMemo

log = logging.getLogger(__name__)


async def _close_layers(
    deltas: AsyncGenerator[Any, None], restored: AsyncGenerator[Any, None], raw: AsyncGenerator[Any, None]
) -> None:
    """Close the backend stream's layers outermost first, each whichever raises, as nested `contextlib.aclosing`s
    would; restoring calls and gating on checks are most often no layer at all (the stream itself), closed once."""
    try:
        if deltas is not restored:
            await deltas.aclose()
    finally:
        try:
            if restored is not raw:
                await restored.aclose()
        finally:
            await raw.aclose()


class Turn:
    """Runs one `response.create`: `run` pushes its events to a sender, `events()` gives them to a reader."""

    def __init__(
        self,
        request: CreateRequest,
        env: TurnEnv,
        cache: ConnectionCache | None,
        *,
        stream_id: str | None = None,
        transport: str = "websocket",
        connection_id: str | None = None,
        tenant: str | None = None,
        memo: SettingsMemo | None = None,
    ) -> None:
        self.request = request
        self.env = env
        self.cache = cache
        self.transport = transport
        self.connection_id = connection_id
        self.tenant = tenant
        self.memo = memo
        """The connection's derivation from the settings, reused while they stay the same (`turn_settings`)."""
        self.seq = EventSequence(stream_id)
        self.result = TurnResult()
        self._started = time.monotonic()
        self._first_token: float | None = None
        self._deployment: str | None = None
        self._sent: BackendRequest | None = None
        self._plan: TurnPlan | None = None
        self.response_id: str | None = None
        """Set when `events()` starts the response."""
        self.steering: SteerSlot | None = None
        """Steering queued on this response (WebSocket only); checked between deltas."""
        self._assembler: OutputAssembler | None = None
        self._created_at = 0.0
        self._encoded = False  # the events go out encoded (`run(encoded=True)`)
        self._frames: ResponseFrames | None = None
        self._counted: Counted | None = None
        self._produced = 0
        """Text and tool-call deltas streamed so far: the output tokens of a response cut short."""
        self.ends_at_stop_sequence = False
        """Set by a caller that stops reading because the text reached a `stop` sequence (the chat route):
        the response it cuts short is then `completed` there, not `cancelled` as for a client gone."""

    async def prepare(self) -> None:
        """Everything before inference (`turn_prepare`); raises `APIError` and leaves all state untouched."""
        if self._plan is None:
            self._plan = await plan_turn(self.request, self.env, self.cache, self.tenant, self.result, self.memo)

    @property
    def history(self) -> History:
        """The conversation through this turn's input, as the backend gets it (after `prepare`)."""
        assert self._plan is not None, "prepare() first"
        return self._plan.history

    @property
    def sent_tools(self) -> list | None:
        """The chat tools the backend gets (after `prepare`)."""
        assert self._plan is not None, "prepare() first"
        return self._plan.chat_tools

    def events(self) -> AsyncGenerator[list[Event], None]:
        """The response's events as dicts, for the paths that read them (HTTP, chat), in batches (see `run`)."""
        return cast(AsyncGenerator[list[Event], None], pulled(self.run))

    async def run(
        self,
        emit: Emit,
        send: Send,
        started: Callable[[str, str | None], SteerSlot | None] | None = None,
        *,
        encoded: bool = False,
    ) -> None:
        """Run the response, pushing its events in batches of those ready together to `emit`, which sends one at
        once when it can, else to `send`, awaited; `started` gets the response's id and lane before its first
        batch, and gives the slot its steering is queued in (`Steering.begin`); `encoded`: a message's and the
        Response object's as the WebSocket sends them (`event_frames`).

        The batches: the start, with a reply ready at once (`_walked`), each delta's when they stream, the
        close, the end (after the close when the store is awaited). A layer per event, or a generator to pull
        the batches through, is what a 1-token turn spends most on: the WebSocket is pushed to, the HTTP
        paths pull (`batches.pulled`). Raises `APIError` before the response starts (nothing changed then), and
        whatever `emit` and `send` raise.
        """
        self._encoded = encoded
        plan = self._plan
        if plan is None:  # `prepare`'s work, without its coroutine (~1,000 instructions)
            plan = self._plan = await plan_turn(self.request, self.env, self.cache, self.tenant, self.result, self.memo)
        checks = NOTHING_PENDING
        if plan.later_checks:
            checks = PendingChecks.start(plan.later_checks, plan.prior_checks, plan.prior_output, plan.new_items)
        counter = self.env.token_counter(self.request.model)
        if counter is not None:  # else the plan's count of nothing stands
            plan.counting = TokenCount.start(counter, plan.previous, plan.new_messages, self.request.instructions)
        try:
            batch = self._start(plan)
            if started is not None:
                self.steering = started(cast(str, self.response_id), self.seq.stream_id)
            assembler = self._assembler = OutputAssembler(self.seq, encoded=self._encoded)
            steered = False
            ready: Sequence[Delta] | None = None
            stages = self.result.stages
            stages.restart()
            if self.request.generate is not False:
                try:
                    self._sent = plan.backend_request(self.request, self.connection_id, stages)
                    ready = None if emit is unsent else self._ready(plan, checks)
                except Exception as exc:
                    failure: BackendError | APIError | None = self._failure(exc)
                else:
                    if ready is not None:  # pushed and ready at once: walked, its events sent with the start
                        failure = self._walked(ready, plan, assembler, batch)
                    else:
                        failure, steered = await self._streamed(plan, checks, assembler, emit, send, batch)
                        batch = []
                stages.mark("stream" if stages.first_token is not None else "backend_ttft")
                self._deployment = self.result.deployment = plan.deployment
                if failure is not None:
                    batch += self._fail(failure, assembler)
                    if not emit(batch):
                        await send(batch)
                    return
            if ready is None or checks.started_any or counter is not None:  # something may wait before the close
                if batch and not emit(batch):
                    await send(batch)
                batch = []
            # else a reply walked at once: its events go with the close's, one batch (one send call fewer)
            if checks.started_any:  # a coroutine awaited costs ~1,000 instructions, even one with nothing to do
                try:
                    await checks.outcome(plan.checks)
                except APIError as error:  # a check that does not hold the first token refused (or failed) late
                    if not emit(batch := self._fail(error, assembler)):
                        await send(batch)
                    return
            counted = await plan.counting.result() if counter is not None else None
            reason = self._outcome(plan, checks, steered, counted)
            batch += assembler.close("incomplete" if reason == "max_output_tokens" else "completed")
            if plan.echoed["store"]:  # the end waits for the store (`request.stores`): what is ready goes first
                if batch and not emit(batch):
                    await send(batch)
                batch = []
            final, usage, state = self._final(plan, reason)
            if self.request.stores:  # a coroutine only for the turns that have something to await
                await self._store(state, final)
            batch.append(self._ended(final, usage, reason))
            if not emit(batch):
                await send(batch)
        finally:
            self.env.running.ended(self.response_id)
            if self.response_id is not None and self.result.response is None:
                self._abandoned(plan)
            if checks is not NOTHING_PENDING:
                checks.cancel()
            if counter is not None:
                plan.counting.cancel()

    def _walked(
        self, ready: Sequence[Delta], plan: TurnPlan, assembler: OutputAssembler, held: list[Sent]
    ) -> BackendError | APIError | None:
        """A reply ready at once, walked without waiting for anything: its events join `held` (the start), sent in
        one batch (one write, not one per delta). Why it failed, if it did (a malformed reply: the turn reports
        it). Steering is not looked for: nothing waits from `started` to the end of the walk, so nothing can
        queue it. Only a pushed turn walks: a reader that pulls may stop at any delta (the chat path at a stop
        sequence), so it gets each delta's events alone, as a stream gives them (`_streamed`)."""
        for delta in ready:
            try:
                batch = self._took(delta, plan, assembler)
            except Exception as exc:
                return self._failure(exc)
            if batch:
                held += batch
        return None

    async def _streamed(
        self,
        plan: TurnPlan,
        checks: PendingChecks,
        assembler: OutputAssembler,
        emit: Emit,
        send: Send,
        held: list[Sent],
    ) -> tuple[BackendError | APIError | None, bool]:
        """The backend's stream through its layers (calls restored, checks gated), after `held` (the start): each
        delta's events sent as they come. Why it failed (the backend, a check's refusal, a malformed stream: the
        turn reports it, it must not hang it), and whether steering stopped it at a safe output boundary (the
        successor takes the input). A failed send is not the backend's: it is never caught here as one."""
        if not emit(held):
            await send(held)
        try:
            raw = self.env.backend.stream(cast(BackendRequest, self._sent))
            restored = restore_calls(raw, plan.tools, self.request.max_tool_calls)
            deltas = gated(restored, checks)
        except Exception as exc:
            return self._failure(exc), False
        failure: BackendError | APIError | None = None
        steered = False
        try:
            await on_task()  # any backend (one given to `create_app`, no router between) may need a current task
            while True:
                try:
                    batch = self._took(await anext(deltas), plan, assembler)
                except StopAsyncIteration:
                    break
                except Exception as exc:
                    failure = self._failure(exc)
                    break
                if batch and not emit(batch):
                    await send(batch)
                if self.steering is not None and self.steering.queued and not assembler.in_tool_call:
                    steered = True  # a safe output boundary: stop here, the successor takes the input
                    break
        finally:
            try:
                await _close_layers(deltas, restored, raw)
            except Exception as exc:
                failure = failure or self._failure(exc)
        return failure, steered

    def _failure(self, exc: Exception) -> BackendError | APIError:
        """What failed the backend's part of the turn, as the client is told (called where `exc` is handled)."""
        if isinstance(exc, CheckRefused):
            return exc.error
        if isinstance(exc, BackendError):
            return exc
        log.exception("backend %s raised unexpectedly", self.env.backend.name)
        return BackendError(f"backend failed: {type(exc).__name__}: {exc}", retryable=False)

    def _ready(self, plan: TurnPlan, checks: PendingChecks) -> Sequence[Delta] | None:
        """The backend's whole reply when it has it at once (`RepliesAtOnce`: the router over the unpaced
        simulator) and nothing goes between it and the turn (no call to restore, no check to wait for);
        None when the turn reads `stream` through those layers. A `ready` with layers to go through is
        not asked: it would route and measure a reply the stream then routes again."""
        if checks.blocking is not None or restores_calls(plan.tools, self.request.max_tool_calls):
            return None  # a check to wait for (`gated`), or calls to restore (`restore_calls`)
        ready = getattr(self.env.backend, "ready", None)
        assert self._sent is not None
        return None if ready is None else ready(self._sent)

    def _took(self, delta: Delta, plan: TurnPlan, assembler: OutputAssembler) -> list[Sent] | None:
        """One delta read, from a stream or a reply ready at once: the route kept, the first token and the
        output counted; the events it makes ready, if any."""
        if isinstance(delta, (Carry, Routed)):
            plan.route(delta)
            return None
        if self._first_token is None:
            self._first_token = time.monotonic()
        if isinstance(delta, (TextDelta, ToolCallDelta)):
            self._produced += 1
        ready = assembler.feed(delta)
        if ready:
            self.result.stages.mark_first_token()
        return ready

    def _start(self, plan: TurnPlan) -> list[Sent]:
        """Start the response: its id, and the Response object `in_progress` in `created` and `in_progress`."""
        request = self.request
        response_id = self.response_id = new_id("resp")
        if request.stores:
            self.env.running.started(response_id, self.tenant)
        self._created_at = time.time()
        self._started = time.monotonic()
        if self._encoded:
            self._frames = ResponseFrames(response_id, int(self._created_at), plan.echoed, self.seq, plan.derived)
            started = self._frames.started(request, plan.labels)
            if started is not None:
                return started
        pending = response_object(
            response_id,
            request,
            status="in_progress",
            created_at=self._created_at,
            labels=plan.labels,
            echoed=plan.echoed,
        )
        return [self.seq("response.created", response=pending), self.seq("response.in_progress", response=pending)]

    def _outcome(self, plan: TurnPlan, checks: PendingChecks, steered: bool, counted: Counted | None) -> str | None:
        """After the checks held: the labels and the token count in; why the response is incomplete, if it is."""
        plan.labels.update(plan.checks.labels)
        if plan.later_checks:
            self.result.plugin_s["check_beside_inference"] = checks.seconds
        plan.tokens = counted.through if counted else None
        self._counted = counted
        assert self._assembler is not None
        if steered:
            return "steered"
        return "max_output_tokens" if self._assembler.finish == "length" else None

    def _final(self, plan: TurnPlan, reason: str | None) -> tuple[dict[str, Any], Usage | None, ResponseState]:
        """The final Response object, its usage, and its state, cached (stored next, when the request stores)."""
        assembler = self._assembler
        assert assembler is not None and self.response_id is not None
        self.result.stages.restart()
        usage = account(assembler.usage, self._counted)
        final = response_object(
            self.response_id,
            self.request,
            status="incomplete" if reason else "completed",
            output=assembler.output,
            usage=usage,
            incomplete_reason=reason,
            created_at=self._created_at,
            labels=plan.labels,
            echoed=plan.echoed,
            memo=plan.derived,
        )
        state = plan.state(final, self.request, self.tenant)
        if self.cache is not None:
            self.cache.put(state)
        return final, usage, state

    def _ended(self, final: dict[str, Any], usage: Usage | None, reason: str | None) -> Sent:
        """The terminal event, once the response is cached and stored, and metered before the client has it."""
        assembler = self._assembler
        assert assembler is not None
        self.result.response = final
        self.result.stages.mark("finalize")
        self._post_inference(final, usage)  # before the client has it: usage is never lost
        kind = "response.incomplete" if reason else "response.completed"
        encoded = self._frames.ended(kind, final, assembler.output_json) if self._frames else None
        return encoded or self.seq(kind, response=final)

    def _abandoned(self, plan: TurnPlan) -> None:
        """The caller stopped the response: it is metered all the same, as `cancelled` (its client went away)
        or `completed` (at a stop sequence).

        The output tokens are the backend's figure when it sent one, else one per delta streamed; the
        input tokens the count beside inference when it finished, else the sent history's bytes / 4.
        """
        status = "completed" if self.ends_at_stop_sequence else "cancelled"
        if self._deployment is None and self._sent is not None:  # stopped before the router said who served it
            self._deployment = self.result.deployment = self._sent.served_by
        assembler = self._assembler or OutputAssembler(self.seq)
        assembler.close("completed" if self.ends_at_stop_sequence else "incomplete")
        counted = plan.counting.done()
        usage = assembler.usage or Usage(
            input_tokens=counted.input_tokens if counted else plan.sent_history.items_held // 4,
            output_tokens=self._produced,
            estimated=True,
        )
        assert self.response_id is not None
        cancelled = response_object(
            self.response_id,
            self.request,
            status=status,
            output=assembler.output,
            usage=usage,
            created_at=self._created_at,
        )
        self.result.response = cancelled
        self._post_inference(cancelled, usage)

    def _post_inference(self, response: dict[str, Any], usage: Usage | None) -> None:
        """Hand the response over with who and where, how long, and whether `usage` is estimated: what sinks and
        the usage ledger record (`TurnInfo`)."""
        self.env.post_inference.record(
            response,
            self.transport,
            self.tenant,
            self.connection_id,
            self._deployment,
            None if self._first_token is None else self._first_token - self._started,
            time.monotonic() - self._started,
            usage is not None and usage.estimated,
        )

    def _fail(self, exc: BackendError | APIError, assembler: OutputAssembler) -> list[Sent]:
        """A failed turn: close what was open, report `response.failed` then the error.

        A backend failure evicts the parent from the cache; a check's refusal (an `APIError`) leaves
        the connection and its cache as they were.
        """
        response_id = self.response_id
        assert response_id is not None
        log.warning("turn %s failed: %s", response_id, exc)
        error = exc if isinstance(exc, APIError) else exc.api_error()
        if isinstance(exc, BackendError) and self.request.previous_response_id and self.cache is not None:
            self.cache.evict(self.request.previous_response_id)
            metrics.CACHE_EVICTIONS.labels("failed_turn").inc()
        events = assembler.close("incomplete")
        failed = response_object(
            response_id,
            self.request,
            status="failed",
            output=assembler.output,
            usage=assembler.usage,
            error={"code": error.code, "message": error.message, "param": error.param, "type": error.type},
            created_at=self._created_at,
        )
        self.result.response = failed
        self.result.error = error
        events.append(self.seq("response.failed", response=failed))
        events.append(self.seq("error", status=error.status, error=error.body()))
        self._post_inference(failed, assembler.usage)
        return events

    async def _store(self, state: ResponseState, response: dict[str, Any]) -> None:
        """Save the response for other connections and replicas; one the store cannot take is marked so."""
        try:
            await on_task_for(self.env.store)
            await self.env.store.save(state)
        except APIError as error:  # the store is away: this connection can still continue from its cache
            metrics.STORE_OPERATIONS.labels("save", "error").inc()
            log.warning("response %s completed but not stored: %s", state.id, error)
            not_stored(response, error.code)
        else:
            metrics.STORE_OPERATIONS.labels("save", "ok").inc()
