"""Metric values as the shim keeps them: doubles updated in place, and labelled children looked up once.

prometheus-client's own values make a float per update and its `labels()` validates and locks on every
call; these are what `metrics` wraps its metrics in.
"""

from __future__ import annotations

import threading
from array import array
from typing import Any

from prometheus_client import values as client_values


class InPlaceValue:
    """A metric value kept as a C double and updated in place: what prometheus-client's `MutexValue` does, minus
    a new float object per update.

    `MutexValue` replaces its float at every `inc`, so each counter, bucket and sum holds the float its
    last update made: after a burst of clients that is a long-lived object allocated wherever pymalloc
    had room during the burst, and a handful of them keep the allocator from returning the 1 MiB arenas
    the burst opened (README, "Load"). Here the double lives in a buffer made once with the metric.
    """

    _multiprocess = False
    __slots__ = ("_cell", "_exemplar", "_lock")

    def __init__(self, value: float = 0.0) -> None:
        self._cell = array("d", (value,))
        self._exemplar: Any = None
        self._lock = threading.Lock()

    def inc(self, amount: float) -> None:
        with self._lock:
            self._cell[0] += amount

    def set(self, value: float, timestamp: float | None = None) -> None:
        with self._lock:
            self._cell[0] = value

    def get(self) -> float:
        with self._lock:
            return self._cell[0]

    def set_exemplar(self, exemplar: Any) -> None:
        with self._lock:
            self._exemplar = exemplar

    def get_exemplar(self) -> Any:
        with self._lock:
            return self._exemplar


def in_place(metric: Any) -> Any:
    """`metric` (an unlabelled metric or a child) with its `MutexValue`s turned into `InPlaceValue`s.

    Values of other kinds are left as they are: the multiprocess ones already live in a shared file.
    """
    for name in ("_value", "_sum", "_count"):
        value = getattr(metric, name, None)
        if type(value) is client_values.MutexValue:
            setattr(metric, name, InPlaceValue(value.get()))
    buckets = getattr(metric, "_buckets", None)
    if isinstance(buckets, list):
        buckets[:] = [InPlaceValue(b.get()) if type(b) is client_values.MutexValue else b for b in buckets]
    return metric


class Labelled:
    """A labelled metric whose children are looked up once per label values.

    prometheus-client's `labels()` validates and locks on every call (about 3 us); a turn records a
    dozen labelled values, so the children are kept here. Label values are bounded sets (stages,
    deployments, transports, statuses, error codes), so the dict stays small. Each child's values
    are `InPlaceValue`s.
    """

    def __init__(self, metric: Any) -> None:
        self.metric = metric
        self._children: dict[tuple[str, ...], Any] = {}

    def labels(self, *values: str) -> Any:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = in_place(self.metric.labels(*values))
        return child
