"""The usage ledger: one idempotent record per response, a journal that survives SIGKILL, `responses-ws usage`."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI
from support.chat_server import MODEL as CHAT_MODEL
from support.chat_server import closed_port
from support.serve import SCRIPT, wait_healthy
from support.wire import MODEL, TurnEvents, completed_ok, run_turn, user

from plugins import create_plugin_manager, hookimpl
from server_shim import BackgroundServer, Settings, create_app
from server_shim.app import build_ledger
from server_shim.ledger import Journal, Ledger, UsageRecord
from server_shim.ledger_sinks import RedisStreamSink, SqliteSink
from server_shim.usage_report import parse_since, render, totals


def record(response_id: str, tenant: str = "alice", output_tokens: int = 5, **changes: Any) -> UsageRecord:
    values: dict[str, Any] = {
        "id": response_id,
        "created_at": 1_000.0,
        "tenant": tenant,
        "model": MODEL,
        "deployment": "simulated",
        "status": "completed",
        "transport": "websocket",
        "connection_id": "conn_1",
        "input_tokens": 10,
        "cached_tokens": 4,
        "output_tokens": output_tokens,
        "ttft_ms": 2.0,
        "duration_ms": 3.0,
    }
    return UsageRecord(**{**values, **changes})


def test_sqlite_writes_are_idempotent_on_the_response_id(tmp_path):
    sink = SqliteSink(tmp_path / "usage.db")
    sink.write([record("resp_1"), record("resp_2")])
    sink.write([record("resp_1", output_tokens=999), record("resp_3", tenant="bob")])
    assert sorted(r.id for r in sink.read()) == ["resp_1", "resp_2", "resp_3"]
    assert next(r for r in sink.read() if r.id == "resp_1").output_tokens == 5
    assert [r.id for r in sink.read(tenant="bob")] == ["resp_3"]
    assert list(sink.read(since=2_000.0)) == []
    sink.close()


@pytest.mark.parametrize("estimated", [False, True])
@pytest.mark.parametrize("tenant", ["alice", None])
def test_a_record_is_stored_as_sqlite_stores_the_record_itself(tmp_path, tenant, estimated):
    """The sink binds plain tuples with `estimated` as 0 or 1 (cheaper to bind): the same values of the same SQLite
    types as binding the named tuple itself, as it did before."""
    records = [
        record("resp_a", tenant=tenant, estimated=estimated),
        record("resp_b", tenant=tenant, deployment=None, connection_id=None, ttft_ms=None, created_at=1_700_000_000),
    ]
    sink = SqliteSink(tmp_path / "usage.db")
    sink.write(records)
    sink.close()
    with sqlite3.connect(tmp_path / "usage.db") as db:
        db.execute("CREATE TABLE reference AS SELECT * FROM usage WHERE 0")
        db.executemany(f"INSERT INTO reference VALUES ({', '.join('?' for _ in UsageRecord._fields)})", records)
        typed = ", ".join(f"{name}, typeof({name})" for name in UsageRecord._fields)
        stored, reference = (
            db.execute(f"SELECT {typed} FROM {table} ORDER BY id").fetchall() for table in ("usage", "reference")
        )
    assert stored == reference and len(stored) == 2
    with sqlite3.connect(tmp_path / "usage.db") as db:
        nulls = db.execute(
            "SELECT typeof(tenant), typeof(deployment), typeof(connection_id), typeof(ttft_ms) FROM usage WHERE id = ?",
            ("resp_b",),
        ).fetchone()
    assert nulls == ("text" if tenant else "null", "null", "null", "null")  # None binds NULL through its adapter


def test_a_batch_written_many_rows_a_statement_stores_what_row_by_row_inserts_store(tmp_path):
    """Whole groups of `ROWS_PER_INSERT` rows go in one statement each, the rest row by row: the table ends as
    inserting each record on its own leaves it, with the same SQLite types; an id already there, or twice in one
    batch, keeps its first row."""
    from server_shim.ledger_sinks import ROWS_PER_INSERT

    def batch(first: int, count: int) -> list[UsageRecord]:
        return [
            record(
                f"resp_{n % 40}",  # ids again within one statement, within the batch and from the batch before
                tenant=None if n % 3 else "alice",
                output_tokens=n,
                estimated=n % 2 == 0,
                ttft_ms=None if n % 5 == 0 else n / 7,
                created_at=1_000.0 + n,
            )
            for n in range(first, first + count)
        ]

    batches = [batch(0, 2 * ROWS_PER_INSERT + 7), batch(90, ROWS_PER_INSERT), batch(500, 3)]
    for path in (tmp_path / "usage.db", tmp_path / "reference.db"):
        SqliteSink(path).close()  # the table, its key and its index
    sink = SqliteSink(tmp_path / "usage.db")
    for records in batches:
        sink.write(records)
    sink.close()
    marks = ", ".join("?" for _ in UsageRecord._fields)
    with sqlite3.connect(tmp_path / "reference.db") as db:
        for one in (r for records in batches for r in records):
            db.execute(f"INSERT OR IGNORE INTO usage VALUES ({marks})", (*one[:-1], int(one.estimated)))
    typed = ", ".join(f"{name}, typeof({name})" for name in UsageRecord._fields)
    stored, reference = (
        sqlite3.connect(tmp_path / name).execute(f"SELECT {typed} FROM usage ORDER BY id").fetchall()
        for name in ("usage.db", "reference.db")
    )
    assert stored == reference and len(stored) == 40


def test_redis_stream_writes_are_idempotent_on_the_response_id(redis_server):
    sink = RedisStreamSink(redis_server.url)
    sink.write([record("resp_1"), record("resp_2")])
    sink.write([record("resp_1"), record("resp_3", tenant="bob")])
    assert [r.id for r in sink.read()] == ["resp_1", "resp_2", "resp_3"]
    assert [r.id for r in sink.read(tenant="bob")] == ["resp_3"]
    sink.close()


async def test_the_ledger_replays_what_a_dead_process_left_in_its_journal(tmp_path):
    journal_dir = tmp_path / "journal"
    journal_dir.mkdir()
    orphan = journal_dir / "99999-dead-1.jsonl"  # no process holds its lock: its writer is gone
    # two lines as an earlier version wrote them (objects), one as this one does (the values, in field order)
    lines = [json.dumps(record(f"resp_{i}")._asdict()) for i in range(2)] + [json.dumps(record("resp_2"))]
    orphan.write_text("\n".join(lines) + '\n{"id": "resp_torn", "crea')
    sink = SqliteSink(tmp_path / "usage.db")
    ledger = Ledger(sink, journal_dir, flush_interval_s=60)
    await ledger.start()
    assert sorted(r.id for r in sink.read()) == ["resp_0", "resp_1", "resp_2"]
    assert not orphan.exists()
    ledger.accept(record("resp_live"))
    assert "resp_live" in "".join(p.read_text() for p in journal_dir.glob("*.jsonl"))
    await ledger.aclose()
    assert sorted(r.id for r in SqliteSink(tmp_path / "usage.db").read())[-1] == "resp_live"
    assert list(journal_dir.glob("*.jsonl")) == []


async def test_a_journal_that_cannot_be_written_does_not_fail_the_turn_and_the_record_is_still_written(tmp_path):
    ledger = Ledger(SqliteSink(tmp_path / "usage.db"), tmp_path / "journal", flush_interval_s=60)
    await ledger.start()
    assert ledger.journal is not None
    read_only = os.open(os.devnull, os.O_RDONLY)
    os.dup2(read_only, ledger.journal._fd)  # every write to the journal now fails, as on a full disk
    os.close(read_only)
    ledger.accept(record("resp_unjournaled"))
    await ledger.aclose()
    assert [r.id for r in SqliteSink(tmp_path / "usage.db").read()] == ["resp_unjournaled"]


async def test_a_live_journal_is_never_replayed_by_another_ledger(tmp_path):
    journal = Journal(tmp_path / "journal")
    journal.append(record("resp_mine"))
    other = Ledger(SqliteSink(tmp_path / "usage.db"), tmp_path / "journal", flush_interval_s=60)
    await other.start()
    assert list(other.sink.read()) == []  # type: ignore[attr-defined]
    await other.aclose()
    journal.close()


async def test_two_ledgers_of_one_process_on_one_journal_directory_keep_their_own_segments(tmp_path):
    """Several apps in one process (tests, embedding) used to share `<pid>-<n>` names and replace each other's."""
    first = Ledger(SqliteSink(tmp_path / "usage.db"), tmp_path / "journal", flush_interval_s=60)
    second = Ledger(SqliteSink(tmp_path / "usage.db"), tmp_path / "journal", flush_interval_s=60)
    await first.start()
    first.accept(record("resp_first"))
    await second.start()
    second.accept(record("resp_second"))
    on_disk = "".join(p.read_text() for p in (tmp_path / "journal").glob("*.jsonl"))
    assert "resp_first" in on_disk and "resp_second" in on_disk  # both would survive a SIGKILL now
    await first.aclose()
    await second.aclose()
    assert sorted(r.id for r in SqliteSink(tmp_path / "usage.db").read()) == ["resp_first", "resp_second"]
    assert list((tmp_path / "journal").glob("*.jsonl")) == []


