"""The usage ledger: one record per finished response, durable across a crash, off the critical path.

A record is accepted synchronously (appended to this process's write-ahead journal, a few
microseconds and no fsync: it survives the process being killed, which is what the journal is
for) and queued; a background task writes queued records in batches to the ledger (a SQLite
file, or a Redis stream when the store is Redis), every `flush_interval_s` or as soon as `batch`
records wait. Each record's id is its response id and every write is idempotent, so replaying a
journal after a crash counts nothing twice.

A record is a named tuple and its journal line a JSON array of its values in field order: one
tuple made per turn and one `orjson` call on it (a frozen dataclass set each of its 14 fields
through `object.__setattr__`, and orjson walked its fields by name), and SQLite takes the tuple as
the row. Lines an earlier version wrote as JSON objects are still read.

Journal segments: `<dir>/<pid>-<token>-<n>.jsonl`, each locked (`flock`) by the journal writing it; the
random token keeps two ledgers of one process (several apps, or tests) from writing each other's files.
A flush ends the current segment (the next record opens a new one), writes its records, then deletes it. At start-up a
process replays and deletes every segment no live process holds (what a killed one left).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import orjson

from .trim import Count, Counts

log = logging.getLogger(__name__)


class UsageRecord(NamedTuple):
    """What billing needs about one response; `id` (the response id) makes writes idempotent."""

    id: str
    created_at: float
    tenant: str | None
    model: str
    deployment: str | None
    status: str
    transport: str
    connection_id: str | None
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    ttft_ms: float | None
    duration_ms: float
    estimated: bool = False
    """The token counts are estimates, not the backend's report or the configured tokenizer's count:
    a response cut short (`cancelled`: one output token per streamed delta), a backend that sent no
    usage (the simulator always), or output tokens a chat backend left uncounted."""

    @classmethod
    def from_json(cls, data: dict[str, Any] | list[Any]) -> UsageRecord:
        """A journal line or stream entry: the values in field order (an array), or an object by field name."""
        if isinstance(data, list):
            return cls(*data[: len(cls._fields)])
        return cls(**{k: v for k, v in data.items() if k in cls._fields})


class LedgerSink(Protocol):
    """Where records end up. `write` must be idempotent on `UsageRecord.id`; it may block (run in a thread)."""

    def write(self, records: list[UsageRecord]) -> None: ...

    def close(self) -> None: ...


class Journal:
    """This process's write-ahead segments; `append` is one `write(2)` on an O_APPEND descriptor.

    After a rotation the next segment is opened by the first `append`, not at once: an idle server
    then holds no segment, and no name or number made while the last burst of turns was written
    (Python's allocator gives a 1 MiB arena back only once nothing in it is alive).
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._token = secrets.token_hex(4)
        self._sequence = Sequence()
        self._fd = -1
        self._path: str | None = None
        self._open()

    def _open(self) -> None:
        """A new segment, created under a temporary name and locked before it gets its scanned name, so no
        replayer takes it. Its names are plain strings: a `Path` is made and parsed again for each operation on it."""
        self._sequence.opened += 1
        stem = f"{self.directory}/{os.getpid()}-{self._token}-{self._sequence.opened}"
        final, temporary = stem + ".jsonl", stem + ".new"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.rename(temporary, final)
        self._fd, self._path = fd, final

    def append(self, record: UsageRecord) -> None:
        if self._fd < 0:
            self._open()
        os.write(self._fd, orjson.dumps(tuple(record), option=orjson.OPT_APPEND_NEWLINE))  # orjson takes no named tuple

    def rotate(self) -> tuple[int, str | None]:
        """End the current segment (the next `append` opens a new one); the caller deletes the old one
        (`retire`) once its records are written."""
        old = (self._fd, self._path)
        self._fd, self._path = -1, None
        return old

    @staticmethod
    def retire(segment: tuple[int, str | Path | None]) -> None:
        fd, path = segment
        if path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)

    def close(self) -> None:
        self.retire(self.rotate())


class Sequence(Counts):
    """The journal's segment number, kept in place (see `Counts`)."""

    opened = Count()


class LedgerCounts(Counts):
    written = Count()
    """Records written to the sink."""


