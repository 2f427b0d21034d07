"""Extension points as documented: a third-party distribution's backend kind, validator, classifier
and sink, from a config file naming its kind to a served turn; who wins on a duplicate kind; the
factory signature `factory(deployment, **options)`; clear errors for unknown kinds and options."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest
from openai import AsyncOpenAI, OpenAI
from support.chat_server import closed_port
from support.plugin_dist import write_plugin_dist
from support.serve import SCRIPT, ServeProcess, stop_cleanly, wait_healthy
from support.wire import completed_ok, run_turn

from server_shim import BackgroundServer, ShimConfig, TextDelta, create_app, hookimpl
from server_shim.backends.kinds import simulated
from server_shim.deployments import make_backend
from server_shim.extensions import backend_kinds, create_plugin_manager

ECHO_PLUGIN = """
from server_shim import APIError, Finish, TextDelta, Usage, hookimpl

FINISHED = []


class EchoBackend:
    '''Answers `<prefix><backend model>`: shows the factory got its options and the router its model map.'''

    def __init__(self, name, prefix):
        self.name = name
        self.prefix = prefix

    async def stream(self, request):
        yield TextDelta(self.prefix + request.model)
        yield Usage(1, 1)
        yield Finish("stop")

    async def models(self):
        return ["echo-model"]

    async def release(self, connection_id):
        return None

    async def aclose(self):
        return None


def make_echo(deployment, *, prefix="echo: "):
    return EchoBackend(deployment.name, prefix)


@hookimpl
def responses_ws_backend_kinds():
    return {"echo": make_echo}


@hookimpl
def responses_ws_validators(settings):
    def no_secrets(new_items, previous, request):
        if "SECRET" in str(new_items):
            raise APIError(400, "secret_in_input", "The input contains a secret.", "input")

    return [no_secrets]


@hookimpl
def responses_ws_classifiers(settings):
    return [lambda new_items: {"items": str(len(new_items))}]


@hookimpl
def responses_ws_response_finished(response, transport):
    FINISHED.append((response["id"], transport))
"""

CONFIG = """
[[deployments]]
name = "echo-1"
kind = "echo"
models = { "team" = "echo-model" }

