"""Built-in checks from a config file, on a real shim through the real SDK: content policy, secrets
(flag and redact), and a model-backed guard served by a simulated deployment in guard mode.
Chained WebSocket turns and stateless HTTP turns with the whole history give the same labels."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI

from server_shim import BackgroundServer, Settings, ShimConfig, create_app, hookimpl
from server_shim.extensions import create_plugin_manager
from server_shim.policies import ContentPolicy, Secrets, luhn_ok, parse_guard_reply

MODEL = "simulated-1"
CONFIG = """
[server]
drain_timeout_s = 2
usage_ledger = "off"

[[deployments]]
name = "main"
kind = "simulated"
models = { "simulated-1" = "simulated-1" }

[[deployments.checks]]
kind = "guard"
model = "guard"

[[deployments]]
name = "guard"
kind = "simulated"
models = { "guard" = "guard" }
simulated_guard = { S1 = ["attack"], S7 = ["password"] }

[[checks]]
kind = "content_policy"
action = "block"
words_file = "{words}"
patterns = ["how to make \\\\w+ explosives?"]

[[checks]]
kind = "secrets"
action = "redact"
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundServer]:
    folder = tmp_path_factory.mktemp("checks")
    words = folder / "words.txt"
    words.write_text("# banned words\nforbidden\nverboten\n")
    path = folder / "sidecar.toml"
    path.write_text(CONFIG.replace("{words}", str(words)))
    config = ShimConfig.load(Path(path))
    with BackgroundServer(create_app(config=config), config.settings()) as running:
        yield running


async def turn(conn: Any, text: str, previous: str | None) -> Any:
    await conn.response.create(model=MODEL, input=text, previous_response_id=previous, store=True)
    async for event in conn:
        if event.type in ("response.completed", "error"):
            return event
    raise AssertionError("no terminal event")


CLEAN = {"check.content_policy": "clean", "check.content_policy.flagged": "0", "check.guard.categories": ""}


async def test_labels_redaction_and_blocks_over_a_chain_and_over_full_history(server):
    async with AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0) as client:
        async with client.responses.connect() as conn:
            first = await turn(conn, "hello", None)
            assert first.response.metadata == {**CLEAN, "check.guard": "safe", "check.secrets": "none"}
            second = await turn(conn, "write to bob@example.com with sk-ABCDEFGHIJKLMNOPQRSTUVWXYZ", first.response.id)
            assert second.response.metadata["check.secrets"] == "api_key,email"
            for text, why in [
                ("a forbidden word", "word list"),
                ("Verboten!", "any case"),
                ("how to make homemade explosives", "pattern"),
                ("plan the attack", "guard"),
            ]:
                refused = await turn(conn, text, second.response.id)
                assert refused.type == "error" and refused.error.code == "content_policy_violation", why
            third = await turn(conn, "my password is hunter2", second.response.id)
            assert third.type == "error" and "S7" in third.error.message
            fourth = await turn(conn, "thanks", second.response.id)
            assert fourth.type == "response.completed", "blocks left the chain as it was"
        listed = await client.responses.input_items.list(second.response.id)
        stored = listed.data[0].content[0].text
        assert stored == "write to [REDACTED:email] with [REDACTED:api_key]", "only the redacted text is kept"

        history: list[Any] = [
            {"role": "user", "content": "hello"},
            *[item.model_dump(exclude_none=True) for item in first.response.output],
            {"role": "user", "content": "write to bob@example.com with sk-ABCDEFGHIJKLMNOPQRSTUVWXYZ"},
            *[item.model_dump(exclude_none=True) for item in second.response.output],
            {"role": "user", "content": "thanks"},
        ]
        full = await client.responses.create(model=MODEL, input=history, store=False)
        assert full.metadata == fourth.response.metadata


def test_secrets_find_each_kind_and_only_luhn_valid_cards():
    secrets = Secrets(action="flag")
    item = {"type": "message", "role": "user", "content": "AKIAABCDEFGHIJKLMNOP 4111-1111-1111-1111 4111111111111112"}
    state, finding = secrets.inspect(secrets.initial(), [item])
    assert finding.labels == {"secrets": "api_key,card_number"} and state["card_number"] == 1
    assert luhn_ok("4111111111111111") and not luhn_ok("4111111111111112")


