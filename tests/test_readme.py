"""A README that runs: every `python`, `bash` and `console` block of README.md and docs/**/*.md is executed.

How the blocks run (in document order, against servers this module starts on loopback):

- `python`: the block is the whole program, run with this interpreter, working directory the
  repository root; it must exit 0 within its time limit.
- `console`: the first line is `$ <command>` and the rest its standard output, which must match.
- `bash`: each command line runs with bash from the repository root and must exit 0. A
  `responses-ws serve` line is a server: it must answer `/healthz`, then stop cleanly on SIGINT
  with no traceback (its port comes from `RESPONSES_WS_PORT`, which the defaults and the config
  files yield to; flags would not).
- The addresses the README's programs use are the ones this module's servers listen on: `127.0.0.1:8787` is
  replaced by a shim started here (`serve --api-key sk-local`, the simulated backend) and
  `127.0.0.1:6379` by a `redis-server` started here; nothing else in a block is changed.
- A block whose info string carries `{norun: <reason>}` is not run; the reason must be given, and
  the list of such blocks is pinned below so a new one is a deliberate change.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.chat_server import closed_port
from support.serve import wait_healthy

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```[ \t]*$", re.S | re.M)
RUNNABLE = {"python", "bash", "console"}
NOT_RUN = {  # blocks marked {norun: ...}, by their first line: each is a command that cannot run inside the suite
    "python3 -m venv .venv && . .venv/bin/activate && pip install . && responses-ws demo",
    ".ci/run",
    "docker build -t responses-ws . && docker run --rm -p 127.0.0.1:8787:8787 -e RESPONSES_WS_API_KEYS=sk-local responses-ws",
    "pip install -e '.[dev]' && python -m benchmarks          # or: responses-ws bench; --quick for a smoke run",
    "pip install -e '.[dev,llama]' && pytest -q",
    "apt-get install redis-server            # or any Redis 6+; persistence is up to you",
    'RESPONSES_WS_DEFAULT_MODEL=gpt-4o responses-ws serve   # the simulator now answers model="gpt-4o"',
}
PYTHON_TIMEOUT_S = 120
COMMAND_TIMEOUT_S = 120

pytestmark = pytest.mark.timeout(600)


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    language: str
    norun: str | None
    code: str

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks() -> list[Block]:
    found = []
    for path in DOCUMENTS:
        text = path.read_text()
        for match in FENCE.finditer(text):
            info = match.group(1).strip()
            language = info.split("{", 1)[0].strip().split(" ")[0]
            norun = re.search(r"\{norun:\s*([^}]*)\}", info)
            line = text.count("\n", 0, match.start()) + 1
            found.append(Block(path, line, language, norun.group(1).strip() if norun else None, match.group(2)))
    return found


RUN = [block for block in blocks() if block.language in RUNNABLE and block.norun is None]


@pytest.fixture(scope="module")
def shim(tmp_path_factory: pytest.TempPathFactory, _redis_server: Any) -> Iterator[dict[str, str]]:
    """The shim the README's snippets talk to, and the environment every block runs in."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RESPONSES_WS_", "OPENAI_"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["XDG_STATE_HOME"] = str(tmp_path_factory.mktemp("state"))  # the usage ledger of every server here
    env["OPENAI_AGENTS_DISABLE_TRACING"] = "1"  # the Agents SDK would export traces to api.openai.com
    port = closed_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "server_shim.cli", "serve", "--port", str(port), "--api-key", "sk-local"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    wait_healthy(port, process)
    env["_README_SHIM"] = f"127.0.0.1:{port}"
    env["_README_REDIS"] = f"127.0.0.1:{_redis_server.port}"
    yield env
    process.send_signal(signal.SIGINT)
    process.wait(30)


def test_every_block_that_does_not_run_says_why_and_is_known():
    skipped = [block for block in blocks() if block.norun is not None]
    for block in skipped:
        assert block.norun, f"{block.name}: {{norun: ...}} needs a reason"
    assert {block.code.splitlines()[0] for block in skipped} == NOT_RUN
    assert len(RUN) >= 10, "the README's examples are run"


