"""Prometheus metrics (`GET /metrics`), all named `responses_ws_*`.

Recorded where the facts are known once: a finished turn's stages and tokens by `observe_turn`
(called by the app when the WebSocket or HTTP path is done with a turn), connections and lanes by
the connection loop, cache and store traffic by the turn, breaker state by the router.

Several worker processes: set `PROMETHEUS_MULTIPROC_DIR` to an empty directory shared by the
workers before they start (prometheus-client's multiprocess mode); `/metrics` then sums every
worker's values. Gauges say how they combine (`livesum`: the sum over live workers; `max`).
"""

from __future__ import annotations

import atexit
import bisect
import contextlib
import functools
import operator
import os
import shutil
import sys
import tempfile
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client import values as client_values

from .metric_values import Labelled, in_place

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


STAGES = ("resolve", "validate", "render", "route", "backend_ttft", "stream", "finalize")
"""A turn's stages in order; `backend_ttft` and `stream` are the backend's time, the rest the shim's."""
SHIM_STAGES = ("resolve", "validate", "render", "route", "finalize")

_FAST = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
_SLOW = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
BREAKER_STATES = {"closed": 0, "half_open": 1, "open": 2}

TURNS = Labelled(
    Counter(
        "responses_ws_turns",
        "Responses created, by transport, deployment and final status",
        ["transport", "deployment", "status"],
    )
)
STAGE_SECONDS = Labelled(
    Histogram(
        "responses_ws_turn_stage_seconds",
        "Time per turn in each stage of the pipeline",
        ["stage"],
        buckets=sorted({*_FAST, *_SLOW}),
    )
)
SHIM_OVERHEAD_SECONDS = in_place(
    Histogram(
        "responses_ws_shim_overhead_seconds",
        "Time per turn spent in the shim's own stages (resolve, validate, render, route, finalize)",
        buckets=_FAST,
    )
)
TTFT_SECONDS = Labelled(
    Histogram(
        "responses_ws_time_to_first_token_seconds",
        "From the request to the first output delta",
        ["deployment"],
        buckets=_SLOW,
    )
)
TURN_SECONDS = Labelled(
    Histogram(
        "responses_ws_turn_duration_seconds", "From the request to the terminal event", ["deployment"], buckets=_SLOW
    )
)
TOKENS = Labelled(
    Counter("responses_ws_tokens", "Tokens by deployment and kind (input, cached, output)", ["deployment", "kind"])
)
PLUGIN_SECONDS = Labelled(
    Histogram(
        "responses_ws_plugin_seconds",
        "Time per turn in validators, classifiers and checks (check: before inference; check_beside_inference)",
        ["kind"],
        buckets=_FAST,
    )
)
CONNECTIONS = in_place(
    Gauge("responses_ws_active_connections", "Open WebSocket connections", multiprocess_mode="livesum")
)
LANES = in_place(
    Gauge(
        "responses_ws_active_lanes",
        "Lanes (stream_id queues) with work, over all connections",
        multiprocess_mode="livesum",
    )
)
CACHE_LOOKUPS = Labelled(
    Counter(
        "responses_ws_cache_lookups",
        "previous_response_id lookups: hit (connection cache), store (loaded from the response store), miss",
        ["result"],
    )
)
CACHE_EVICTIONS = Labelled(
    Counter("responses_ws_cache_evictions", "Responses dropped from connection caches", ["reason"])
)
CACHE_BYTES = in_place(
    Gauge(
        "responses_ws_cache_bytes", "Bytes held by the connection caches (size estimate)", multiprocess_mode="livesum"
    )
)
STORE_OPERATIONS = Labelled(
    Counter("responses_ws_store_operations", "Response store reads and writes", ["operation", "result"])
)
BREAKER = Labelled(
    Gauge(
        "responses_ws_deployment_breaker_state",
        "Circuit breaker per deployment: 0 closed, 1 half open, 2 open",
        ["deployment"],
        multiprocess_mode="max",
    )
)
ERRORS = Labelled(Counter("responses_ws_errors", "Error events and error responses sent to clients, by code", ["code"]))
CLOSED_CONNECTIONS = Labelled(
    Counter(
        "responses_ws_closed_connections",
        "Connections the server closed on a client: head_timeout, body_timeout, slow_reader (client not reading)",
        ["transport", "reason"],
    )
)
BYTES_RECEIVED = Labelled(Counter("responses_ws_received_bytes", "Request bytes received, by transport", ["transport"]))


TRANSPORTS = ("websocket", "http")
STATUSES = ("completed", "incomplete", "failed", "cancelled")
TOKEN_KINDS = ("input", "cached", "output")
PLUGIN_KINDS = ("validator", "classifier", "check", "check_beside_inference")
LOOKUPS = ("hit", "store", "miss")
EVICTIONS = ("capacity", "failed_turn", "budget")
STORE_RESULTS = (("load", "hit"), ("load", "miss"), ("save", "ok"), ("delete", "hit"), ("delete", "miss"))


