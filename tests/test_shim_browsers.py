"""What a hostile web page can make a browser send to a sidecar on loopback (auth off, the default): a
WebSocket from another origin, a `text/plain` POST (no CORS preflight), a request under a rebound DNS name.
Each is refused with its own code; the SDK's clients, which send no Origin, are served as before."""

from __future__ import annotations

import json
import socket

import httpx2
import pytest
from openai import OpenAI
from support.wire import API_KEY, MODEL
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect as ws_connect

from server_shim.browsers import BrowserGuard, host_name, is_json

pytestmark = pytest.mark.timeout(60)
BODY = json.dumps({"model": MODEL, "input": "hi", "store": False})
EVIL = "https://evil.example"


def post(server, headers: dict[str, str], body: str = BODY) -> httpx2.Response:
    return httpx2.post(server.base_url + "/responses", content=body, headers=headers, timeout=10)


def refused_upgrade(server, **kwargs) -> tuple[int, dict]:
    url = server.base_url.replace("http://", "ws://") + "/responses"
    with pytest.raises(InvalidStatus) as refused:
        ws_connect(url, open_timeout=5, **kwargs)
    response = refused.value.response
    return response.status_code, json.loads(response.body)["error"]


def completes_over_both(server) -> None:
    """The official SDK over HTTP and over `responses.connect()`: served (it sends no Origin)."""
    with OpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0) as sdk:
        assert sdk.responses.create(model=MODEL, input="hi", store=False).status == "completed"
        with sdk.responses.connect() as connection:
            connection.response.create(model=MODEL, input="hi", store=False)
            assert any(event.type == "response.completed" for event in connection)


def test_a_websocket_from_another_origin_is_refused_and_sdk_clients_are_served(make_server) -> None:
    server = make_server()
    status, error = refused_upgrade(server, origin=EVIL)
    assert (status, error["code"]) == (403, "origin_not_allowed")
    assert EVIL in error["message"] and "allowed_origins" in error["message"]
    assert refused_upgrade(server, origin="null")[1]["code"] == "origin_not_allowed"  # sandboxed frames, file://
    completes_over_both(server)


def test_an_allowed_origin_is_served(make_server) -> None:
    server = make_server(allowed_origins=["https://app.example/"])
    url = server.base_url.replace("http://", "ws://") + "/responses"
    with ws_connect(url, origin="https://APP.example", open_timeout=5) as ws:  # type: ignore[arg-type]
        ws.send(json.dumps({"type": "response.create", "model": MODEL, "input": "hi", "store": False}))
        while json.loads(ws.recv(timeout=10))["type"] != "response.completed":
            pass
    assert post(server, {"Origin": "https://app.example", "Content-Type": "application/json"}).status_code == 200
    assert post(server, {"Origin": EVIL, "Content-Type": "application/json"}).status_code == 403


def test_a_cross_origin_simple_post_is_refused(make_server) -> None:
    server = make_server()
    answer = post(server, {"Origin": EVIL, "Content-Type": "text/plain;charset=UTF-8"})
    assert answer.status_code == 403
    assert answer.json()["error"]["code"] == "origin_not_allowed"


@pytest.mark.parametrize(
    "content_type", ["text/plain;charset=UTF-8", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"]
)
def test_a_body_that_is_not_declared_json_gets_415(make_server, content_type: str) -> None:
    server = make_server()
    for route in ("/responses", "/chat/completions", "/responses/input_tokens"):
        answer = httpx2.post(server.base_url + route, content=BODY, headers={"Content-Type": content_type}, timeout=10)
        assert answer.status_code == 415, route
        error = answer.json()["error"]
        assert error["code"] == "unsupported_media_type"
        assert "application/json" in error["message"] and content_type in error["message"]


@pytest.mark.parametrize("content_type", ["application/json", "application/json; charset=utf-8", "application/x+json"])
def test_json_bodies_and_bodies_without_a_type_are_served(make_server, content_type: str) -> None:
    server = make_server()
    assert post(server, {"Content-Type": content_type}).status_code == 200
    assert post(server, {}).status_code == 200


def test_a_rebound_host_name_is_refused_on_loopback(make_server) -> None:
    server = make_server()
    port = server.settings.port
    answer = post(server, {"Host": f"attacker.example:{port}", "Content-Type": "application/json"})
    assert answer.status_code == 403
    assert answer.json()["error"]["code"] == "host_not_allowed"
    upgrade = (
        "GET /v1/responses HTTP/1.1\r\nHost: attacker.example\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(upgrade.encode())
        reply = sock.recv(65536)
    assert reply.startswith(b"HTTP/1.1 403") and b'"host_not_allowed"' in reply
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "app.localhost"):
        assert post(server, {"Host": host, "Content-Type": "application/json"}).status_code == 200, host


def test_allowed_hosts_are_answered(make_server) -> None:
    server = make_server(allowed_hosts=["shim.internal"])
    assert post(server, {"Host": "shim.internal:80"}).status_code == 200
    assert post(server, {"Host": "other.internal"}).status_code == 403


def test_the_guard_off_loopback() -> None:
    """Bound to every interface, any Host is answered (pod IPs, service names) unless a list is set."""
    open_guard = BrowserGuard.build("0.0.0.0", [], [])
    assert open_guard.refusal("GET", [(b"host", b"10.1.2.3:8787")]) is None
    listed = BrowserGuard.build("0.0.0.0", [], ["shim.svc"])
    assert listed.refusal("GET", [(b"host", b"shim.svc")]) is None
    assert listed.refusal("GET", [(b"host", b"127.0.0.1:8787")]) is None  # the image's HEALTHCHECK
    refusal = listed.refusal("GET", [(b"host", b"10.1.2.3")])
    assert refusal is not None and refusal.code == "host_not_allowed"


def test_host_names_and_json_types() -> None:
    assert host_name("[::1]:8787") == "::1"
    assert host_name("Example.COM:80") == "example.com"
    assert host_name("::1") == "::1"
    assert (
        is_json("application/json") and is_json("Application/JSON; charset=utf-8") and is_json("application/vnd.x+json")
    )
    assert not is_json("text/json") and not is_json("text/plain") and not is_json("")
    empty_body = BrowserGuard.build("127.0.0.1", [], []).refusal(
        "POST", [(b"content-type", b"text/plain"), (b"content-length", b"0")]
    )
    assert empty_body is None  # a POST without a body (cancel) has nothing to mistype
