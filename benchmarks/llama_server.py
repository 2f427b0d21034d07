"""llama-cpp-python's OpenAI-compatible server (`python -m llama_cpp.server`) as a loopback subprocess.

Every setting is passed as a flag and the child gets a clean environment: the server's
settings also read unprefixed variables such as MODEL, PORT or N_CTX, which a developer's
shell may well have set. The server has no health route, so readiness is the first 200
from `GET /v1/models`.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx2

MODEL_ALIAS = "tiny-llama"
PR_SET_PDEATHSIG = 1
CLEAN_ENV_KEYS = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "LD_LIBRARY_PATH")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class LlamaServer:
    """One server process; `start()` returns once it answers, `stop()` ends it (SIGTERM, then SIGKILL)."""

    model_path: Path
    log_path: Path
    alias: str = MODEL_ALIAS
    n_ctx: int = 2048
    n_threads: int = 1
    """llama.cpp's threads spin while they wait for each other: more threads than free cores stall a
    request for seconds when other work takes a core (benchmarks/agent_llama.py); the tiny model
    gains nothing from a second thread."""
    seed: int = 0
    port: int = field(default_factory=free_port)
    process: subprocess.Popen | None = None
    startup_s: float | None = None

    @property
    def base_url(self) -> str:
        """The OpenAI-style base URL, ending in /v1."""
        return f"http://127.0.0.1:{self.port}/v1"

    def command(self) -> list[str]:
        flags = {
            "model": str(self.model_path),
            "model_alias": self.alias,
            "host": "127.0.0.1",
            "port": self.port,
            "n_ctx": self.n_ctx,
            "n_batch": 512,
            "n_threads": self.n_threads,
            "n_threads_batch": self.n_threads,
            "n_gpu_layers": 0,
            "seed": self.seed,
            "interrupt_requests": False,  # else a new request silently cuts off a stream in progress
            "cache": False,
            "use_mmap": True,
            "verbose": False,
        }
        args = [sys.executable, "-m", "llama_cpp.server"]
        for name, value in flags.items():
            args += [f"--{name}", str(value)]
        return args

    def start(self, timeout_s: float = 30.0) -> LlamaServer:
        if self.process is not None:
            raise RuntimeError("this LlamaServer was already started; make a new one")
        env = {key: os.environ[key] for key in CLEAN_ENV_KEYS if key in os.environ}
        started = time.perf_counter()
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.command(),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )
        deadline = started + timeout_s
        while time.perf_counter() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"llama_cpp.server exited with {self.process.returncode}: {self.log_tail()}")
            if self._answers():
                self.startup_s = time.perf_counter() - started
                return self
            time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"llama_cpp.server not ready after {timeout_s} s: {self.log_tail()}")

    def _answers(self) -> bool:
        try:
            return httpx2.get(f"{self.base_url}/models", timeout=1.0).status_code == 200
        except httpx2.HTTPError:
            return False

    def kill(self) -> None:
        """End it abruptly, as a crash would."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()

    def log_tail(self, nbytes: int = 2000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_bytes()[-nbytes:].decode(errors="replace")
        return ""

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _die_with_parent() -> None:
    """In the child, before exec: get SIGTERM when the test process dies, so no server outlives a run."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
