"""Codex CLI, unmodified, against the shim on the simulated backend: a tool loop over WebSocket and over HTTP.

The CLI is the npm package pinned in tests/clients/package.json (`.ci/run` installs it with
`npm ci`). It runs with a temporary CODEX_HOME holding only the provider block the README gives,
on loopback; its exec tool runs a real shell command, whose output the simulator echoes back.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

CODEX = Path(__file__).parent / "clients" / "node_modules" / ".bin" / "codex"
KEY = "sk-codex-test"

pytestmark = pytest.mark.skipif(
    not CODEX.exists(), reason="Codex CLI not installed: run `npm ci --prefix tests/clients` (.ci/run does)"
)


def provider_config(base_url: str, *, websockets: bool) -> str:
    """The config.toml the README's "Clients" section gives, pointed at this server."""
    return f"""\
model = "simulated-1"
model_provider = "responses-ws"

[model_providers.responses-ws]
name = "responses-ws"
base_url = "{base_url}"
env_key = "RESPONSES_WS_KEY"
wire_api = "responses"
supports_websockets = {str(websockets).lower()}
"""


def run_codex(tmp_path: Path, base_url: str, prompt: str, *, websockets: bool) -> subprocess.CompletedProcess[str]:
    home = tmp_path / "codex-home"
    work = tmp_path / "work"
    home.mkdir()
    work.mkdir()
    (home / "config.toml").write_text(provider_config(base_url, websockets=websockets))
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "CODEX_HOME": str(home),
        "RESPONSES_WS_KEY": KEY,
        "NO_COLOR": "1",
    }
    return subprocess.run(
        [str(CODEX), "exec", "--skip-git-repo-check", prompt],
        cwd=work,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def codex_server(make_server, recorder):
    return make_server(validators=[recorder], api_keys=[KEY])


@pytest.mark.timeout(180)
def test_codex_runs_a_shell_command_through_its_exec_tool_over_a_chained_websocket(tmp_path, codex_server, recorder):
    marker = f"codex-{uuid.uuid4().hex[:8]}"
    done = run_codex(tmp_path, codex_server.base_url, f'call exec_command {{"cmd": "echo {marker}"}}', websockets=True)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "returned: " in done.stdout and marker in done.stdout, done.stdout[-4000:]

    stats = codex_server.shim.stats
    assert stats.websocket_connections >= 1 and stats.turns >= 3
    warmup, *turns = recorder.calls
    assert warmup.request.generate is False and warmup.previous_id is None
    assert all(call.previous_id is not None for call in turns), "every turn after the warm-up is chained"
    output_turn = next(c for c in turns if any(i["type"] == "function_call_output" for i in c.items))
    kinds = {item["type"] for item in output_turn.items}
    assert "function_call" not in kinds and "developer" not in {i.get("role") for i in output_turn.items}, kinds
    (output,) = [i for i in output_turn.items if i["type"] == "function_call_output"]
    assert marker in str(output["output"]), "the shell really ran"
    tools = {(tool["type"], tool.get("name")) for tool in warmup.request.tools or []}
    assert ("function", "exec_command") in tools and ("namespace", "multi_agent_v1") in tools


@pytest.mark.timeout(180)
def test_codex_runs_the_same_loop_over_http(tmp_path, codex_server, recorder):
    marker = f"codex-{uuid.uuid4().hex[:8]}"
    done = run_codex(tmp_path, codex_server.base_url, f'call exec_command {{"cmd": "echo {marker}"}}', websockets=False)
    assert done.returncode == 0, done.stderr[-4000:]
    assert marker in done.stdout, done.stdout[-4000:]
    assert codex_server.shim.stats.websocket_connections == 0
    assert len(recorder.calls) >= 2
    assert all(call.previous_id is None for call in recorder.calls), "over HTTP, with store false, Codex resends all"


def test_the_pinned_codex_version_is_the_one_installed():
    pinned = (Path(__file__).parent / "clients" / "package.json").read_text()
    version = subprocess.run([str(CODEX), "--version"], capture_output=True, text=True, timeout=30).stdout
    assert version.split()[-1] in pinned
    assert shutil.which("node") is not None