def prepare(deployments: Iterable[str]) -> None:
    """Make at start-up the children of every label set known then, so each series reads 0 until used.

    A child made during a burst of clients (the first cache hit of a chained turn, the first cached
    tokens) is a few dozen long-lived objects allocated in the burst's memory, and Python's allocator
    returns a 1 MiB arena only once nothing in it is alive. Made here, they sit with the rest of the
    start-up heap. Error codes and failure outcomes are left to be made when they first happen.
    """
    for deployment in deployments:
        for transport in TRANSPORTS:
            for status in STATUSES:
                TURNS.labels(transport, deployment, status)
        for kind in TOKEN_KINDS:
            TOKENS.labels(deployment, kind)
        TTFT_SECONDS.labels(deployment)
        TURN_SECONDS.labels(deployment)
    for labelled, values in (
        (STAGE_SECONDS, STAGES),
        (PLUGIN_SECONDS, PLUGIN_KINDS),
        (CACHE_LOOKUPS, LOOKUPS),
        (CACHE_EVICTIONS, EVICTIONS),
        (BYTES_RECEIVED, TRANSPORTS),
    ):
        for value in values:
            labelled.labels(value)
    for operation, result in STORE_RESULTS:
        STORE_OPERATIONS.labels(operation, result)


def observe_turn(
    transport: str,
    deployment: str,
    status: str,
    intervals: Iterable[tuple[str, float, float]],
    tokens: tuple[int, int, int],
    ttft_s: float | None,
    duration_s: float,
    plugin_s: Mapping[str, float] | None = None,
) -> None:
    """One finished turn: counted once, its stages observed once, whatever path it took.

    Takes what the turn already has: its stage clock's `(stage, start, end)` intervals (a stage marked
    twice is observed once, the sum, as `StageClock.seconds` says) and its (input, cached, output) tokens,
    so no dict is built per turn. The shim's overhead adds its own stages' seconds in the order marked, which
    is `SHIM_STAGES` order (the pipeline's).

    Held, not applied: each value appended to its label's list and each count added to its key's,
    no child looked up; `flush_turns` applies what up to `FLUSH_TURNS` turns observed in one pass (a
    histogram's buckets and sum once per batch, not twice per value under a lock), and `render`
    flushes first, so a scrape sees every finished turn. Workers sharing a multiprocess directory
    apply each turn at once, as another worker may be the one scraped.
    """
    global _held_turns
    key = (transport, deployment, status)
    _turn_counts[key] = _turn_counts.get(key, 0) + 1
    held = _stage_values
    seen: set[str] = set()
    shim = 0.0
    again = False
    for stage, start, end in intervals:
        seconds = end - start
        if stage in seen:  # marked again: one observation per turn, the sum
            held[stage][-1] += seconds
            again = True
        else:
            seen.add(stage)
            held[stage].append(seconds)
        if stage in _SHIM:
            shim += seconds
    if again:  # each stage's sum first, then theirs, in `SHIM_STAGES` order (the same float as without repeats)
        shim = sum(held[stage][-1] for stage in SHIM_STAGES if stage in seen)
    _shim_values.append(shim)
    if ttft_s is not None:
        _ttft_values[deployment].append(ttft_s)
    _turn_values[deployment].append(duration_s)
    counts = _token_counts.get(deployment)
    if counts is None:
        counts = _token_counts[deployment] = [0, 0, 0]
    input_tokens, cached_tokens, output_tokens = tokens
    counts[0] += input_tokens
    counts[1] += cached_tokens
    counts[2] += output_tokens
    if plugin_s:
        for kind, seconds in plugin_s.items():
            _plugin_values[kind].append(seconds)
    _held_turns += 1
    if _held_turns >= FLUSH_TURNS or SHARED_VALUES:
        flush_turns()


FLUSH_TURNS = 100
"""Turns held before their observations are applied (bounds what is held; a scrape applies them sooner). A divisor
of the 300 turns `benchmarks.instructions` counts, so the flushes of the turns it counts are in its count."""
SHARED_VALUES = client_values.ValueClass is not client_values.MutexValue
"""Values live in a multiprocess directory's files (prometheus-client decides when it is first imported)."""
_SHIM = frozenset(SHIM_STAGES)
_held_turns = 0
_turn_counts: dict[tuple[str, str, str], int] = {}
_token_counts: dict[str, list[int]] = {}
"""Tokens held per deployment, in `TOKEN_KINDS` order (each list made once, zeroed at each flush)."""
_stage_values: defaultdict[str, list[float]] = defaultdict(list)
_ttft_values: defaultdict[str, list[float]] = defaultdict(list)
_turn_values: defaultdict[str, list[float]] = defaultdict(list)
_plugin_values: defaultdict[str, list[float]] = defaultdict(list)
_shim_values: list[float] = []
"""Held values by label (a stage, a deployment, a plugin kind): each list made once, emptied at each flush."""
_added: dict[Any, float] = {}
_set_to: dict[Any, float] = {}
"""Counter and gauge updates held by the value they update (`add`, `set_later`), applied at each flush."""


