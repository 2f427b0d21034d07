"""`serve --workers N`: N processes on one port; a shared Redis store lets any worker continue."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

from openai import AsyncOpenAI
from support.chat_server import closed_port
from support.serve import wait_healthy, worker_pids
from support.wire import TurnEvents, completed_ok, run_turn, user
from websockets.asyncio.client import connect


def replace_every_worker(parent: int) -> None:
    """SIGKILL each worker and wait until the supervisor has started as many new ones."""
    old = worker_pids(parent)
    assert len(old) == 2, old
    for pid in old:
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        new = worker_pids(parent)
        if len(new) == 2 and not set(new) & set(old):
            return
        time.sleep(0.05)
    raise AssertionError("the workers were not replaced")


async def first_then_continue_on_new_workers(port: int, process) -> tuple[TurnEvents, TurnEvents]:
    base_url = f"http://127.0.0.1:{port}/v1"
    async with AsyncOpenAI(base_url=base_url, api_key="k", max_retries=0) as sdk:
        async with sdk.responses.connect() as conn:
            first = await run_turn(conn, input=[user("remember 7")])
            completed_ok(first)
        await asyncio.to_thread(replace_every_worker, process.pid)
        await asyncio.to_thread(wait_healthy, port, process)
        async with sdk.responses.connect() as conn:
            second = await run_turn(conn, input=[user("what was it?")], previous_response_id=first.id)
    return first, second


async def test_with_redis_a_conversation_continues_on_a_worker_that_never_saw_it(serve_process, redis_server):
    port = closed_port()
    process = serve_process("--port", str(port), "--workers", "2", "--store", redis_server.url)
    await asyncio.to_thread(wait_healthy, port, process)
    _, second = await first_then_continue_on_new_workers(port, process)
    completed_ok(second)
    base_url = f"http://127.0.0.1:{port}/v1"
    async with AsyncOpenAI(base_url=base_url, api_key="k", max_retries=0) as sdk:
        for _ in range(6):  # fresh connections, whichever worker each lands on
            async with sdk.responses.connect() as conn:
                turn = await run_turn(conn, input=[user("and again")], previous_response_id=second.id)
                completed_ok(turn)
            second = turn


async def test_with_the_memory_store_workers_warn_and_cannot_continue_each_others_responses(serve_process):
    port = closed_port()
    process = serve_process("--port", str(port), "--workers", "2")
    await asyncio.to_thread(wait_healthy, port, process)
    _, second = await first_then_continue_on_new_workers(port, process)
    assert second.error is not None and second.error["error"]["code"] == "previous_response_not_found"
    os.killpg(process.pid, signal.SIGTERM)
    output, _ = process.communicate(timeout=20)
    assert "stored responses are per worker" in output


async def test_a_stopping_worker_finishes_the_response_in_flight_then_closes_with_1001(serve_process, tmp_path):
    config = tmp_path / "slow.toml"
    config.write_text("[server]\nsimulated_ttft_s = 1.0\n")
    port = closed_port()
    process = serve_process("--port", str(port), "--workers", "2", "--config", str(config))
    await asyncio.to_thread(wait_healthy, port, process)
    async with connect(f"ws://127.0.0.1:{port}/v1/responses") as ws:
        await ws.send(json.dumps({"type": "response.create", "model": "simulated-1", "input": "hi", "store": False}))
        assert json.loads(await ws.recv())["type"] == "response.created"  # in flight, first token 1 s away
        os.kill(process.pid, signal.SIGTERM)
        types = [json.loads(message)["type"] async for message in ws]
    assert types[-1] == "response.completed"
    assert ws.close_code == 1001


async def test_the_workers_of_a_bare_serve_run_on_the_c_allocator_too(serve_process):
    """`serve` runs itself again with PYTHONMALLOC=malloc before starting its workers, which inherit it."""
    port = closed_port()
    process = serve_process("--port", str(port), "--workers", "2")
    await asyncio.to_thread(wait_healthy, port, process)
    expected = f"PYTHONMALLOC={os.environ.get('PYTHONMALLOC') or 'malloc'}".encode()  # a value set is kept
    workers = worker_pids(process.pid)
    assert len(workers) == 2, workers
    for pid in [process.pid, *workers]:
        with open(f"/proc/{pid}/environ", "rb") as environ:
            assert expected in environ.read().split(b"\0"), pid
    os.killpg(process.pid, signal.SIGTERM)
    process.communicate(timeout=20)
