"""HTTP clients that send slowly, never finish, or stop reading, and more connections than the cap: each is
answered or closed within its bound, and what it held (a socket, a backend request, a tenant slot) is freed.
Real uvicorn on loopback; raw sockets for the misbehaving clients, the official SDK for everyone else."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import openai
import pytest
from openai import OpenAI
from support.wire import API_KEY, MODEL

from server_shim import BackgroundServer, metrics

pytestmark = pytest.mark.timeout(60)


@contextmanager
def raw(server: BackgroundServer, data: bytes = b"", rcvbuf: int | None = None) -> Iterator[socket.socket]:
    sock = socket.socket()
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect(("127.0.0.1", server.settings.port))
    sock.settimeout(10)
    try:
        if data:
            sock.sendall(data)
        yield sock
    finally:
        sock.close()


def answer(sock: socket.socket) -> tuple[bytes, float]:
    """Everything the server sends until it closes, and when it closed (monotonic)."""
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks), time.monotonic()


def post_head(path: str, length: int) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {API_KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    ).encode()


def error_of(reply: bytes) -> tuple[int, dict]:
    head, _, body = reply.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)["error"]


def closed(reason: str) -> float:
    return metrics.CLOSED_CONNECTIONS.labels("http", reason)._value.get()


def test_partial_head_gets_408_and_is_closed(make_server) -> None:
    server = make_server(api_keys=[API_KEY], http_header_timeout_s=0.5)
    before = closed("head_timeout")
    started = time.monotonic()
    with raw(server, b"POST /v1/responses HTTP/1.1\r\nHost: 127.0.0.1\r\n") as slow, raw(server) as silent:
        reply, at = answer(slow)
        assert 0.4 < at - started < 3
        assert error_of(reply) == (408, error_of(reply)[1])
        assert error_of(reply)[1]["code"] == "request_timeout"
        assert "head" in error_of(reply)[1]["message"]
        assert answer(silent)[0] == b""  # one that never sends a byte is closed too, with no 408
    assert closed("head_timeout") - before == 2
    with OpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0) as sdk:  # the server is fine
        assert sdk.responses.create(model=MODEL, input="hi", store=False).status == "completed"


def test_slow_head_after_a_kept_alive_response_is_timed_out(make_server) -> None:
    """The second request on a kept-alive connection gets the same head deadline as the first."""
    server = make_server(http_header_timeout_s=0.5)
    with raw(server, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n") as sock:
        time.sleep(0.2)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        sock.sendall(b"GET /healthz HTTP/1.1\r\n")
        reply, _ = answer(sock)
        assert error_of(reply)[0] == 408


def test_a_kept_alive_connection_that_sends_nothing_more_is_closed_without_a_408(make_server) -> None:
    """A 408 nobody asked for could be read by a pooled client as the answer to the request it sends next."""
    server = make_server(http_header_timeout_s=0.5)
    with raw(server, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n") as sock:
        reply, _ = answer(sock)
    assert reply.startswith(b"HTTP/1.1 200") and b"408" not in reply.split(b"\r\n\r\n", 1)[1]


def test_half_sent_body_gets_408_and_the_server_logs_no_error(make_server, caplog) -> None:
    server = make_server(api_keys=[API_KEY], http_body_timeout_s=0.5)
    body = json.dumps({"model": MODEL, "input": "hi", "store": False}).encode()
    started = time.monotonic()
    with raw(server, post_head("/v1/responses", len(body)) + body[:10]) as sock:
        reply, at = answer(sock)
    assert 0.4 < at - started < 3
    status, error = error_of(reply)
    assert (status, error["code"]) == (408, "request_timeout")
    assert "body" in error["message"]
    time.sleep(0.2)
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


def test_a_body_that_arrives_in_pieces_within_the_deadline_is_served(make_server) -> None:
    server = make_server(http_body_timeout_s=2)
    body = json.dumps({"model": MODEL, "input": "hi", "store": False}).encode()
    with raw(server, post_head("/v1/responses", len(body)) + body[:10]) as sock:
        time.sleep(0.3)
        sock.sendall(body[10:])
        reply = sock.recv(65536)
    assert reply.startswith(b"HTTP/1.1 200")


@pytest.mark.parametrize("route", ["/v1/responses", "/v1/chat/completions"])
def test_a_stream_client_that_stops_reading_frees_its_slot(make_server, route: str) -> None:
    """With the tenant allowed one response at a time, a stalled SSE reader blocks the tenant until the
    send timeout closes it; then the backend request is gone (nothing in flight) and the tenant can go on."""
    server = make_server(api_keys=[API_KEY], send_timeout_s=1.0, tenant_max_concurrent=1)
    if route == "/v1/chat/completions":
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 32768}
    else:
        body = {"model": MODEL, "input": "hi", "stream": True, "store": False, "max_output_tokens": 32768}
    data = json.dumps(body).encode()
    before = closed("slow_reader")
    with (
        raw(server, post_head(route, len(data)) + data, rcvbuf=4096),
        OpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0) as sdk,
    ):
        time.sleep(0.3)
        with pytest.raises(openai.RateLimitError):  # the stalled stream holds the tenant's one slot
            sdk.responses.create(model=MODEL, input="hi", store=False)
        deadline = time.monotonic() + 10
        while closed("slow_reader") == before and time.monotonic() < deadline:
            time.sleep(0.1)
        assert closed("slow_reader") - before == 1
        time.sleep(0.2)
        assert sdk.responses.create(model=MODEL, input="hi", store=False).status == "completed"
        ready = sdk.get(server.base_url.removesuffix("/v1") + "/readyz", cast_to=object)
    assert all(d["in_flight"] == 0 for d in ready["deployments"].values())  # type: ignore[index]


def test_a_slow_stream_reader_that_keeps_reading_is_not_cut(make_server) -> None:
    """Reading 4 KB every 0.2 s keeps the socket's buffers full for longer than the send timeout at a
    time, but something drains in each period: that client is slow, not gone."""
    server = make_server(send_timeout_s=1.0)
    data = json.dumps({"model": MODEL, "input": "hi", "stream": True, "store": False, "max_output_tokens": 32768})
    before = closed("slow_reader")
    received = 0
    with raw(server, post_head("/v1/responses", len(data)) + data.encode(), rcvbuf=4096) as sock:
        until = time.monotonic() + 4
        while time.monotonic() < until:
            chunk = sock.recv(4096)
            assert chunk, f"closed after {received} bytes"
            received += len(chunk)
            time.sleep(0.2)
    assert closed("slow_reader") == before
    assert received > 40_000


def test_http_connections_beyond_the_cap_get_503_while_every_one_is_busy_but_probes_are_answered(
    make_server,
) -> None:
    server = make_server(max_http_connections=2, http_header_timeout_s=30, http_body_timeout_s=30)
    busy = post_head("/v1/responses", 100) + b"{"  # a request under way: its body is still coming
    with OpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0) as sdk:
        with raw(server, busy), raw(server, busy):
            time.sleep(0.2)
            with pytest.raises(openai.InternalServerError) as refused:
                sdk.responses.create(model=MODEL, input="hi", store=False)
            assert refused.value.status_code == 503
            assert refused.value.code == "server_overloaded"  # type: ignore[attr-defined]
            assert refused.value.response.headers["retry-after"] == "1"
            assert httpx.get(f"http://127.0.0.1:{server.settings.port}/healthz").status_code == 200
        time.sleep(0.2)
        assert sdk.responses.create(model=MODEL, input="hi", store=False).status == "completed"


def test_idle_connections_make_room_for_a_newcomer_at_the_cap(make_server) -> None:
    server = make_server(max_http_connections=2, http_header_timeout_s=30)
    before = closed("idle_evicted")
    sdk = OpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0)
    with sdk, raw(server) as first, raw(server, b"POST /v1/resp") as second:
        time.sleep(0.2)
        assert sdk.responses.create(model=MODEL, input="hi", store=False).status == "completed"
        assert httpx.get(f"http://127.0.0.1:{server.settings.port}/healthz").status_code == 200
        assert first.recv(1) == b"" and second.recv(1) == b""  # closed, oldest idle first
    assert closed("idle_evicted") >= before + 2


def test_websocket_connections_do_not_count_against_the_http_cap(make_server) -> None:
    server = make_server(max_http_connections=1)
    sdk = OpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0)
    with sdk, sdk.responses.connect() as first, sdk.responses.connect() as second:
        for connection in (first, second):
            connection.response.create(model=MODEL, input="hi", store=False)
            assert any(event.type == "response.completed" for event in connection)
        assert sdk.responses.create(model=MODEL, input="hi", store=False).status == "completed"
