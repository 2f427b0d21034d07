"""The `responses-ws` console script, run as a subprocess with bounded time."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx2
import pytest
from openai import AsyncOpenAI
from support.chat_server import closed_port
from support.serve import SCRIPT, stop_cleanly, wait_healthy
from support.wire import completed_ok, run_turn

from server_shim.cli import parse_args


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


def test_demo_runs_three_turns_and_prints_the_table_without_touching_the_usage_ledger(tmp_path):
    """Simulated turns are not usage: the user's ledger (under XDG_STATE_HOME or ~/.local/state) stays
    absent, and the output is the table, not a log line per turn."""
    env = {**os.environ, "HOME": str(tmp_path), "XDG_STATE_HOME": str(tmp_path / "state")}
    env = {k: v for k, v in env.items() if not k.startswith("RESPONSES_WS_")}
    command = [str(SCRIPT), "demo", "--turns", "3", "--payload-bytes", "500"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False, env=env)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "SIMULATED" in out
    assert "HTTP, full history" in out and "WebSocket, chained" in out and "ratio" in out
    assert "Both transports produced the same outputs" in out
    assert " INFO " not in result.stdout + result.stderr
    assert [p for p in tmp_path.rglob("*") if "usage" in p.name] == []


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


@pytest.mark.parametrize("backend", ["vllm", "127.0.0.1:8000", "htp://127.0.0.1:8000/v1"])
def test_a_backend_that_is_not_an_http_url_stops_serve_and_check_config_with_one_line(backend, tmp_path):
    config = tmp_path / "sidecar.toml"
    config.write_text(
        f'[[deployments]]\nname = "llama"\nkind = "openai_compatible"\nbase_url = "{backend}"\nmodels = {{ m = "m" }}\n'
    )
    served = run("serve", "--port", str(closed_port()), "--backend", backend, timeout=20)
    checked = run("check-config", str(config))
    assert served.returncode == 2 and checked.returncode == 2
    assert served.stderr.splitlines() == [
        f"responses-ws: flag: --backend: expected 'simulated' or an http:// or https:// URL such as "
        f"http://127.0.0.1:8000/v1, got {backend!r}"
    ]
    assert checked.stderr.splitlines() == [
        f"responses-ws: {config}: deployments[0] ('llama'): deployment 'llama': base_url must be an http:// or "
        "https:// URL"
    ]


WITHOUT_REDIS = """
import sys

class NoRedis:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "redis":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, NoRedis())
from server_shim.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize(
    "args",
    [
        ["serve", "--workers", "2", "--store", "redis://127.0.0.1:6379/0"],
        ["serve", "--store", "redis://127.0.0.1:6379/0"],
        ["usage", "--store", "redis://127.0.0.1:6379/0"],
    ],
)
def test_a_redis_store_without_the_redis_package_is_one_line_naming_the_extra_before_binding(args):
    port = ["--port", str(closed_port())] if args[0] == "serve" else []
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_REDIS, *args, *port],
        capture_output=True,
        text=True,
        timeout=20,
        env=clean_env(),
    )
    assert result.returncode == 2, result.stderr
    expected = "responses-ws: store: a redis:// store needs the redis package: pip install 'responses-ws[redis]'\n"
    assert result.stderr == expected


