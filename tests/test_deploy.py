"""The deployment kit (Dockerfile, compose, Kubernetes sidecar, systemd): every `responses-ws` command
line in it is one the CLI accepts, with settings that validate as `serve` would validate them, and
the probes, ports and stop timeouts agree with what the shim does.

The image itself is built and run only where a container engine answers (`docker info`); elsewhere
that test is skipped, never counted as a pass.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import time
import tomllib
from pathlib import Path
from typing import Any

import httpx2
import pytest
import yaml

from server_shim.cli import _flag_overrides, build_parser
from server_shim.loading import ConfigError, Loaded, load

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
UVICORN_MARGIN_S = 5  # server.uvicorn_config: timeout_graceful_shutdown = drain_timeout_s + 5


def accepted(argv: list[str], env: dict[str, str], files: dict[str, Path]) -> tuple[Any, Loaded | None]:
    """Parse like `responses-ws` would, then validate the settings `serve`/`check-config` would use."""
    args = build_parser().parse_args(argv)  # SystemExit (a failed test) on anything argparse refuses
    path = getattr(args, "config", None) or getattr(args, "file", None)
    real = str(files[path]) if path is not None else None
    if args.command == "serve":
        return args, load(real, _flag_overrides(args), env)
    if args.command == "check-config":
        return args, load(real, {}, env)
    return args, None


def instructions(dockerfile: str) -> dict[str, str]:
    """Last value of each instruction, continuation lines joined."""
    found: dict[str, str] = {}
    for line in dockerfile.replace("\\\n", " ").splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            keyword, _, rest = line.strip().partition(" ")
            found[keyword.upper()] = rest.strip()
    return found


def test_the_dockerfile_runs_serve_as_a_non_root_user_with_a_healthcheck():
    found = instructions((ROOT / "Dockerfile").read_text())
    assert json.loads(found["ENTRYPOINT"]) == ["responses-ws"]
    args, loaded = accepted(json.loads(found["CMD"]), {}, {})
    assert args.command == "serve" and loaded is not None
    assert found["EXPOSE"] == str(loaded.settings.port)
    assert found["USER"] not in ("0", "root")
    healthcheck = re.search(r'CMD \["python", "-c", "(.*)"\]', found["HEALTHCHECK"])
    assert healthcheck is not None
    code = healthcheck.group(1)
    compile(code, "HEALTHCHECK", "exec")
    assert f"127.0.0.1:{loaded.settings.port}/healthz" in code


def test_the_dockerfile_copies_every_package_the_distribution_ships():
    """The build stage copies package folders one by one: a new top-level package left out builds a
    wheel without it, and the image fails at start-up with ModuleNotFoundError (docker is not here)."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = {pattern.rstrip("*") for pattern in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]}
    copied = {line.split()[1] for line in (ROOT / "Dockerfile").read_text().splitlines() if line.startswith("COPY ")}
    assert packages and packages <= copied, f"not copied into the image: {sorted(packages - copied)}"


def test_the_compose_file_runs_the_shim_in_front_of_llama_cpp_with_a_config_that_validates():
    compose = yaml.safe_load((DEPLOY / "compose" / "compose.yaml").read_text())
    shim = compose["services"]["shim"]
    files = {
        target: (DEPLOY / "compose" / source).resolve()
        for source, target, *_ in (volume.split(":") for volume in shim["volumes"])
    }
    _, loaded = accepted(shim["command"], dict(shim["environment"]), files)
    assert loaded is not None and loaded.keys and loaded.settings.log_format == "json"
    (deployment,) = loaded.config.deployments
    llama = compose["services"]["llama"]["command"]
    assert deployment.base_url == f"http://llama:{llama[llama.index('--port') + 1]}/v1"
    assert shim["ports"] == [f"127.0.0.1:{loaded.settings.port}:{loaded.settings.port}"]
    assert "vllm/vllm-openai" in (DEPLOY / "compose" / "compose.yaml").read_text(), "the commented vLLM variant"