def add(value: Any, amount: float = 1) -> None:
    """`value.inc(amount)` (a counter, a gauge or a labelled child) when the held turns are next applied (every
    `FLUSH_TURNS` turns and at every scrape): per request, a dict update rather than prometheus-client's checks
    and lock. At once in multiprocess mode (another worker may be the one scraped), as `observe_turn` does."""
    if SHARED_VALUES:
        value.inc(amount)
    else:
        _added[value] = _added.get(value, 0) + amount


def set_later(gauge: Any, value: float) -> None:
    """`gauge.set(value)`, held as `add` holds an increment (the last value set is the one applied)."""
    if SHARED_VALUES:
        gauge.set(value)
    else:
        _set_to[gauge] = value


def flush_turns() -> None:
    """Apply the held observations and updates: each counter once, each histogram's sum and buckets once."""
    global _held_turns
    _held_turns = 0
    for value, amount in _added.items():
        if amount:
            value.inc(amount)
    _added.clear()
    for gauge, to in _set_to.items():
        gauge.set(to)
    _set_to.clear()
    for (transport, deployment, status), count in _turn_counts.items():
        TURNS.labels(transport, deployment, status).inc(count)
    _turn_counts.clear()
    for deployment, counts in _token_counts.items():
        for index, kind in enumerate(TOKEN_KINDS):
            if counts[index]:
                TOKENS.labels(deployment, kind).inc(counts[index])
                counts[index] = 0
    for labelled, held in (
        (STAGE_SECONDS, _stage_values),
        (TTFT_SECONDS, _ttft_values),
        (TURN_SECONDS, _turn_values),
        (PLUGIN_SECONDS, _plugin_values),
    ):
        for label, values in held.items():
            if values:
                _observe_all(labelled.labels(label), values)
                values.clear()
    if _shim_values:
        _observe_all(SHIM_OVERHEAD_SECONDS, _shim_values)
        _shim_values.clear()


def _observe_all(histogram: Any, values: list[float]) -> None:
    """`observe` each value, done as prometheus-client does it (a value goes in the first bucket whose upper
    bound is >= it; the sum takes them all) but once per bucket; one by one if its internals differ.

    Sorts `values` in place: the count for each bucket is where its bound falls among them (C, not a loop per value).
    The bounds stop once every value is placed: the buckets above hold none of them, and a batch of one stage's
    seconds, or of the plugins' zeros, fills the first few of 14-22 (each bound looked for is a `bisect` call).
    """
    bounds, buckets, total = (getattr(histogram, name, None) for name in ("_upper_bounds", "_buckets", "_sum"))
    if bounds is None or buckets is None or total is None or len(bounds) != len(buckets):
        for value in values:
            histogram.observe(value)
        return
    total.set(_add_in_order(values, total.get()))
    values.sort()
    below, placed = 0, len(values)
    for bound, bucket in zip(bounds, buckets, strict=True):
        upto = bisect.bisect_right(values, bound)
        if upto > below:
            bucket.inc(upto - below)
            below = upto
            if below == placed:
                return


_add_in_order: Callable[[list[float], float], float] = (
    sum if sys.version_info < (3, 12) else lambda values, start: functools.reduce(operator.add, values, start)
)
"""`start + values[0] + values[1] + ...`, one addition at a time: the float sum observing each value makes. Python
3.11's `sum` adds floats so, in C (~30 instructions a value against ~220 for `reduce`); 3.12's compensates rounding."""


@contextlib.contextmanager
def multiprocess_dir() -> Iterator[str]:
    """`PROMETHEUS_MULTIPROC_DIR` for worker processes started inside: the operator's, or a fresh one removed after.

    Must be set before the workers import prometheus-client; uvicorn starts them fresh (spawn), so they do.
    """
    given = os.environ.get(MULTIPROC_ENV)
    if given:
        yield given
        return
    path = tempfile.mkdtemp(prefix="responses-ws-metrics-")
    os.environ[MULTIPROC_ENV] = path
    try:
        yield path
    finally:
        os.environ.pop(MULTIPROC_ENV, None)
        shutil.rmtree(path, ignore_errors=True)


def on_worker_exit() -> None:
    """In a worker: when it exits, drop its `livesum` gauges (open connections) from the shared sums."""
    if os.environ.get(MULTIPROC_ENV):
        atexit.register(multiprocess.mark_process_dead, os.getpid())


def render() -> tuple[bytes, str]:
    """The exposition text for `/metrics`: this process, or every worker's in multiprocess mode."""
    flush_turns()
    if os.environ.get(MULTIPROC_ENV):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