async def test_the_ledger_writes_as_soon_as_usage_flush_records_wait_without_the_interval(tmp_path):
    ledger = build_ledger(
        Settings(usage_path=str(tmp_path / "usage.db"), usage_flush_interval_s=60, usage_flush_records=3)
    )
    assert ledger is not None and ledger.batch == 3
    await ledger.start()
    sink = SqliteSink(tmp_path / "usage.db")
    ledger.accept(record("resp_1"))
    ledger.accept(record("resp_2"))
    await asyncio.sleep(0.3)
    assert list(sink.read()) == []  # two wait: the interval (a minute) has not come
    ledger.accept(record("resp_3"))
    for _ in range(200):
        if len(list(sink.read())) == 3:
            break
        await asyncio.sleep(0.01)
    assert sorted(r.id for r in sink.read()) == ["resp_1", "resp_2", "resp_3"]
    await ledger.aclose()


def test_totals_group_by_tenant_and_model_in_every_format():
    rows = totals([record("a"), record("b", output_tokens=7), record("c", tenant="bob", status="failed")])
    assert [(r["tenant"], r["responses"], r["output_tokens"], r["failed"]) for r in rows] == [
        ("alice", 2, 12, 0),
        ("bob", 1, 5, 1),
    ]
    assert json.loads(render(rows, "json")) == rows
    assert render(rows, "csv").splitlines()[0].startswith("tenant,model,responses")
    assert render(rows, "table").splitlines()[1].split()[:3] == ["alice", MODEL, "2"]


