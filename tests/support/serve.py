"""`responses-ws serve` as a real subprocess: start it, wait until it answers, stop or kill it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx2
import pytest

SCRIPT = Path(sys.executable).with_name("responses-ws")

ServeProcess = Callable[..., "subprocess.Popen[str]"]


@pytest.fixture
def serve_process() -> Iterator[ServeProcess]:
    started: list[subprocess.Popen[str]] = []

    def start(*args: str) -> subprocess.Popen[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RESPONSES_WS_")}
        process = subprocess.Popen(
            [str(SCRIPT), "--log-level", "WARNING", "serve", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            start_new_session=True,  # its own process group: teardown also ends the --workers children
        )
        started.append(process)
        return process

    yield start
    for process in started:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(5)


def worker_pids(parent: int) -> list[int]:
    """The `--workers` processes of a serve process (its spawned children, not multiprocessing's helpers)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == parent and b"spawn_main" in cmdline:
            pids.append(int(entry.name))
    return pids


def wait_healthy(port: int, process: subprocess.Popen[str], timeout: float = 60) -> None:
    """Until `serve` answers `/healthz`: its start-up imports take seconds, many more on a loaded machine."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"serve exited early: {process.stdout.read()}")
        try:
            if httpx2.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return
        except httpx2.TransportError:
            time.sleep(0.05)
    raise AssertionError("serve did not become healthy")


def stop_cleanly(process: subprocess.Popen[str], sig: int = signal.SIGINT) -> str:
    """uvicorn shuts down gracefully, then re-raises the signal so the exit status tells what stopped it."""
    process.send_signal(sig)
    assert process.wait(15) in (0, -sig)
    output = process.stdout.read()
    assert "Traceback" not in output, output
    return output