def test_the_kubernetes_sidecar_probes_the_shim_and_waits_for_its_drain(tmp_path):
    documents = list(yaml.safe_load_all((DEPLOY / "kubernetes" / "sidecar.yaml").read_text()))
    kinds = {doc["kind"]: doc for doc in documents}
    config = tmp_path / "shim.toml"
    config.write_text(kinds["ConfigMap"]["data"]["shim.toml"])
    secrets = kinds["Secret"]["stringData"]
    pod = kinds["Deployment"]["spec"]["template"]["spec"]
    (sidecar,) = pod["initContainers"]
    assert sidecar["restartPolicy"] == "Always", "a native sidecar: up before the agent, stopped after it"
    env = {
        e["name"]: e["value"] if "value" in e else secrets[e["valueFrom"]["secretKeyRef"]["key"]]
        for e in sidecar["env"]
    }
    mount = next(m["mountPath"] for m in sidecar["volumeMounts"] if m["name"] == "config")
    _, loaded = accepted(sidecar["args"], env, {f"{mount}/shim.toml": config})
    assert loaded is not None and loaded.keys, "bound to the pod's interfaces, so clients need a key"
    port = loaded.settings.port
    assert {p["name"]: p["containerPort"] for p in sidecar["ports"]} == {"http": port}
    assert sidecar["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert sidecar["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert pod["terminationGracePeriodSeconds"] >= loaded.settings.drain_timeout_s + UVICORN_MARGIN_S
    (agent,) = pod["containers"]
    agent_env = {e["name"]: e for e in agent["env"]}
    assert agent_env["OPENAI_BASE_URL"]["value"] == f"http://127.0.0.1:{port}/v1"
    assert agent_env["OPENAI_API_KEY"]["valueFrom"] == sidecar["env"][0]["valueFrom"]


def test_the_systemd_unit_checks_the_config_then_serves_and_waits_for_the_drain():
    unit = (DEPLOY / "systemd" / "responses-ws.service").read_text()
    lines = dict(line.split("=", 1) for line in unit.splitlines() if "=" in line and not line.startswith("#"))
    files = {"/etc/responses-ws/shim.toml": ROOT / "examples" / "sidecar.toml"}  # what the unit's comment copies
    loaded = None
    for key in ("ExecStartPre", "ExecStart"):
        program, *argv = shlex.split(lines[key])
        assert Path(program).name == "responses-ws"
        args, loaded = accepted(argv, {"CEREBRAS_API_KEY": "x"}, files)
        assert args.command == ("check-config" if key == "ExecStartPre" else "serve")
    assert loaded is not None
    assert int(lines["TimeoutStopSec"]) >= loaded.settings.drain_timeout_s + UVICORN_MARGIN_S
    assert lines["KillSignal"] == "SIGTERM"


def test_a_command_line_the_cli_refuses_fails_the_check():
    """The check above can fail: a misspelled flag or a bad value is caught."""
    with pytest.raises(SystemExit):
        accepted(["serve", "--prot", "8787"], {}, {})
    with pytest.raises(ConfigError, match="RESPONSES_WS_PORT"):
        accepted(["serve"], {"RESPONSES_WS_PORT": "http"}, {})


def _engine_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0


@pytest.mark.timeout(900)
@pytest.mark.skipif(not _engine_answers(), reason="no container engine answers here (docker info fails)")
def test_the_image_builds_runs_as_non_root_and_answers():
    from support.chat_server import closed_port

    tag = "responses-ws:test"
    subprocess.run(["docker", "build", "-t", tag, str(ROOT)], check=True, timeout=800)
    port = closed_port()
    container = subprocess.run(
        ["docker", "run", "-d", "--rm", "-p", f"127.0.0.1:{port}:8787", "-e", "RESPONSES_WS_API_KEYS=k", tag],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx2.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                    break
            except httpx2.TransportError:
                time.sleep(0.5)
        reply = httpx2.post(
            f"http://127.0.0.1:{port}/v1/responses",
            json={"model": "simulated-1", "input": "hi", "store": False},
            headers={"authorization": "Bearer k"},
        )
        assert reply.status_code == 200 and reply.json()["status"] == "completed"
        user = subprocess.run(["docker", "exec", container, "id", "-u"], capture_output=True, text=True).stdout
        assert user.strip() != "0"
    finally:
        subprocess.run(["docker", "stop", container], capture_output=True)