def test_state_is_never_changed_in_place():
    policy = ContentPolicy(words=["bad"], action="flag")
    start = policy.initial()
    after, finding = policy.inspect(start, [{"type": "message", "role": "user", "content": "bad bad"}])
    assert start == {"hits": 0, "flagged": 0} and after == {"hits": 2, "flagged": 1}
    assert finding.labels == {"content_policy": "flagged", "content_policy.flagged": "1"}


def test_guard_replies_parse_as_llama_guard_writes_them():
    assert parse_guard_reply("safe") == (False, [])
    assert parse_guard_reply("\n\nunsafe\nS1,S10") == (True, ["S1", "S10"])
    assert parse_guard_reply("unsafe") == (True, [])


def test_config_refuses_a_redacting_policy_and_a_guard_without_model():
    with pytest.raises(ValueError, match="only a 'secrets' check can redact"):
        ShimConfig.model_validate({"checks": [{"kind": "content_policy", "words": ["x"], "action": "redact"}]})
    with pytest.raises(ValueError, match="guard needs the model alias"):
        ShimConfig.model_validate({"checks": [{"kind": "guard"}]})


async def test_check_state_travels_with_responses_stored_in_redis(make_server, redis_server):
    """A conversation flagged on replica A continues on replica B with the count A kept."""
    config = ShimConfig.model_validate(
        {
            "deployments": [{"name": "sim", "kind": "simulated", "models": {MODEL: MODEL}}],
            "checks": [{"kind": "content_policy", "words": ["banana"], "action": "flag"}],
        }
    )
    a, b = (make_server(store=redis_server.url, config=config) for _ in range(2))
    async with (
        AsyncOpenAI(base_url=a.base_url, api_key="x") as on_a,
        AsyncOpenAI(base_url=b.base_url, api_key="x") as on_b,
    ):
        async with on_a.responses.connect() as conn:
            first = await turn(conn, "a banana", None)
        assert first.response.metadata["check.content_policy.flagged"] == "1"
        async with on_b.responses.connect() as conn:
            second = await turn(conn, "another banana", first.response.id)
        assert second.response.metadata["check.content_policy.flagged"] == "2", "B continued A's state from Redis"
        assert b.shim.stats.input_items_received == 1
        third = await on_a.responses.create(model=MODEL, input="no fruit", previous_response_id=second.response.id)
        assert third.metadata == {"check.content_policy": "clean", "check.content_policy.flagged": "2"}


class CheckPlugin:
    @hookimpl
    def responses_ws_checks(self, settings: Any) -> list[Any]:
        return [ContentPolicy("plugged", words=["plum"], action="flag")]


async def test_a_plugin_provides_checks_through_its_hook():
    manager = create_plugin_manager(load_entry_points=False)
    manager.register(CheckPlugin())
    settings = Settings(usage_ledger="off")
    with BackgroundServer(create_app(settings, plugin_manager=manager), settings) as running:
        async with AsyncOpenAI(base_url=running.base_url, api_key="x") as client:
            response = await client.responses.create(model=MODEL, input="a plum", store=False)
    assert response.metadata == {"check.plugged": "flagged", "check.plugged.flagged": "1"}


@pytest.mark.parametrize(
    ("check", "message"),
    [
        ({"kind": "guard", "model": "nowhere"}, "no deployment serves its guard model 'nowhere'"),
        ({"kind": "content_policy", "patterns": ["(unclosed"]}, "is not a regular expression"),
        ({"kind": "content_policy", "words_file": "/nonexistent/words.txt"}, "is not a readable file"),
    ],
)
def test_config_refuses_checks_that_cannot_work(check, message):
    deployment = {"name": "sim", "kind": "simulated", "models": {MODEL: MODEL}}
    with pytest.raises(ValueError, match=message):
        ShimConfig.model_validate({"deployments": [deployment], "checks": [check]})


def test_check_config_lists_the_checks_of_each_model(tmp_path, capsys):
    from server_shim.cli import main

    words = tmp_path / "words.txt"
    words.write_text("forbidden\n")
    path = tmp_path / "sidecar.toml"
    path.write_text(CONFIG.replace("{words}", str(words)))
    assert main(["check-config", str(path)]) == 0
    out = capsys.readouterr().out
    assert (
        "simulated-1 via main: content_policy (content_policy, block), secrets (secrets, redact), guard (guard, block)"
        in out
    )
