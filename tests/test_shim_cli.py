"""The `responses-ws` console script, run as a subprocess with bounded time."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx2
import pytest
from openai import AsyncOpenAI
from support.chat_server import closed_port
from support.serve import SCRIPT, stop_cleanly, wait_healthy
from support.wire import completed_ok, run_turn


def run(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, check=False)


def test_help_lists_the_subcommands():
    result = run("--help")
    assert result.returncode == 0, result.stderr
    for command in ("serve", "demo"):
        assert command in result.stdout


def test_serve_help_lists_the_flags_that_must_keep_working():
    result = run("serve", "--help")
    assert result.returncode == 0
    for flag in ("--host", "--port", "--backend", "--api-key", "--config"):
        assert flag in result.stdout


def test_an_unknown_subcommand_fails_with_usage():
    result = run("bogus")
    assert result.returncode == 2 and "usage:" in result.stderr


def test_demo_runs_three_turns_and_prints_the_table():
    result = run("demo", "--turns", "3", "--payload-bytes", "500")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "SIMULATED" in out
    assert "HTTP, full history" in out and "WebSocket, chained" in out and "ratio" in out
    assert "Both transports produced the same outputs" in out


async def test_serve_with_flags_answers_the_sdk_and_stops_cleanly_on_sigint(serve_process):
    port = closed_port()
    process = serve_process("--host", "127.0.0.1", "--port", str(port), "--backend", "simulated", "--api-key", "k1")
    await asyncio.to_thread(wait_healthy, port, process)
    base_url = f"http://127.0.0.1:{port}/v1"
    assert httpx2.get(base_url + "/models").status_code == 401
    async with AsyncOpenAI(base_url=base_url, api_key="k1", max_retries=0) as sdk, sdk.responses.connect() as conn:
        completed_ok(await run_turn(conn, input="hi", store=False))
    stop_cleanly(process)


async def test_serve_reads_a_config_file_and_flags_override_it(serve_process, tmp_path):
    port = closed_port()
    config = tmp_path / "shim.toml"
    config.write_text(f'[server]\nport = {closed_port()}\napi_keys = ["from-file"]\nmax_frame_bytes = 2048\n')
    process = serve_process("--config", str(config), "--port", str(port))  # the flag wins over the file
    await asyncio.to_thread(wait_healthy, port, process)
    reply = httpx2.post(
        f"http://127.0.0.1:{port}/v1/responses",
        json={"model": "simulated-1", "input": "hi", "store": False},
        headers={"authorization": "Bearer from-file"},
    )
    assert reply.status_code == 200 and reply.json()["status"] == "completed"
    stop_cleanly(process, signal.SIGTERM)


async def test_serve_routes_the_deployments_of_a_config_file(serve_process, tmp_path):
    port = closed_port()
    config = tmp_path / "sidecar.toml"
    config.write_text(
        '[routing]\npolicy = "least_latency"\n'
        '[[deployments]]\nname = "sim"\nkind = "simulated"\nmodels = { "team-model" = "simulated-1" }\n'
    )
    process = serve_process("--config", str(config), "--port", str(port))
    await asyncio.to_thread(wait_healthy, port, process)
    base_url = f"http://127.0.0.1:{port}/v1"
    assert [m["id"] for m in httpx2.get(base_url + "/models").json()["data"]] == ["team-model"]
    assert httpx2.get(f"http://127.0.0.1:{port}/readyz").json()["deployments"]["sim"]["available"]
    async with AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0) as sdk, sdk.responses.connect() as conn:
        completed_ok(await run_turn(conn, model="team-model", input="hi", store=False))
    stop_cleanly(process)


def test_serve_refuses_both_backend_and_config_deployments(tmp_path):
    config = tmp_path / "sidecar.toml"
    config.write_text('[[deployments]]\nname = "sim"\nkind = "simulated"\nmodels = { "m" = "simulated-1" }\n')
    result = subprocess.run(
        [str(SCRIPT), "serve", "--config", str(config), "--backend", "http://127.0.0.1:9/v1"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "--backend and a config with [[deployments]] both name backends" in result.stderr


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--store", "postgres://db"], "store must be 'memory' or a redis://"),
        (["--api-keys-file", "/nonexistent/keys"], "API keys:"),
        (["--api-key", "alice sk-1", "--api-key", "bob sk-1"], "two tenants"),
    ],
)
def test_serve_refuses_a_bad_store_or_bad_keys_before_binding(flags, message):
    result = run("serve", "--port", str(closed_port()), *flags)
    assert result.returncode == 2
    assert message in result.stderr


def test_bench_outside_a_source_checkout_says_what_to_install(tmp_path):
    """An installed package has no benchmarks/ next to it: bench explains, exit status 2."""
    shutil.copytree(Path(__file__).resolve().parent.parent / "server_shim", tmp_path / "server_shim")
    result = subprocess.run(
        [sys.executable, "-c", "import sys; from server_shim.cli import main; sys.exit(main(['bench', '--quick']))"],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path), "PATH": os.environ["PATH"]},
    )
    assert result.returncode == 2
    assert "not part of the installed package" in result.stderr and "pip install -e '.[dev]'" in result.stderr


def test_bench_runs_the_checkouts_benchmarks_in_their_own_process():
    result = run("bench", "--help")
    assert result.returncode == 0, result.stderr
    assert "python -m benchmarks" in result.stdout