def bench_installed(tmp_path: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`responses-ws bench ARGS` from a non-editable install (server_shim alone in a folder), run in `cwd`."""
    installed = tmp_path / "site-packages"
    shutil.copytree(Path(__file__).resolve().parent.parent / "server_shim", installed / "server_shim")
    script = "import sys; from server_shim.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-P", "-c", script, "bench", *args],  # -P: the package from the install, not from cwd
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        env={"PYTHONPATH": str(installed), "PATH": os.environ["PATH"]},
    )


def test_bench_outside_a_source_checkout_says_what_to_install(tmp_path):
    """An installed package has no benchmarks/ next to it nor in the current directory: exit status 2."""
    result = bench_installed(tmp_path, tmp_path, "--quick")
    assert result.returncode == 2
    assert "not part of the installed package" in result.stderr and "pip install -e '.[dev]'" in result.stderr


def test_bench_help_outside_a_source_checkout_lists_the_suites_and_succeeds(tmp_path):
    result = bench_installed(tmp_path, tmp_path, "--help")
    assert result.returncode == 0, result.stderr
    assert "git clone" in result.stdout and "overhead, agent, agent-llama, relay, litellm, replicas" in result.stdout


def test_bench_from_a_non_editable_install_finds_the_benchmarks_of_the_current_directory(tmp_path):
    checkout = Path(__file__).resolve().parent.parent
    result = bench_installed(tmp_path, checkout, "--help")
    assert result.returncode == 0, result.stderr
    assert "usage: python -m benchmarks" in result.stdout and "floor" in result.stdout


def clean_env(**extra: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("RESPONSES_WS_")}, **extra}


def test_check_config_and_serve_list_every_problem_one_line_each_and_never_a_traceback(tmp_path):
    config = tmp_path / "bad.toml"
    config.write_text('[server]\nport = "abc"\nhost = 5\nprot = 8787\n')
    for args in (["check-config", str(config)], ["serve", "--config", str(config)]):
        result = subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=30, env=clean_env())
        assert result.returncode == 2, result
        lines = result.stderr.splitlines()
        assert len(lines) == 3 and "Traceback" not in result.stderr
        assert f"{config}: server.port: expected a valid integer" in lines[1]
        assert lines[2] == f"responses-ws: {config}: server.prot: unknown key (did you mean 'port'?)"


def test_a_bad_variable_is_one_line_naming_it():
    result = subprocess.run(
        [str(SCRIPT), "serve"], capture_output=True, text=True, timeout=30, env=clean_env(RESPONSES_WS_PORT="abc")
    )
    assert result.returncode == 2
    assert result.stderr.startswith("responses-ws: environment: RESPONSES_WS_PORT: expected a valid integer")
    assert len(result.stderr.splitlines()) == 1


async def test_serve_says_where_it_listens_what_it_routes_to_and_that_auth_is_on_and_a_refused_key_logs_no_error():
    port = closed_port()
    process = subprocess.Popen(
        [str(SCRIPT), "serve", "--port", str(port), "--log-level", "info"],  # the global flag after the subcommand
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=clean_env(RESPONSES_WS_API_KEYS="k1,k2", PYTHONMALLOC="pymalloc"),  # keys: a comma-separated list
    )
    try:
        await asyncio.to_thread(wait_healthy, port, process)
        base_url = f"http://127.0.0.1:{port}/v1"
        async with AsyncOpenAI(base_url=base_url, api_key="wrong", max_retries=0) as sdk:
            with pytest.raises(Exception, match="401"):
                async with sdk.responses.connect() as conn:
                    await run_turn(conn, input="hi", store=False)
        async with AsyncOpenAI(base_url=base_url, api_key="k2", max_retries=0) as sdk, sdk.responses.connect() as conn:
            completed_ok(await run_turn(conn, input="hi", store=False))
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(15)
    output = process.stdout.read()
    assert f"listening on http://127.0.0.1:{port} (WebSocket ws://127.0.0.1:{port}/v1/responses" in output
    assert "deployment 'simulated' (simulated) serves models simulated-1" in output
    assert (
        "auth on: 2 api key(s), 2 tenant(s), each at most 512 WebSocket connections, 256 kept free for each" in output
    )
    assert (
        "memory: Python's allocator (pymalloc) keeps part of a burst's peak RSS; PYTHONMALLOC=malloc gives it back"
        in output
    )
    assert '"WebSocket /v1/responses" 401' in output
    assert " ERROR " not in output and "Traceback" not in output, output
    assert "k1" not in output and "k2" not in output.replace(f":{port}", ""), "no key in any log line"


async def test_serve_without_pythonmalloc_runs_itself_again_on_the_c_allocator_in_the_same_process():
    """Python's allocator keeps part of a burst's peak RSS (README, Load): a bare `serve` replaces itself with the
    same command and PYTHONMALLOC=malloc, keeping its process id (what a supervisor watches)."""
    port = closed_port()
    env = {k: v for k, v in clean_env().items() if k != "PYTHONMALLOC"}
    process = subprocess.Popen(
        [str(SCRIPT), "serve", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        await asyncio.to_thread(wait_healthy, port, process)
        environ = Path(f"/proc/{process.pid}/environ").read_bytes().split(b"\0")
        cmdline = Path(f"/proc/{process.pid}/cmdline").read_bytes().split(b"\0")
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(15)
    output = process.stdout.read()
    assert b"PYTHONMALLOC=malloc" in environ
    assert cmdline[1:4] == [str(SCRIPT).encode(), b"serve", b"--port"], cmdline  # the same command
    assert "memory: C allocator: memory freed after a burst of clients goes back" in output
    assert output.count(f"listening on http://127.0.0.1:{port}") == 1 and "Traceback" not in output, output


def test_the_command_imports_no_server_before_serve_decides_on_the_allocator():
    """Running again on the C allocator costs an interpreter start and the command's own modules, not the server's."""
    code = "import json, sys, server_shim.cli, server_shim.allocator; print(json.dumps(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    loaded = set(json.loads(result.stdout))
    assert {"server_shim", "server_shim.cli", "server_shim.allocator"} <= loaded
    assert not loaded & {"server_shim.app", "server_shim.server", "server_shim.loading", "server_shim.trim"}, loaded


async def test_serve_that_cannot_run_itself_again_says_so_and_serves_on_pythons_allocator():
    port = closed_port()
    code = "import sys; sys.executable = '/nonexistent/python'; from server_shim.cli import main; sys.exit(main())"
    env = {k: v for k, v in clean_env().items() if k != "PYTHONMALLOC"}
    process = subprocess.Popen(
        [sys.executable, "-c", code, "serve", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        await asyncio.to_thread(wait_healthy, port, process)
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(15)
    output = process.stdout.read()
    assert "could not start again on the C allocator (/nonexistent/python: [Errno 2]" in output, output
    assert "memory: Python's allocator (pymalloc) keeps part of a burst's peak RSS" in output
    assert "Traceback" not in output, output


@pytest.mark.parametrize("closed", [1, 2], ids=["stdout", "stderr"])
async def test_a_bare_serve_with_stdout_or_stderr_closed_still_starts_on_the_c_allocator(closed: int):
    """Init scripts and daemon managers start servers with `>&-`: Python's stream is then None, and the
    flush before running again must not stop the start."""
    port = closed_port()
    env = {k: v for k, v in clean_env().items() if k != "PYTHONMALLOC"}
    process = subprocess.Popen(
        [str(SCRIPT), "serve", "--port", str(port)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        preexec_fn=lambda: os.close(closed),
    )
    try:
        await asyncio.to_thread(wait_until_answering, port, process)
        environ = Path(f"/proc/{process.pid}/environ").read_bytes().split(b"\0")
        assert b"PYTHONMALLOC=malloc" in environ
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(15)


def wait_until_answering(port: int, process: subprocess.Popen[bytes], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, f"serve exited early with {process.returncode}"
        with contextlib.suppress(httpx2.TransportError):
            if httpx2.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return
        time.sleep(0.05)
    raise AssertionError("serve did not answer /healthz")


def test_a_port_in_use_is_one_clear_error_line():
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run("serve", "--port", str(port))
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and f"cannot listen on 127.0.0.1:{port}: Address already in use" in lines[0], lines


async def test_an_unreachable_backend_is_reported_at_startup_and_readyz_waits_for_an_answer():
    port = closed_port()
    backend = f"http://127.0.0.1:{closed_port()}/v1"
    process = subprocess.Popen(
        [str(SCRIPT), "serve", "--port", str(port), "--backend", backend, "--host", "0.0.0.0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=clean_env(),
    )
    try:
        await asyncio.to_thread(wait_healthy, port, process)
        ready = httpx2.get(f"http://127.0.0.1:{port}/readyz")
        assert ready.status_code == 503
        assert ready.json()["deployments"]["default"]["answered"] is False
        models = httpx2.get(f"http://127.0.0.1:{port}/v1/models")
        assert models.status_code == 502 and models.json()["error"]["code"] == "backend_error", "not an empty list"
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(15)
    output = process.stdout.read()
    assert "WARNING responses_ws: listening on 0.0.0.0 with no api key" in output
    assert "deployment 'default' does not answer" in output
    assert "no deployment answers yet: /readyz says 503 until one does" in output


async def test_an_unreachable_store_is_reported_at_startup_and_readyz_waits_for_it():
    port = closed_port()
    store_port = closed_port()
    process = subprocess.Popen(
        [str(SCRIPT), "serve", "--port", str(port), "--store", f"redis://:secret@127.0.0.1:{store_port}/0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=clean_env(),
    )
    try:
        await asyncio.to_thread(wait_healthy, port, process)
        ready = httpx2.get(f"http://127.0.0.1:{port}/readyz")
        assert ready.status_code == 503, ready.text
        assert ready.json()["store"] == {"kind": "redis", "reachable": False}
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(15)
    output = process.stdout.read()
    assert f"the response store at 127.0.0.1:{store_port} does not answer: /readyz says 503 until it does" in output
    assert "secret" not in output


@pytest.mark.parametrize(
    ("argv", "level"),
    [
        (["serve"], "INFO"),
        (["check-config", "shim.toml"], "INFO"),
        (["demo"], "WARNING"),
        (["--log-level", "debug", "serve"], "DEBUG"),
        (["serve", "--log-level", "error"], "ERROR"),
        (["--log-level", "info", "demo"], "INFO"),
        (["demo", "--log-level", "info"], "INFO"),
    ],
)
def test_each_command_logs_at_its_own_default_level_and_the_flag_works_before_or_after_it(argv, level):
    """`demo` is quiet by default; that default once leaked into every command through the shared flag
    (`serve` logged nothing at start-up)."""
    assert parse_args(argv).log_level == level
