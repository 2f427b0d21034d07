"""The examples run as a user runs them (a subprocess, bounded time), so they cannot rot."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from server_shim import BackgroundServer

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
TIMEOUT_S = 60

pytestmark = pytest.mark.timeout(2 * TIMEOUT_S)


def run_example(*args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("RESPONSES_WS_TRANSPORT", None)
    done = subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S, check=False
    )
    assert done.returncode == 0, f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
    return done.stdout


def test_langchain_agent_runs_over_one_websocket() -> None:
    out = run_example("examples/langchain_agent.py")
    assert "transport=websocket" in out
    assert "model turns: 4" in out
    assert "websocket session: 4 turns" in out
    assert "over 1 websocket connection(s)" in out
    assert "returned: 42" in out


def test_langchain_agent_with_the_http_flag() -> None:
    out = run_example("examples/langchain_agent.py", "--transport", "http")
    assert "transport=http" in out
    assert "websocket session" not in out
    assert "over 0 websocket connection(s)" in out
    assert "returned: 42" in out


def test_langchain_agent_against_a_given_endpoint(server: BackgroundServer) -> None:
    out = run_example("examples/langchain_agent.py", "--base-url", server.base_url, "--model", "simulated-1")
    assert f"endpoint={server.base_url}" in out
    assert "websocket session: 4 turns" in out
    assert server.shim.stats.websocket_connections == 1


def test_openai_wrapped_chains_every_turn_after_the_first() -> None:
    out = run_example("examples/openai_wrapped.py", "--steps", "3")
    assert out.count("answer: Tool call_sim_") == 3
    assert "websocket session: 6 turns, 5 chained" in out
    assert "shim: 1 websocket connection(s)" in out


def test_agents_sdk_agent_runs_over_one_websocket() -> None:
    out = run_example("examples/agents_sdk_agent.py")
    assert "returned: 42" in out
    assert "websocket session: 4 turns, 3 chained" in out
    assert "shim: 1 websocket connection(s)" in out


@pytest.mark.parametrize("framework", ["pydantic-ai", "autogen", "langchain", "smolagents"])
def test_framework_agent_example_chains_every_turn_after_the_first(framework: str) -> None:
    out = run_example("examples/framework_agents.py", framework)
    assert out.count("record ") >= 3 and "record 5 is blue" in out
    assert f"{framework}: 5 of 6 turns chained, 0 over HTTP" in out


def test_base_url_needs_a_model() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "examples/openai_wrapped.py", "--base-url", "http://127.0.0.1:9/v1"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 2
    assert "--model is required" in done.stderr


def test_framework_agent_example_names_what_to_install_for_a_missing_framework() -> None:
    """LlamaIndex pins openai<3, so the main venv lacks it: the script says how to get it, exit 2."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "examples/framework_agents.py", "llama-index"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "llama-index needs 'llama_index'" in done.stderr
    assert "tests/frameworks/requirements.txt" in done.stderr
    assert "Traceback" not in done.stderr


def test_sidecar_config_is_valid() -> None:
    out = run_example("-m", "server_shim.cli", "check-config", "examples/sidecar.toml")
    assert "OK, 2 deployment(s)" in out