def test_totals_count_the_responses_whose_tokens_are_estimates():
    rows = totals([record("a"), record("b", estimated=True), record("c", status="cancelled", estimated=True)])
    assert [(r["responses"], r["estimated"]) for r in rows] == [(3, 2)]
    assert "estimated" in render(rows, "csv").splitlines()[0].split(",")


def test_a_ledger_file_from_before_the_estimated_column_gains_it(tmp_path):
    old_columns = [name for name in record("x")._asdict() if name != "estimated"]
    with sqlite3.connect(tmp_path / "usage.db") as db:
        db.execute(f"CREATE TABLE usage ({', '.join(old_columns)})")
        db.execute(
            f"INSERT INTO usage VALUES ({', '.join('?' for _ in old_columns)})",
            [record("resp_old")._asdict()[name] for name in old_columns],
        )
    sink = SqliteSink(tmp_path / "usage.db")
    sink.write([record("resp_new", estimated=True)])
    assert {r.id: r.estimated for r in sink.read()} == {"resp_old": False, "resp_new": True}
    sink.close()


async def test_a_backend_that_reports_usage_is_recorded_as_counted(make_server, chat_server, tmp_path):
    usage_path = tmp_path / "counted.db"
    shim = make_server(backend=chat_server.base_url, usage_path=str(usage_path))
    async with AsyncOpenAI(base_url=shim.base_url, api_key="k", max_retries=0) as sdk:
        answered = await sdk.responses.create(model=CHAT_MODEL, input="hello")
    for _ in range(200):
        if recorded := {r.id: r for r in SqliteSink(usage_path).read()}:
            break
        await asyncio.sleep(0.02)
    assert recorded[answered.id].estimated is False and recorded[answered.id].output_tokens > 0


