"""Backend faults against a misbehaving server on loopback: the breaker counts only the backend's own
failures, clients see sanitized errors, and deadlines end stalled or trickling streams."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import time
from collections.abc import AsyncIterator, Iterator

import pytest
from openai import APIStatusError, AsyncOpenAI, InternalServerError
from support.chat_server import closed_port
from support.fault_backend import LEAKY_ERROR, MODEL, FaultBackend
from support.wire import API_KEY, completed_ok, run_turn

from server_shim.backends.base import TextDelta
from server_shim.backends.sse import bounded_lines
from server_shim.config import DeploymentConfig, RoutingConfig, ShimConfig
from server_shim.deadlines import FIRST_TOKEN, TOTAL, DeadlineExceeded, Deadlines, Timer, Watch, within
from server_shim.errors import BackendError, redact


def config(base_url: str, **deployment: float) -> ShimConfig:
    return ShimConfig(
        deployments=[
            DeploymentConfig(
                name="faulty", kind="openai_compatible", base_url=base_url, models={"*": "*"}, **deployment
            )
        ],
        routing=RoutingConfig(failure_threshold=3, cooldown_s=30),
    )


@pytest.fixture
def backend() -> Iterator[FaultBackend]:
    with FaultBackend() as server:
        yield server


# --- deadlines as a decision ---------------------------------------------------------------------


def test_the_first_token_deadline_applies_until_a_token_then_the_total_one():
    deadlines = Deadlines(first_token_s=5, total_s=20)
    assert deadlines.next(started=100, first_token_at=None, now=101) == (4, FIRST_TOKEN)
    assert deadlines.next(started=100, first_token_at=103, now=110) == (10, TOTAL)
    assert deadlines.next(started=100, first_token_at=None, now=100) == (5, FIRST_TOKEN)
    assert Deadlines(first_token_s=30, total_s=10).next(100, None, 100) == (10, TOTAL)


async def test_the_wrapper_cancels_the_read_and_raises_a_504_backend_fault():
    closed = asyncio.Event()

    async def stalled():
        try:
            await asyncio.sleep(60)
            yield None
        finally:
            closed.set()

    with pytest.raises(BackendError) as caught:
        async for _ in within(stalled(), Deadlines(0.05, 1.0), time.monotonic):
            pass
    assert caught.value.status == 504 and caught.value.backend_fault
    assert caught.value.api_error().code == "backend_timeout"
    assert closed.is_set(), "the stalled read was cancelled, its resources released"


async def texts_until_deadline(
    stream: AsyncIterator[TextDelta], deadlines: Deadlines, busy_after_first_s: float = 0.0
) -> tuple[list[str], BackendError]:
    """The texts `within` let through, and the error it ended with; the caller can hold the first delta busy."""
    got = []
    with pytest.raises(BackendError) as caught:
        async for delta in within(stream, deadlines, time.monotonic):
            got.append(delta.text)
            if len(got) == 1:
                time.sleep(busy_after_first_s)  # blocks the loop, as a caller busy with the delta does
    return got, caught.value


async def test_after_the_first_token_only_the_total_deadline_counts():
    async def slow_after_the_first():
        yield TextDelta("a")
        await asyncio.sleep(0.15)  # past the first-token deadline, well inside the total one
        yield TextDelta("b")
        await asyncio.sleep(60)
        yield TextDelta("never")

    got, error = await texts_until_deadline(slow_after_the_first(), Deadlines(0.05, 0.5))
    assert got == ["a", "b"]
    assert "total deadline of 0.5 s" in str(error)


async def test_a_deadline_passing_while_the_caller_holds_a_delta_cuts_the_next_read_that_waits():
    async def ready_then_waiting():
        yield TextDelta("a")
        yield TextDelta("ready at once")
        await asyncio.sleep(0.01)
        yield TextDelta("never")

    got, error = await texts_until_deadline(ready_then_waiting(), Deadlines(1.0, 0.1), busy_after_first_s=0.15)
    assert got == ["a", "ready at once"], "a delta ready at once still goes through"
    assert error.status == 504 and "total" in str(error)


async def test_a_cancellation_from_outside_is_not_a_deadline():
    started = asyncio.Event()

    async def stalled():
        started.set()
        await asyncio.sleep(60)
        yield None

    async def consume() -> None:
        async for _ in within(stalled(), Deadlines(0.2, 0.4), time.monotonic):
            pass

    task = asyncio.create_task(consume())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0.3)  # the deadline's timer went with the stream: nothing fires later


@pytest.mark.parametrize("outside_first", [True, False])
async def test_a_cancellation_from_outside_in_the_same_step_as_the_deadline_stays_a_cancellation(outside_first):
    """Review finding: an outside cancel landing just before the deadline fired (both ready in one loop step)
    was swallowed into a retryable `DeadlineExceeded` (the router failed over for a caller that had gone).
    Either order in that step, the caller's cancellation wins."""
    loop = asyncio.get_running_loop()
    clock = Clock()
    timer = Timer(loop, clock)
    reading = asyncio.Event()

    async def reader() -> None:
        watch = Watch(Deadlines(0.2, 10.0), timer, clock())
        try:
            watch.waiting = True
            reading.set()
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                watch.cut()
                raise
        finally:
            watch.close()

    task = asyncio.create_task(reader())
    await reading.wait()
    clock.now += 0.3
    if outside_first:
        task.cancel()
        timer._fire()
    else:
        timer._fire()
        task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


