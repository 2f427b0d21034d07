"""A sidecar config routing between real backends: failover, breaker, fast lane, sticky routes.

The llama.cpp server is real (loopback, a tiny generated model); Cerebras is replayed from
cassettes of its documented traffic (see support/cassettes.py); the simulator is the shim's own.
"""

from __future__ import annotations

import contextlib
import importlib.util
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from openai import AsyncOpenAI

from server_shim import BackgroundServer, create_app
from server_shim.config import ShimConfig
from server_shim.router import Router

pytestmark = pytest.mark.timeout(60)

if importlib.util.find_spec("llama_cpp") is None:
    pytest.skip("llama-cpp-python is not installed: pip install -e '.[dev,llama]'", allow_module_level=True)

from support.cassettes import replay  # noqa: E402

from benchmarks.llama_server import LlamaServer  # noqa: E402
from benchmarks.tiny_model import write_tiny_model  # noqa: E402

EXAMPLE = Path(__file__).parent.parent / "examples" / "sidecar.toml"


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("routing") / "tiny.gguf")


@pytest.fixture
def llama(model_path: Path, tmp_path: Path) -> Iterator[LlamaServer]:
    with LlamaServer(model_path, tmp_path / "llama.log", alias="tiny") as server:
        yield server


def config(llama: LlamaServer, *, extra: list[dict[str, Any]] = (), **routing: Any) -> ShimConfig:
    return ShimConfig.model_validate(
        {
            "server": {"drain_timeout_s": 2.0},
            "routing": {"failure_threshold": 2, "cooldown_s": 30, "health_interval_s": 0.2, **routing},
            "deployments": [
                {
                    "name": "llama",
                    "kind": "openai_compatible",
                    "base_url": llama.base_url,
                    "models": {"fast": "tiny", "local": "tiny"},
                    "priority": 5,
                },
                *extra,
            ],
        }
    )


CEREBRAS = {
    "name": "cerebras",
    "kind": "cerebras",
    "base_url": "https://api.cerebras.ai/v1",
    "api_key_env": "CEREBRAS_API_KEY",
    "models": {"fast": "llama-3.3-70b"},
    "priority": 1,
}
SIMULATED = {"name": "sim", "kind": "simulated", "models": {"local": "simulated-1"}, "priority": 0}


@contextlib.contextmanager
def shim(cfg: ShimConfig) -> Iterator[BackgroundServer]:
    settings = cfg.settings()
    with BackgroundServer(create_app(settings, config=cfg), settings) as server:
        yield server


def router(server: BackgroundServer) -> Router:
    backend = server.shim.env.backend
    assert isinstance(backend, Router)
    return backend


async def turn(conn: Any, model: str, text: str, previous: str | None = None) -> Any:
    await conn.response.create(model=model, input=text, previous_response_id=previous, max_output_tokens=8)
    async for event in conn:
        if event.type in ("response.completed", "response.incomplete", "response.failed", "error"):
            return event


async def test_fast_lane_goes_to_cerebras_and_the_route_is_reused_across_turns(llama, monkeypatch):
    monkeypatch.setenv("CEREBRAS_API_KEY", "test-key")
    with shim(config(llama, extra=[CEREBRAS], fast_lane={"fast": "cerebras"})) as server, replay("cerebras_text.yaml"):
        async with AsyncOpenAI(base_url=server.base_url, api_key="x") as client, client.responses.connect() as conn:
            first = await turn(conn, "fast", "hello")
            assert first.response.output_text == "Hello from Cerebras"
            previous = first.response.id
            for _ in range(3):
                event = await turn(conn, "fast", "again", previous)
                assert event.type == "response.completed"
                assert event.response.output_text == "Hello from Cerebras"
                previous = event.response.id
        assert router(server).stats.resolutions == 1
        assert router(server).stats.sticky_reuses == 3