def test_since_takes_relative_and_iso_times():
    assert parse_since("90m", now=10_000.0) == 10_000.0 - 5400
    assert parse_since("2d", now=200_000.0) == 200_000.0 - 172_800
    assert parse_since("2026-12-01T00:00:00+00:00") == datetime(2026, 12, 1, tzinfo=UTC).timestamp()
    with pytest.raises(ValueError, match="--since"):
        parse_since("yesterday")


# --- over the wire -------------------------------------------------------------------------------


class InfoRecorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    @hookimpl
    def responses_ws_response_finished(self, response: dict[str, Any], info: Any) -> None:
        self.calls.append((response["id"], info))


def ok(turn: TurnEvents) -> TurnEvents:
    completed_ok(turn)
    return turn


async def test_each_response_is_recorded_with_tenant_transport_deployment_and_timings_and_drained_at_shutdown(tmp_path):
    recorder = InfoRecorder()
    manager = create_plugin_manager(load_entry_points=False)
    manager.register(recorder)
    usage_path = tmp_path / "usage.db"
    settings = Settings(
        api_keys=["alice sk-a"], usage_path=str(usage_path), usage_flush_interval_s=60.0, drain_timeout_s=2.0
    )
    with BackgroundServer(create_app(settings, plugin_manager=manager), settings) as server:
        async with AsyncOpenAI(base_url=server.base_url, api_key="sk-a", max_retries=0) as sdk:
            async with sdk.responses.connect() as conn:
                over_ws = ok(await run_turn(conn, input=[user("hello")]))
            over_http = await sdk.responses.create(model=MODEL, input="hi")
    # no flush came due (60 s): the records are in the ledger because shutdown drained the queue
    records = {r.id: r for r in SqliteSink(usage_path).read()}
    assert set(records) == {over_ws.id, over_http.id}
    ws_record, http_record = records[over_ws.id], records[over_http.id]
    assert (ws_record.tenant, ws_record.transport, ws_record.deployment) == ("alice", "websocket", "simulated")
    assert ws_record.connection_id.startswith("conn_") and http_record.connection_id is None
    assert http_record.transport == "http" and http_record.output_tokens > 0
    assert ws_record.estimated and http_record.estimated, "the simulator's token counts are estimates"
    assert 0 <= ws_record.ttft_ms <= ws_record.duration_ms
    infos = dict(recorder.calls)
    assert infos[over_ws.id].tenant == "alice" and infos[over_ws.id].connection_id == ws_record.connection_id


async def load(port: int, seen: list[str], stop: asyncio.Event) -> None:
    """One client chaining turns over WebSocket until the server dies; records every completed id."""
    async with AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0) as sdk:
        try:
            async with sdk.responses.connect() as conn:
                previous = None
                while not stop.is_set():
                    turn = await run_turn(conn, input=[user("go")], previous_response_id=previous, store=False)
                    seen.append(turn.id)
                    previous = turn.id
        except Exception:
            return  # the server was killed


def ledger_ids(path: Path) -> list[str]:
    if not path.exists():
        return []
    with sqlite3.connect(path) as db:
        return [row[0] for row in db.execute("SELECT id FROM usage")]