class Clock:
    """A clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_the_timer_picks_the_watches_past_due_by_its_own_clock_and_the_first_token_moves_one_later():
    clock = Clock()
    timer = Timer(asyncio.get_running_loop(), clock)
    soon = Watch(Deadlines(first_token_s=5, total_s=20), timer, clock.now)
    later = Watch(Deadlines(first_token_s=30, total_s=10), timer, clock.now)  # the total deadline is the nearer
    assert (soon.due, later.due) == (105, 110)
    soon.token(101)  # from now on only its total deadline counts
    clock.now = 112
    past, earliest = timer.due(clock.now)
    assert past == [later] and earliest == 120, "the first token moved the first watch to its total deadline"
    assert timer.due(clock.now) == ([], 120), "a watch past due is handed out once"
    soon.close()
    assert timer.due(1_000) == ([], math.inf), "a closed watch is no longer watched"
    assert timer.handle is not None
    timer.handle.cancel()


async def test_a_first_token_after_the_first_token_deadline_fired_is_watched_again_until_the_total_one():
    clock = Clock()
    timer = Timer(asyncio.get_running_loop(), clock)
    watch = Watch(Deadlines(first_token_s=5, total_s=20), timer, clock.now)
    clock.now = 106
    timer._fire()  # the first-token deadline passed (no read waiting: nothing cancelled)
    assert watch.expired and watch not in timer.watches
    watch.token(106)  # a token that came in the same loop step
    assert not watch.expired and watch in timer.watches and watch.due == 120
    assert timer.armed_at == 120, "armed again at the total deadline"
    clock.now = 121
    assert timer.due(clock.now) == ([watch], math.inf)
    watch.close()
    timer.settle()
    assert timer.handle is None


async def test_one_timer_cuts_each_stream_at_its_own_deadline_the_later_one_armed_sooner_included():
    timer = Timer(asyncio.get_running_loop(), time.monotonic)

    async def stalled():
        await asyncio.sleep(60)
        yield TextDelta("never")

    async def read(deadlines: Deadlines) -> tuple[str, float]:
        started = time.monotonic()
        watch = Watch(deadlines, timer, started)
        stream = stalled()
        try:
            watch.waiting = True
            await anext(stream)
        except asyncio.CancelledError:
            try:
                watch.cut()
            except DeadlineExceeded as exc:
                return exc.which, time.monotonic() - started
            raise
        finally:
            watch.close()
            await stream.aclose()
        raise AssertionError("the stalled read ended")

    slow = asyncio.create_task(read(Deadlines(first_token_s=5, total_s=0.6)))
    await asyncio.sleep(0.05)  # the timer is armed for the first stream's deadline, then one due sooner comes
    (which, took), (slow_which, slow_took) = await asyncio.gather(read(Deadlines(0.1, 5)), slow)
    assert which == FIRST_TOKEN and 0.1 <= took < 0.5
    assert slow_which == TOTAL and 0.55 <= slow_took < 1.5
    assert not timer.watches


# --- what a backend's error text may tell the client ------------------------------------------------


@pytest.mark.parametrize(
    ("said", "shown"),
    [
        ("invalid api key sk-live-SECRET for this org", "invalid api key <secret> for this org"),
        ("stripe says sk_live_51HabcXYZ", "stripe says <secret>"),
        ("Authorization: Bearer abc.def-ghi was refused", "Authorization: Bearer <secret> was refused"),
        ("authorization=Basic dXNlcjpwYXNz", "authorization=Basic <secret>"),
        ('{"api_key": "hunter2", "x-api-key":"k9"}', '{"api_key": "<secret>", "x-api-key":"<secret>"}'),
        ("password=p4ss; retry", "password=<secret>; retry"),
        ("token eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.sig", "token <secret>"),
        ("request 0123456789abcdef0123456789abcdef failed", "request <secret> failed"),
        ("bad key QmFzZTY0U2VjcmV0S2V5VGhhdElzTG9uZzEyMzQ1Ng== given", "bad key <secret> given"),
        ("keys AKIAIOSFODNN7EXAMPLE and ghp_abcdefghijklmnopqrstuvwxyz0123456789", "keys <secret> and <secret>"),
        ("context too long for /srv/models/a.gguf on 10.1.2.3:8080", "context too long for <path> on <address>"),
        # what a client needs stays: counts, model names, field names, ordinary words
        ("maximum context length is 8192 tokens, you requested 9000 tokens", None),
        ("model gpt-4o-mini-2024-07-18 does not support key-value 'logit_bias'", None),
        ("missing key: 'messages'", None),
    ],
)
def test_a_backend_error_message_is_shown_without_secrets_addresses_or_paths(said, shown):
    assert redact(said) == (said if shown is None else shown)


def test_only_the_start_of_a_long_backend_error_is_read_and_shown():
    shown = redact("x" * 100_000 + " sk-live-SECRET", limit=50)
    assert len(shown) == 50 and "SECRET" not in shown


# --- the breaker and the errors over a real server -----------------------------------------------


async def test_backend_4xx_goes_to_that_client_only_and_never_opens_the_breaker(make_server, backend, caplog):
    shim = make_server(config=config(backend.base_url))
    backend.queue.extend(["http_400"] * 5)
    caplog.set_level(logging.WARNING)
    async with (
        AsyncOpenAI(base_url=shim.base_url, api_key=API_KEY, max_retries=0) as sdk,
        sdk.responses.connect() as conn,
    ):
        for _ in range(5):
            turn = await run_turn(conn, model=MODEL, input="too long", store=False)
            error = turn.error["error"]
            assert error["code"] == "backend_rejected_request" and "status 400" in error["message"]
            assert "context too long" in error["message"], "the backend's reason reaches the client"
            for leak in ("/srv/models", "10.1.2.3", "SECRET"):
                assert leak not in error["message"] and leak not in str(turn.response["error"])
            assert turn.response["error"] == {k: error[k] for k in ("code", "message", "param", "type")}, "agree"
        completed_ok(await run_turn(conn, model=MODEL, input="a fine request", store=False))
    assert LEAKY_ERROR in caplog.text, "the full backend body is logged for the operator"


async def test_backend_5xx_do_open_the_breaker(make_server, backend, caplog):
    with_password = backend.base_url.replace("http://", "http://operator:hunter2@")
    shim = make_server(config=config(with_password))
    backend.queue.extend(["http_500"] * 3)
    caplog.set_level(logging.WARNING)
    async with (
        AsyncOpenAI(base_url=shim.base_url, api_key=API_KEY, max_retries=0) as sdk,
        sdk.responses.connect() as conn,
    ):
        for _ in range(3):
            turn = await run_turn(conn, model=MODEL, input="x", store=False)
            assert turn.error["error"]["code"] == "backend_error"
            assert turn.error["error"]["message"] == "The backend of deployment 'faulty' failed (status 500)."
        refused = await run_turn(conn, model=MODEL, input="x", store=False)
        assert refused.error["error"]["code"] == "backend_unavailable"
        message = refused.error["error"]["message"]
        assert re.fullmatch(
            r"deployment 'faulty' unavailable: breaker open after 3 faults, retry after \d+\.\d s", message
        )
    assert backend.requests == 3, "the open breaker sent nothing more to the failing backend"
    assert LEAKY_ERROR in caplog.text and backend.base_url.removeprefix("http://") in caplog.text, "for the operator"
    assert "hunter2" not in caplog.text, "the URL's password never reaches the log"


async def test_a_backend_that_is_down_says_connection_refused_then_breaker_open_naming_the_deployment(make_server):
    down = f"http://127.0.0.1:{closed_port()}/v1"
    shim = make_server(config=config(down))
    async with AsyncOpenAI(base_url=shim.base_url, api_key=API_KEY, max_retries=0) as sdk:
        for _ in range(3):
            with pytest.raises(InternalServerError) as caught:
                await sdk.responses.create(model=MODEL, input="x", store=False)
            assert caught.value.status_code == 502
            assert (
                caught.value.body["message"]
                == "The backend was not reached: connection refused to deployment 'faulty'."
            )
        with pytest.raises(APIStatusError) as resting:
            await sdk.responses.create(model=MODEL, input="x", store=False)
    assert resting.value.status_code == 503 and resting.value.body["code"] == "backend_unavailable"
    assert resting.value.body["message"].startswith("deployment 'faulty' unavailable: breaker open after 3 faults")
    assert 1 <= float(resting.value.response.headers["retry-after"]) <= 30
    assert "127.0.0.1" not in str(caught.value.body) + str(resting.value.body), "no backend address reaches clients"


# --- deadlines over a real server ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "which"), [("trickle", "first-token"), ("stall", "first-token"), ("one_then_stall", "total")]
)
async def test_a_stalled_or_trickling_backend_fails_the_turn_within_its_deadline(make_server, backend, mode, which):
    shim = make_server(config=config(backend.base_url, first_token_timeout_s=0.6, response_timeout_s=1.2))
    backend.queue.append(mode)
    async with (
        AsyncOpenAI(base_url=shim.base_url, api_key=API_KEY, max_retries=0) as sdk,
        sdk.responses.connect() as conn,
    ):
        started = time.monotonic()
        turn = await run_turn(conn, model=MODEL, input="hello", store=False)
        elapsed = time.monotonic() - started
        assert turn.types[-2:] == ["response.failed", "error"]
        assert turn.error["status"] == 504 and turn.error["error"]["code"] == "backend_timeout"
        assert which in turn.error["error"]["message"]
        assert elapsed < (0.6 if which == "first-token" else 1.2) + 1.0
        completed_ok(await run_turn(conn, model=MODEL, input="the lane is free again", store=False))
    deadline = time.monotonic() + 3
    while backend.open_streams:
        assert time.monotonic() < deadline, "the backend stream was never closed"
        await asyncio.sleep(0.05)
    assert shim.shim.limiter.in_flight(None) == 0


# --- a stream line without an end ------------------------------------------------------------------


async def _chunks(*pieces: bytes):
    for piece in pieces:
        yield piece


async def test_lines_split_across_chunks_come_back_whole_with_crlf_removed():
    lines = [line async for line in bounded_lines(_chunks(b"data: a", b"bc\r\n\r\nda", b"ta: x\n", b"tail"))]
    assert lines == ["data: abc", "", "data: x", "tail"]


async def test_a_line_that_never_ends_is_a_malformed_stream_not_unbounded_memory():
    endless = _chunks(*([b"x" * 1024] * 100))
    with pytest.raises(BackendError, match="longer than 10000 bytes") as caught:
        async for _ in bounded_lines(endless, max_line_bytes=10_000):
            pass
    assert caught.value.backend_fault


async def test_a_stream_that_swallowed_a_cancellation_is_still_cut_at_its_deadline():
    """Review finding: a backend that swallows an outside cancellation and stalls kept its read past the
    deadline (3 s against 0.5 s). It is cut at the deadline, as the cancellation it swallowed."""

    async def stall() -> None:
        with contextlib.suppress(asyncio.CancelledError):  # a misbehaving backend
            await asyncio.sleep(0.1)
        await asyncio.sleep(30)

    async def reader(timer: Timer) -> None:
        watch = Watch(Deadlines(0.3, 1.0), timer, time.monotonic())
        try:
            watch.waiting = True
            try:
                await stall()
            except asyncio.CancelledError:
                watch.cut()
                raise
        finally:
            watch.close()

    task = asyncio.create_task(reader(Timer(asyncio.get_running_loop(), time.monotonic)))
    await asyncio.sleep(0.05)
    task.cancel()
    started = time.monotonic()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    assert time.monotonic() - started < 2
