"""A Redis that accepts connections but does not answer (the process paused with SIGSTOP: a hung server,
a network partition that drops packets): every store operation is bounded by `store_timeout_s` all told,
a `store: true` response says it was not stored, and `/readyz` answers within a probe's timeout and says so.
Real redis-server, real uvicorn, the official SDK over both transports."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx2
import openai
import pytest
from openai import AsyncOpenAI
from support.wire import MODEL, completed_ok, run_turn, user

from server_shim.events import NOT_STORED_METADATA_KEY

pytestmark = pytest.mark.timeout(60)
STORE_TIMEOUT_S = 1.0


@contextmanager
def frozen(redis_server) -> Iterator[None]:
    """redis-server paused: its socket stays open and takes bytes, but nothing comes back."""
    pid = redis_server.process.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def readyz(server) -> tuple[httpx2.Response, float]:
    started = time.monotonic()
    reply = httpx2.get(server.base_url.removesuffix("/v1") + "/readyz", timeout=10)
    return reply, time.monotonic() - started


def probed(server) -> tuple[httpx2.Response, float]:
    """`readyz` twice, the quicker time: the servers run in the test process, so a collection of the whole
    suite's heap there (1.09 s once in CI) can stall one probe for reasons that are not the store's."""
    (first, took_first), (second, took_second) = readyz(server), readyz(server)
    assert (first.status_code, first.json()) == (second.status_code, second.json())
    return second, min(took_first, took_second)


async def test_a_frozen_store_costs_a_turn_one_timeout_and_the_response_says_it_was_not_stored(
    make_server, redis_server
):
    server = make_server(store=redis_server.url, store_timeout_s=STORE_TIMEOUT_S)
    async with AsyncOpenAI(base_url=server.base_url, api_key="k", max_retries=0) as sdk:
        async with sdk.responses.connect() as conn:
            first = await run_turn(conn, input=[user("one")])
            completed_ok(first)
            assert first.response["store"] is True and NOT_STORED_METADATA_KEY not in first.response["metadata"]
            with frozen(redis_server):
                started = time.monotonic()
                second = await run_turn(conn, input=[user("two")], previous_response_id=first.id)
                took = time.monotonic() - started
                completed_ok(second)
                # one store_timeout_s, not the client's three tries of it (3.1 s here before)
                assert took < STORE_TIMEOUT_S + 0.8, took
                assert second.response["store"] is False
                assert second.response["metadata"][NOT_STORED_METADATA_KEY] == "store_unavailable"
                # the connection's cache still continues it
                completed_ok(await run_turn(conn, input=[user("three")], previous_response_id=second.id))

                started = time.monotonic()
                over_http = await sdk.responses.create(model=MODEL, input="four")
                assert time.monotonic() - started < STORE_TIMEOUT_S + 0.8
                assert over_http.status == "completed" and over_http.store is False
                assert over_http.metadata == {NOT_STORED_METADATA_KEY: "store_unavailable"}

                started = time.monotonic()
                with pytest.raises(openai.InternalServerError) as refused:
                    await sdk.responses.retrieve(first.id)
                assert refused.value.code == "store_unavailable"  # type: ignore[attr-defined]
                assert time.monotonic() - started < STORE_TIMEOUT_S + 0.8
        fresh = await sdk.responses.create(model=MODEL, input="five")
        assert fresh.store is True and fresh.metadata == {}
        assert (await sdk.responses.retrieve(fresh.id)).id == fresh.id


def test_readyz_answers_within_a_probe_timeout_and_reports_the_frozen_store(make_server, redis_server):
    relaxed = make_server(store=redis_server.url, store_timeout_s=STORE_TIMEOUT_S)
    strict = make_server(store=redis_server.url, store_timeout_s=STORE_TIMEOUT_S, readyz_requires_store=True)
    assert readyz(relaxed)[0].status_code == 200 and readyz(strict)[0].status_code == 200
    with frozen(redis_server):
        reply, took = probed(relaxed)
        assert took < 1.0  # Kubernetes' default probe timeout
        assert reply.status_code == 200 and reply.json()["store"] == {"kind": "redis", "reachable": False}
        reply, took = probed(strict)
        assert took < 1.0
        assert reply.status_code == 503 and reply.json()["store"]["reachable"] is False
    assert readyz(strict)[0].status_code == 200