async def test_the_ledger_loses_nothing_when_the_server_is_killed_mid_load(serve_process, tmp_path):
    usage_path = tmp_path / "usage.db"
    config = tmp_path / "shim.toml"
    config.write_text(f'[server]\nusage_path = "{usage_path}"\nusage_flush_interval_s = 5.0\n')
    port = closed_port()
    process = serve_process("--port", str(port), "--config", str(config))
    await asyncio.to_thread(wait_healthy, port, process)
    seen: list[str] = []
    stop = asyncio.Event()
    clients = [asyncio.create_task(load(port, seen, stop)) for _ in range(4)]
    while len(seen) < 200:
        await asyncio.sleep(0.01)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(5)
    stop.set()
    await asyncio.gather(*clients)
    accepted = set(seen)
    assert len(ledger_ids(usage_path)) < len(accepted)  # the kill came before the flush: only the journal has them

    port = closed_port()
    restarted = serve_process("--port", str(port), "--config", str(config))
    await asyncio.to_thread(wait_healthy, port, restarted)
    restarted.send_signal(signal.SIGINT)
    restarted.wait(20)
    recorded = ledger_ids(usage_path)
    assert len(recorded) == len(set(recorded))
    assert accepted <= set(recorded)
    assert len(recorded) <= len(accepted) + len(clients)  # at most the turns in flight at the kill

    report = subprocess.run(
        [str(SCRIPT), "usage", "--config", str(config), "--format", "json"],  # the server's own config file
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    rows = json.loads(report.stdout)
    assert sum(row["responses"] for row in rows) == len(recorded)


async def test_with_a_redis_store_usage_goes_to_the_redis_stream(make_server, redis_server):
    server = make_server(store=redis_server.url, api_keys=["bob sk-b"])
    async with AsyncOpenAI(base_url=server.base_url, api_key="sk-b", max_retries=0) as sdk:
        response = await sdk.responses.create(model=MODEL, input="hi")
    deadline = time.monotonic() + 5
    while not (records := list(RedisStreamSink(redis_server.url).read())) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert [(r.id, r.tenant) for r in records] == [(response.id, "bob")]
    report = subprocess.run(
        [str(SCRIPT), "usage", "--store", redis_server.url, "--tenant", "bob", "--format", "csv"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert report.stdout.splitlines()[1].startswith(f"bob,{MODEL},1,0,")


def test_a_response_s_record_is_the_named_tuple_its_fields_say():
    """`record_of` makes the tuple in C (`tuple.__new__`), past the named tuple's own `__new__` and its arity
    check: the result must be the record `UsageRecord(...)` makes, field for field."""
    from server_shim.postinference import record_of

    usage = {"input_tokens": 7, "input_tokens_details": {"cached_tokens": 3}, "output_tokens": 2}
    response = {"id": "resp_1", "created_at": 5.0, "model": "m", "status": "completed", "usage": usage}
    made = record_of(response, "websocket", None, "conn_1", "d", 0.0123456, 0.5, True)
    expected = UsageRecord(
        "resp_1", 5.0, None, "m", "d", "completed", "websocket", "conn_1", 7, 3, 2, 12.346, 500.0, True
    )
    assert type(made) is UsageRecord and made == expected and made._asdict() == expected._asdict()
    bare = record_of({"id": "resp_2"}, "http", "alice", None, None, None, 0.25, False)
    assert bare == UsageRecord("resp_2", 0.0, "alice", "", None, "", "http", None, 0, 0, 0, None, 250.0, False)


def test_milliseconds_are_rounded_to_the_microsecond_as_round_rounds_them():
    """The record's `ttft_ms` and `duration_ms` come from `to_microseconds`, `round(value, 3)` without the decimal
    round trip where no tie is near: the same float for every value, ties and their neighbours included."""
    import math
    import struct

    from hypothesis import given, settings
    from hypothesis import strategies as st

    from server_shim.postinference import to_microseconds

    def bits(value: float) -> bytes:
        return struct.pack("<d", value)  # tells -0.0 from 0.0, and NaN equals itself

    ties = st.integers(0, 2 * 10**9).map(lambda n: n / 2000)  # k.xxx5 decimals, exact ties where representable
    near = ties.flatmap(lambda t: st.sampled_from([t, math.nextafter(t, 0), math.nextafter(t, math.inf)]))
    values = st.floats(allow_nan=True, allow_infinity=True) | st.floats(0, 1e7) | near

    @settings(max_examples=2_000, deadline=None)
    @given(values)
    def check(value: float) -> None:
        assert bits(to_microseconds(value)) == bits(round(value, 3)), value

    check()
    for value in (0.0, -0.0, 0.0625, 1.0005, 2.0**40 / 1000, 1e300, math.inf, -2.5):
        assert bits(to_microseconds(value)) == bits(round(value, 3)), value