def orphaned_segments(directory: Path) -> Iterator[tuple[list[UsageRecord], int, Path]]:
    """Segments no live process holds (a killed process's), with their records; each stays locked until retired."""
    if not directory.is_dir():
        return
    for path in sorted(directory.glob("*.jsonl")):
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        yield _read_records(path), fd, path


def _read_records(path: Path) -> list[UsageRecord]:
    records = []
    for line in path.read_bytes().splitlines():
        try:
            records.append(UsageRecord.from_json(orjson.loads(line)))
        except (orjson.JSONDecodeError, TypeError):
            log.warning("usage journal %s: skipping a torn line (the process died mid-write)", path)
    return records


class Ledger:
    """Accepts records at once (journal + queue) and writes them in batches in the background."""

    def __init__(self, sink: LedgerSink, journal_dir: Path, *, flush_interval_s: float = 0.2, batch: int = 1000):
        self.sink = sink
        self.journal_dir = journal_dir
        self.flush_interval_s = flush_interval_s
        self.batch = batch
        self.journal: Journal | None = None
        self._queue: list[UsageRecord] = []
        self._wake = asyncio.Event()
        """Set when a batch is full: flush before the interval ends."""
        self._work = asyncio.Event()
        """Set by the first record queued: the flusher waits on it while nothing is queued."""
        self._flusher: asyncio.Task[None] | None = None
        self.counts = LedgerCounts()

    @property
    def written(self) -> int:
        return self.counts.written

    async def start(self) -> None:
        """Replay what a killed process left, then open this process's journal and start flushing."""
        for records, fd, path in orphaned_segments(self.journal_dir):
            await asyncio.to_thread(self.sink.write, records)
            log.info("usage ledger: replayed %d record(s) from %s", len(records), path.name)
            Journal.retire((fd, path))
        self.journal = Journal(self.journal_dir)
        self._wake, self._work = asyncio.Event(), asyncio.Event()
        self._flusher = asyncio.create_task(self._flush_forever())

    def accept(self, record: UsageRecord) -> None:
        """Durable once this returns (the journal line is in the kernel); the ledger write comes later."""
        assert self.journal is not None, "Ledger.start() was not awaited"
        try:
            self.journal.append(record)
        except OSError as exc:  # a full disk must not fail the client's turn: the record is still queued
            log.error("usage ledger: journal write failed (%s); %s is only in memory until written", exc, record.id)
        self._queue.append(record)
        queued = len(self._queue)
        if queued == 1:
            self._work.set()
        if queued >= self.batch:
            self._wake.set()

    async def _flush_forever(self) -> None:
        """Flush every interval; while the sink fails (Redis down, disk full), back off up to 5 s (or the interval,
        when longer) and warn once.

        With nothing queued it waits for the next record without a timer: an idle server does not wake up
        (and allocates nothing) every interval.
        """
        failures = 0
        while True:
            if not self._queue:
                self._work.clear()
                await self._work.wait()
            wait = max(self.flush_interval_s, min(5.0, self.flush_interval_s * 2**failures))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait)
            self._wake.clear()
            try:
                await self.flush()
            except Exception as exc:
                if failures == 0:
                    log.warning("usage ledger: write failed (%s); records stay in the journal and are retried", exc)
                failures += 1
            else:
                if failures:
                    log.info("usage ledger: writing again after %d failed attempt(s)", failures)
                failures = 0

    async def flush(self) -> None:
        """Write everything accepted so far; on failure the records stay queued and journaled."""
        if not self._queue or self.journal is None:
            return
        segment = self.journal.rotate()
        batch = self._queue.copy()  # the queue stays the list made at start-up (see `Journal`)
        self._queue.clear()
        try:
            await asyncio.to_thread(self.sink.write, batch)
        except BaseException:
            self._queue[:0] = batch
            for record in batch:  # back into the live journal, so the old segment can go
                self.journal.append(record)
            Journal.retire(segment)
            raise
        Journal.retire(segment)
        self.counts.written += len(batch)

    async def aclose(self) -> None:
        """Drain: write what is queued; what cannot be written stays in the journal for the next start."""
        if self._flusher is not None:
            self._flusher.cancel()
            await asyncio.gather(self._flusher, return_exceptions=True)
        try:
            await self.flush()
        except Exception:
            log.exception("usage ledger: %d record(s) left in the journal at shutdown", len(self._queue))
        else:
            if self.journal is not None:
                self.journal.close()
        await asyncio.to_thread(self.sink.close)