[deployments.options]
prefix = "hello from "
"""


@pytest.fixture
def echo_dist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    root = write_plugin_dist(tmp_path / "site", "echo_kind", ECHO_PLUGIN, dist="echo-kind", version="0.3")
    monkeypatch.syspath_prepend(str(root))
    yield root
    sys.modules.pop("echo_kind", None)


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "sidecar.toml"
    path.write_text(CONFIG)
    return path


def test_an_installed_plugins_kind_serves_turns_from_a_config_file(echo_dist: Path, config_file: Path) -> None:
    import echo_kind

    config = ShimConfig.load(config_file)
    app = create_app(config=config, plugin_manager=create_plugin_manager())
    with (
        BackgroundServer(app, config.settings(drain_timeout_s=1.0)) as server,
        OpenAI(base_url=server.base_url, api_key="x", max_retries=0) as client,
    ):
        response = client.responses.create(model="team", input="hi", store=False)
        assert response.output_text == "hello from echo-model"
        assert response.metadata == {"classifier.items": "1"}
        with pytest.raises(openai.BadRequestError) as refused:
            client.responses.create(model="team", input="a SECRET", store=False)
        assert refused.value.code == "secret_in_input"
        assert [m.id for m in client.models.list()] == ["team"]
    assert (response.id, "http") in echo_kind.FINISHED


async def test_the_plugins_kind_serves_over_websocket_and_chains(echo_dist: Path, config_file: Path) -> None:
    config = ShimConfig.load(config_file)
    app = create_app(config=config, plugin_manager=create_plugin_manager())
    with BackgroundServer(app, config.settings(drain_timeout_s=1.0)) as server:
        async with (
            AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0) as sdk,
            sdk.responses.connect() as conn,
        ):
            first = await run_turn(conn, model="team", input="one", store=False)
            completed_ok(first)
            refused = await run_turn(conn, model="team", input="SECRET", previous_response_id=first.id, store=False)
            assert refused.error is not None and refused.error["error"]["code"] == "secret_in_input"
            second = await run_turn(conn, model="team", input="two", previous_response_id=first.id, store=False)
            completed_ok(second)
    assert second.text == "hello from echo-model"
    assert second.response["metadata"] == {"classifier.items": "1"}, "the classifier saw only the new item"


def test_responses_ws_serve_loads_the_kind_from_the_installed_plugin(
    echo_dist: Path, config_file: Path, serve_process: ServeProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(echo_dist))
    port = closed_port()
    process = serve_process("--config", str(config_file), "--port", str(port))
    wait_healthy(port, process)
    reply = httpx2.post(f"http://127.0.0.1:{port}/v1/responses", json={"model": "team", "input": "hi"}, timeout=5)
    assert reply.status_code == 200
    assert reply.json()["output"][0]["content"][0]["text"] == "hello from echo-model"
    stop_cleanly(process)


def check_config(config: Path, pythonpath: Path | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESPONSES_WS_")}
    env["PYTHONPATH"] = str(pythonpath or "")
    return subprocess.run([str(SCRIPT), "check-config", str(config)], capture_output=True, text=True, env=env)


def test_check_config_knows_the_installed_kinds(echo_dist: Path, config_file: Path, tmp_path: Path) -> None:
    assert check_config(config_file, echo_dist).returncode == 0
    missing = check_config(config_file, tmp_path / "empty")
    assert missing.returncode == 2
    assert "deployment 'echo-1': no plugin provides backend kind 'echo'" in missing.stderr
    assert "known: cerebras, openai_compatible, responses, simulated" in missing.stderr
    typo = tmp_path / "typo.toml"
    typo.write_text(CONFIG.replace("prefix =", "prefx ="))
    wrong = check_config(typo, echo_dist)
    assert wrong.returncode == 2
    assert "deployment 'echo-1': kind 'echo' does not take these options" in wrong.stderr and "prefx" in wrong.stderr


def test_a_builtin_kind_refuses_options_naming_the_deployment() -> None:
    config = ShimConfig.model_validate(
        {"deployments": [{"name": "sim", "kind": "simulated", "models": {"m": "m"}, "options": {"speed": 2}}]}
    )
    with pytest.raises(ValueError, match="deployment 'sim': kind 'simulated' does not take these options"):
        make_backend(config.deployments[0], {"simulated": simulated})


class Replacement:
    """A plugin that provides a kind the built-ins already provide."""

    def __init__(self, text: str) -> None:
        self.text = text

    @hookimpl
    def responses_ws_backend_kinds(self) -> dict[str, Any]:
        return {"simulated": lambda deployment: Fixed(self.text)}


class Fixed:
    name = "fixed"

    def __init__(self, text: str) -> None:
        self.text = text

    async def stream(self, request: Any) -> Any:
        from server_shim import Finish, Usage

        yield TextDelta(self.text)
        yield Usage(1, 1)
        yield Finish("stop")

    async def models(self) -> list[str]:
        return ["simulated-1"]

    async def release(self, connection_id: str) -> None:
        return None

    async def aclose(self) -> None:
        return None


def test_the_later_registered_plugin_wins_on_a_duplicate_kind() -> None:
    manager = create_plugin_manager(load_entry_points=False)
    assert backend_kinds(manager)["simulated"] is simulated
    first, second = Replacement("first"), Replacement("second")
    manager.register(first)
    manager.register(second)
    assert backend_kinds(manager)["simulated"](None).text == "second"
    manager.unregister(second)
    assert backend_kinds(manager)["simulated"](None).text == "first"


def test_tryfirst_outranks_registration_order() -> None:
    class Eager(Replacement):
        @hookimpl(tryfirst=True)
        def responses_ws_backend_kinds(self) -> dict[str, Any]:
            return {"simulated": lambda deployment: Fixed(self.text)}

    manager = create_plugin_manager(load_entry_points=False)
    manager.register(Eager("eager"))
    manager.register(Replacement("late"))
    assert backend_kinds(manager)["simulated"](None).text == "eager"


def test_a_replaced_builtin_kind_is_what_the_server_serves() -> None:
    manager = create_plugin_manager(load_entry_points=False)
    manager.register(Replacement("from the replacement"))
    with (
        BackgroundServer(create_app(plugin_manager=manager)) as server,
        OpenAI(base_url=server.base_url, api_key="x", max_retries=0) as client,
    ):
        assert client.responses.create(model="simulated-1", input="hi").output_text == "from the replacement"


def test_an_unknown_kind_fails_start_up_not_the_first_turn() -> None:
    config = ShimConfig.model_validate({"deployments": [{"name": "x", "kind": "nope", "models": {"m": "m"}}]})
    with pytest.raises(ValueError, match="deployment 'x': no plugin provides backend kind 'nope'"):
        create_app(config=config, plugin_manager=create_plugin_manager(load_entry_points=False))