async def test_cerebras_failing_fails_over_to_llama_before_the_first_token_and_the_breaker_opens(llama, monkeypatch):
    monkeypatch.setenv("CEREBRAS_API_KEY", "test-key")
    with shim(config(llama, extra=[CEREBRAS], fast_lane={"fast": "cerebras"})) as server, replay("cerebras_500.yaml"):
        async with AsyncOpenAI(base_url=server.base_url, api_key="x") as client, client.responses.connect() as conn:
            for _ in range(3):
                event = await turn(conn, "fast", "hello")
                assert event.type in ("response.completed", "response.incomplete")
                assert "Cerebras" not in event.response.output_text
        r = router(server)
        assert r.stats.failovers == 2, "the third request skipped the open breaker"
        assert r.status()["cerebras"]["breaker"] == "open"


async def test_a_cerebras_answer_near_its_limit_routes_the_next_conversation_to_llama(llama, monkeypatch):
    monkeypatch.setenv("CEREBRAS_API_KEY", "test-key")
    with shim(config(llama, extra=[CEREBRAS], fast_lane={"fast": "cerebras"})) as server:
        async with AsyncOpenAI(base_url=server.base_url, api_key="x") as client, client.responses.connect() as conn:
            with replay("cerebras_near_limit.yaml"):
                assert (await turn(conn, "fast", "hello")).response.output_text == "Hello from Cerebras"
            with replay("cerebras_text.yaml") as cassette:
                event = await turn(conn, "fast", "new conversation")
                assert cassette.play_count == 0, "no request went to Cerebras"
            assert "Cerebras" not in event.response.output_text


async def test_llama_killed_mid_run_fails_over_to_the_simulator_then_recovers(llama):
    with shim(config(llama, extra=[SIMULATED])) as server:
        async with AsyncOpenAI(base_url=server.base_url, api_key="x") as client, client.responses.connect() as conn:
            first = await turn(conn, "local", "hello")
            assert "simulated" not in first.response.output_text
            llama.kill()
            second = await turn(conn, "local", "still there?", first.response.id)
            assert second.type == "response.completed"
            assert "simulated" in second.response.output_text, "served by the simulator, nothing duplicated"
            third = await turn(conn, "local", "and now?", second.response.id)
            assert "simulated" in third.response.output_text

            llama.process = None
            llama.start()
            deadline = time.monotonic() + 10
            llama_health = router(server).deployments["llama"].health
            while not llama_health.available(time.monotonic()) and time.monotonic() < deadline:
                await __import__("asyncio").sleep(0.1)
            fresh = await turn(conn, "local", "a new conversation")
            assert "simulated" not in fresh.response.output_text, "the health check closed llama's breaker"


async def test_readyz_reflects_backend_health(llama):
    with shim(config(llama, health_interval_s=0.1)) as server:
        base = server.base_url.removesuffix("/v1")
        ready = httpx2.get(f"{base}/readyz")
        assert ready.status_code == 200 and ready.json()["deployments"]["llama"]["available"]
        llama.kill()
        deadline = time.monotonic() + 10
        while httpx2.get(f"{base}/readyz").status_code == 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        down = httpx2.get(f"{base}/readyz")
        assert down.status_code == 503
        assert down.json()["deployments"]["llama"]["breaker"] == "open"


def test_check_config_prints_the_routing_table():
    result = subprocess.run(
        [sys.executable, "-m", "server_shim.cli", "check-config", str(EXAMPLE)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    lines = result.stdout.splitlines()
    assert "OK, 2 deployment(s), policy priority" in lines[0]
    assert any(line.split()[:3] == ["fast", "cerebras", "llama-3.3-70b"] and "fast lane" in line for line in lines)
    assert any(line.split()[:3] == ["fast", "llama-local", "tiny"] for line in lines)


def test_check_config_rejects_an_unknown_fast_lane_deployment(tmp_path: Path):
    bad = tmp_path / "bad.toml"
    bad.write_text(
        '[routing]\nfast_lane = { "fast" = "nowhere" }\n'
        '[[deployments]]\nname = "a"\nkind = "simulated"\nmodels = { "fast" = "x" }\n'
    )
    result = subprocess.run(
        [sys.executable, "-m", "server_shim.cli", "check-config", str(bad)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert "routing.fast_lane['fast'] names unknown deployment 'nowhere'" in result.stderr
