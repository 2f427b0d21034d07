"""The LiteLLM peer's own setup step: a separate virtualenv, never a project dependency.

`pip install 'litellm[proxy]'` fails on this machine on a missing `litellm-proxy` pin, so
this installs `litellm` itself, reads its `proxy` extra from the installed metadata, and
installs those requirements minus the broken pin. Every step is bounded in time; the
outcome (version, or the step that failed and why) goes into the suite's results.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .common import progress

DEFAULT_VENV = Path(__file__).resolve().parent / ".litellm-venv"
# The version the issue measured. 1.107.0 was a compromised release: never install it.
DEFAULT_SPEC = "litellm==1.110.2"
SKIP_PREFIXES = ("litellm-proxy",)  # the missing pin that breaks `litellm[proxy]`
STEP_TIMEOUT_S = 900
DEEP_CHECK_TIMEOUT_S = 600
MAX_RELAXATIONS = 8

_PROXY_REQUIREMENTS = r"""
import importlib.metadata as md, json, re
reqs = md.requires("litellm") or []
proxy = []
for r in reqs:
    if "extra" in r and re.search(r"extra\s*==\s*['\"]proxy['\"]", r):
        spec = r.split(";", 1)[0].strip()
        marker = r.split(";", 1)[1]
        marker = re.sub(r"(and|or)?\s*extra\s*==\s*['\"]proxy['\"]\s*(and|or)?", " ", marker).strip()
        proxy.append(spec + ("; " + marker if marker else ""))
print(json.dumps({"version": md.version("litellm"), "proxy": proxy}))
"""

_CHECK = "import litellm.proxy.proxy_server, importlib.metadata as md; print(md.version('litellm'))"
# Fast check for an existing venv: the distributions the proxy needs are there (no slow import).
_QUICK_CHECK = "import importlib.metadata as md; [md.version(n) for n in ('fastapi', 'uvicorn', 'websockets')]; print(md.version('litellm'))"


@dataclass
class SetupResult:
    ok: bool
    venv: str
    spec: str
    version: str | None = None
    installed_now: bool = False
    skipped_requirements: list[str] = field(default_factory=list)
    relaxed_requirements: list[str] = field(default_factory=list)
    failed_step: str | None = None
    error: str | None = None
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def litellm_binary(venv: Path) -> Path:
    return venv / "bin" / "litellm"


def _run(cmd: list[str], timeout: float = STEP_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "LITELLM_TELEMETRY_DISABLED": "true"}
    env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, check=False)


def _installed_version(venv: Path, *, deep: bool = False) -> str | None:
    python = venv_python(venv)
    if not python.exists() or not litellm_binary(venv).exists():
        return None
    try:
        # The first deep import compiles all of LiteLLM's modules. With 120 s, a fresh install on the
        # loaded 2-core machine was reported failed while the retry right after printed the version.
        done = _run(
            [str(python), "-c", _CHECK if deep else _QUICK_CHECK], timeout=DEEP_CHECK_TIMEOUT_S if deep else 120
        )
    except subprocess.TimeoutExpired:
        return None
    return done.stdout.strip().splitlines()[-1] if done.returncode == 0 and done.stdout.strip() else None


def ensure_litellm(venv: Path = DEFAULT_VENV, spec: str = DEFAULT_SPEC, *, install: bool = True) -> SetupResult:
    """Return the ready venv, installing it first when `install` is true and it is missing."""
    start = time.perf_counter()
    result = SetupResult(ok=False, venv=str(venv), spec=spec)
    version = _installed_version(venv)
    if version is not None:
        result.ok, result.version = True, version
        result.seconds = time.perf_counter() - start
        return result
    if not install:
        result.failed_step = "not installed"
        result.error = f"no LiteLLM proxy in {venv}; run `python -m benchmarks litellm` without --quick or --no-install to install it"
        return result
    steps: list[tuple[str, list[str]]] = []
    if not venv_python(venv).exists():
        steps.append(("create venv", [sys.executable, "-m", "venv", str(venv)]))
    pip = [str(venv_python(venv)), "-m", "pip", "install", "--quiet"]
    steps.append(("pip install litellm", [*pip, "--upgrade", "pip"]))
    steps.append(("pip install litellm", [*pip, spec]))
    for name, cmd in steps:
        progress(f"litellm setup: {name} ({' '.join(cmd[-2:])})")
        if not _step(result, name, cmd):
            result.seconds = time.perf_counter() - start
            return result
    progress("litellm setup: reading the proxy extra's requirements")
    try:
        done = _run([str(venv_python(venv)), "-c", _PROXY_REQUIREMENTS], timeout=120)
        meta = json.loads(done.stdout.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, ValueError, IndexError) as exc:
        result.failed_step, result.error = "read proxy extra", repr(exc)
        result.seconds = time.perf_counter() - start
        return result
    wanted = [r for r in meta["proxy"] if not r.lower().startswith(SKIP_PREFIXES)]
    result.skipped_requirements = [r for r in meta["proxy"] if r.lower().startswith(SKIP_PREFIXES)]
    progress(f"litellm setup: pip install {len(wanted)} proxy requirements (skipping {result.skipped_requirements})")
    for _ in range(MAX_RELAXATIONS):
        if not wanted or _step(result, "pip install proxy requirements", [*pip, *wanted]):
            result.failed_step = result.error = None
            break
        missing = _missing_requirement(result.error or "", wanted)
        if missing is None:
            result.seconds = time.perf_counter() - start
            return result
        # A pin the index cannot satisfy: try the name unpinned, then leave it out; the import check decides.
        index = wanted.index(missing)
        name = re.split(r"[<>=!~;\[ ]", missing, maxsplit=1)[0]
        if missing != name:
            wanted[index] = name
            result.relaxed_requirements.append(f"{missing} -> {name}")
        else:
            del wanted[index]
            result.skipped_requirements.append(missing)
        progress(f"litellm setup: {missing!r} cannot be installed here; retrying without that pin")
    else:
        result.seconds = time.perf_counter() - start
        return result
    result.version = _installed_version(venv, deep=True)
    result.ok = result.version is not None
    result.installed_now = True
    if not result.ok:
        result.failed_step = "import litellm.proxy.proxy_server"
        done = _run([str(venv_python(venv)), "-c", _CHECK], timeout=120)
        result.error = (done.stderr or done.stdout)[-2000:]
    result.seconds = time.perf_counter() - start
    return result


def _missing_requirement(error: str, wanted: list[str]) -> str | None:
    """The requirement pip named in 'No matching distribution found for X', as written in `wanted`."""
    found = re.search(r"No matching distribution found for ([^\s]+)", error)
    if not found:
        return None
    name = re.split(r"[<>=!~;\[ ]", found.group(1), maxsplit=1)[0].lower().replace("_", "-")
    for requirement in wanted:
        if re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].lower().replace("_", "-") == name:
            return requirement
    return None


def _step(result: SetupResult, name: str, cmd: list[str]) -> bool:
    try:
        done = _run(cmd)
    except subprocess.TimeoutExpired:
        result.failed_step, result.error = name, f"timed out after {STEP_TIMEOUT_S} s"
        return False
    except OSError as exc:
        result.failed_step, result.error = name, repr(exc)
        return False
    if done.returncode != 0:
        result.failed_step = name
        result.error = (done.stderr or done.stdout)[-2000:]
        return False
    return True


if __name__ == "__main__":
    print(json.dumps(ensure_litellm().as_dict(), indent=2))