@pytest.mark.parametrize("block", RUN, ids=[block.name for block in RUN])
def test_readme_block_runs(block: Block, shim: dict[str, str]) -> None:
    code = block.code.replace("127.0.0.1:8787", shim["_README_SHIM"]).replace("127.0.0.1:6379", shim["_README_REDIS"])
    if block.language == "console":  # run as written: the output names the addresses the command prints
        command, _, expected = block.code.partition("\n")
        assert command.startswith("$ "), f"{block.name}: a console block starts with '$ <command>'"
        result = subprocess.run(
            ["bash", "-c", command[2:]], cwd=ROOT, env=shim, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S
        )
        assert result.returncode == 0, f"{block.name}: {command}\n{result.stderr}"
        assert result.stdout.strip() == expected.strip(), f"{block.name}: {command}"
        return
    if block.language == "python":
        result = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, env=shim, capture_output=True, text=True, timeout=PYTHON_TIMEOUT_S
        )
        assert result.returncode == 0, f"{block.name}\n{code}\n{result.stdout}\n{result.stderr}"
        return
    for command in commands(code):
        if re.match(r"responses-ws (--\S+ \S+ )*serve\b", command):
            run_server(command, shim, block)
        else:
            result = subprocess.run(
                ["bash", "-c", command], cwd=ROOT, env=shim, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S
            )
            assert result.returncode == 0, f"{block.name}: {command}\n{result.stdout}\n{result.stderr}"


def commands(code: str) -> list[str]:
    """Command lines of a bash block (continuations joined, comment-only and blank lines dropped)."""
    lines = code.replace("\\\n", " ").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def run_server(command: str, env: dict[str, str], block: Block) -> None:
    port = closed_port()
    process = subprocess.Popen(
        ["bash", "-c", f"exec {command}"],
        cwd=ROOT,
        env={**env, "RESPONSES_WS_PORT": str(port)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        wait_healthy(port, process)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)  # the server itself; with --workers it stops its children
        try:
            process.wait(30)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)  # anything left in its session
    output = process.stdout.read() if process.stdout else ""
    assert process.returncode in (0, -signal.SIGINT), f"{block.name}: {command}\n{output}"
    assert "Traceback" not in output, f"{block.name}: {command}\n{output}"


def test_every_relative_link_points_into_the_repository():
    for path in DOCUMENTS:
        text = path.read_text()
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if re.match(r"[a-z]+:", target):
                continue  # an absolute URL
            resolved = (path.parent / target).resolve()
            assert resolved.is_relative_to(ROOT) and resolved.exists(), f"{path.name}: link to {target}"


def test_every_server_setting_is_named_in_the_readme():
    """A setting nobody can find is a setting nobody sets: each is in the README as `name` or as its
    `serve` flag (its `RESPONSES_WS_<NAME>` variable follows from the rule stated there)."""
    from server_shim.settings import Settings

    readme = (ROOT / "README.md").read_text()
    forms = ("`{}`", "{} =", "--{}")
    missing = [
        name
        for name in Settings.model_fields
        if not any(form.format(name if form[0] != "-" else name.replace("_", "-")) in readme for form in forms)
    ]
    assert not missing, f"settings the README does not name: {missing}"


ERROR_MAKERS = {"APIError", "Refusal", "invalid", "failed"}
"""The calls in server_shim that carry an error code as a literal (`APIError(status, code, ...)`,
`invalid(code, ...)`, admission's `Refusal`, a steer's `failed`)."""
NEVER_SENT = {
    "http_error": "Starlette's fallback for an HTTP status other than 404/405, which no route raises",
}


def test_every_error_code_the_server_makes_is_in_the_readme():
    import ast

    readme = (ROOT / "README.md").read_text()
    codes: dict[str, str] = {}
    for path in sorted((ROOT / "server_shim").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            for arg in node.args[:2] if name in ERROR_MAKERS else ():
                if (
                    isinstance(arg, ast.Constant)
                    and isinstance(arg.value, str)
                    and re.fullmatch(r"[a-z]+(_[a-z]+)+", arg.value)
                ):
                    codes.setdefault(arg.value, path.name)
    assert len(codes) > 40, sorted(codes)  # the walk still finds the codes
    missing = {code: where for code, where in codes.items() if f"`{code}`" not in readme and code not in NEVER_SENT}
    assert not missing, f"error codes the README does not name (code: module): {missing}"
