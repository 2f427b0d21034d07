"""Tenant isolation: a response belongs to the key's tenant; to any other tenant it does not exist."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys

import httpx2
import openai
import pytest
from openai import AsyncOpenAI
from support.chat_server import closed_port
from support.serve import SCRIPT, wait_healthy
from support.wire import MODEL, TurnEvents, completed_ok, run_turn, user

from server_shim import Settings
from server_shim.tenants import anonymous_tenant_id, load_keys, parse_key_entry, parse_key_lines

ALICE_KEY = "sk-alice-0123"
BOB_KEY = "sk-bob-4567"
UNNAMED_KEY = "sk-nobody-89"


def test_a_key_entry_is_a_key_or_a_tenant_name_and_a_key():
    assert parse_key_entry("sk-1").tenant == anonymous_tenant_id("sk-1")
    named = parse_key_entry("  alice   sk-1 ")
    assert (named.tenant, named.key) == ("alice", "sk-1")
    assert "sk-1" not in repr(named)
    for bad in ("a b c", "bad/name sk-1", ""):
        with pytest.raises(ValueError):
            parse_key_entry(bad)


def test_an_unnamed_tenant_id_is_stable_and_never_contains_the_key():
    assert anonymous_tenant_id("sk-1") == anonymous_tenant_id("sk-1") != anonymous_tenant_id("sk-2")
    assert "sk-1" not in anonymous_tenant_id("sk-1")


def test_a_keys_file_skips_whole_line_comments_and_blank_lines(tmp_path):
    path = tmp_path / "keys"
    path.write_text(f"\ufeff# team keys\nalice {ALICE_KEY}\r\n\n   # ci below\n{UNNAMED_KEY}\n")
    keys = load_keys(["bob " + BOB_KEY], path)
    assert [k.tenant for k in keys] == ["bob", "alice", anonymous_tenant_id(UNNAMED_KEY)]
    assert [k.key for k in keys] == [BOB_KEY, ALICE_KEY, UNNAMED_KEY]
    assert parse_key_lines("a sk-000-base64+/==")[0].key == "sk-000-base64+/=="


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("alice sk-A#secretpart", "holds '#'"),  # was taken as the key 'sk-A'
        ("bob sk-B,xsecret", "holds ','"),  # was two keys, 'sk-B' and 'xsecret'
        ("sk-abcdefgh # ci", "'#' starts a comment only at the beginning of a line"),
        ("alice", "fewer than 8"),  # a tenant name without its key
        ("alice sk-A=secretpart", "holds '='"),
        ("alice sk-alice-0123 bob sk-bob-4567", "got 4 field(s)"),
    ],
)
def test_a_keys_file_line_that_is_not_exactly_one_entry_is_refused_naming_the_line_never_the_key(tmp_path, line, why):
    path = tmp_path / "keys"
    path.write_text(f"# keys\n{line}\n")
    with pytest.raises(ValueError) as refused:
        load_keys([], path)
    message = str(refused.value)
    assert message.startswith(f"{path}, line 2: ") and why in message
    assert "secret" not in message


def test_keys_from_the_command_line_or_environment_must_be_sendable_as_bearer_tokens():
    with pytest.raises(ValueError, match="holds ','"):
        load_keys(["alice sk-a,b"], None)
    assert [k.key for k in load_keys(["k1", "alice sk-a"], None)] == ["k1", "sk-a"], "short keys: as given"


@pytest.mark.parametrize("command", ["serve", "check-config"])
def test_a_bad_keys_file_stops_serve_and_check_config_with_one_clear_line(tmp_path, command):
    keys = tmp_path / "keys"
    keys.write_text(f"alice {ALICE_KEY}\nbob sk-B,xsecret\n")
    config = tmp_path / "shim.toml"
    config.write_text(f"[server]\nport = 9\napi_keys_file = {json.dumps(str(keys))}\n")
    args = ["serve", "--config", str(config)] if command == "serve" else ["check-config", str(config)]
    result = subprocess.run(
        [sys.executable, "-m", "server_shim.cli", *args], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode != 0
    assert f"{keys}, line 2: an API key holds ','" in result.stderr + result.stdout
    assert "xsecret" not in result.stderr + result.stdout


def test_a_keys_file_that_holds_no_key_is_an_error_not_auth_off(tmp_path):
    path = tmp_path / "keys"
    path.write_text("# every key was removed\n\n")
    with pytest.raises(ValueError, match="holds no key"):
        load_keys([BOB_KEY], path)


async def test_a_keys_file_that_reads_only_once_still_guards_the_server():
    """A pipe (`--api-keys-file <(vault read ...)`) reads empty the second time: serve checks and serves the
    keys it read once, so a request without a key is refused (it was answered: the app read the pipe again)."""
    port = closed_port()
    read_end, write_end = os.pipe()
    os.write(write_end, f"alice {ALICE_KEY}\n".encode())
    os.close(write_end)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESPONSES_WS_")}
    process = subprocess.Popen(
        [str(SCRIPT), "serve", "--port", str(port), "--api-keys-file", f"/dev/fd/{read_end}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**env, "PYTHONMALLOC": "pymalloc"},
        pass_fds=(read_end,),
    )
    os.close(read_end)
    try:
        await asyncio.to_thread(wait_healthy, port, process)
        base_url = f"http://127.0.0.1:{port}/v1"
        async with httpx2.AsyncClient() as http:
            assert (await http.get(f"{base_url}/models")).status_code == 401
            refused = await http.post(f"{base_url}/responses", json={"model": MODEL, "input": "hi"})
            assert refused.status_code == 401
        sdk = AsyncOpenAI(base_url=base_url, api_key=ALICE_KEY, max_retries=0)
        async with sdk, sdk.responses.connect() as conn:
            completed_ok(await run_turn(conn, input="hi", store=False))
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(15)
    assert "auth on: 1 api key(s), 1 tenant(s)" in process.stdout.read()


def test_one_key_for_two_tenants_is_refused(tmp_path):
    with pytest.raises(ValueError, match="two tenants"):
        load_keys([f"alice {ALICE_KEY}", f"bob {ALICE_KEY}"], None)


def test_keys_come_from_the_environment_as_plain_entries_or_json(monkeypatch):
    monkeypatch.setenv("RESPONSES_WS_API_KEYS", f"alice {ALICE_KEY},{BOB_KEY}")
    assert Settings().api_keys == [f"alice {ALICE_KEY}", BOB_KEY]
    monkeypatch.setenv("RESPONSES_WS_API_KEYS", f'["{BOB_KEY}"]')
    assert Settings().api_keys == [BOB_KEY]


@pytest.fixture
def shared(make_server, tmp_path):
    """One server, two named tenants from a keys file and one unnamed key on the command line."""
    keys = tmp_path / "keys"
    keys.write_text(f"alice {ALICE_KEY}\nbob {BOB_KEY}\n")
    return make_server(api_keys=[UNNAMED_KEY], api_keys_file=str(keys))


def ok(turn: TurnEvents) -> TurnEvents:
    completed_ok(turn)
    return turn


def sdk(server, key: str) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=server.base_url, api_key=key, max_retries=0)


async def _not_found_body(client: AsyncOpenAI, call) -> dict:
    with pytest.raises(openai.NotFoundError) as missing:
        await call(client)
    return missing.value.body


async def test_another_tenants_response_answers_as_an_unknown_id_over_http(shared):
    async with sdk(shared, ALICE_KEY) as alice, sdk(shared, BOB_KEY) as bob:
        stored = await alice.responses.create(model=MODEL, input="alice's secret")
        unknown = "resp_" + "0" * 32
        for call in (
            lambda c, i: c.responses.retrieve(i),
            lambda c, i: c.responses.delete(i),
            lambda c, i: c.responses.input_items.list(i),
        ):
            theirs = await _not_found_body(bob, lambda c, call=call: call(c, stored.id))
            nobody = await _not_found_body(bob, lambda c, call=call: call(c, unknown))
            assert theirs == {**nobody, "message": nobody["message"].replace(unknown, stored.id)}
        with pytest.raises(openai.BadRequestError) as chained:
            await bob.responses.create(model=MODEL, input="continue", previous_response_id=stored.id)
        assert chained.value.code == "previous_response_not_found"
        # the owner still has it, untouched by bob's delete
        assert (await alice.responses.retrieve(stored.id)).id == stored.id
        items = await alice.responses.input_items.list(stored.id)
        assert [item.content[0].text for item in items.data] == ["alice's secret"]
        follow = await alice.responses.create(model=MODEL, input="go on", previous_response_id=stored.id)
        assert follow.status == "completed"


async def test_another_tenant_cannot_chain_over_websocket_and_its_connection_stays_sound(shared):
    async with sdk(shared, ALICE_KEY) as alice, sdk(shared, BOB_KEY) as bob:
        async with alice.responses.connect() as conn:
            first = ok(await run_turn(conn, input=[user("alice's plan")]))
        async with bob.responses.connect() as conn:
            refused = await run_turn(conn, input=[user("tell me")], previous_response_id=first.id)
            assert refused.error is not None
            assert refused.error["error"]["code"] == "previous_response_not_found"
            own = ok(await run_turn(conn, input=[user("my own")]))
            ok(await run_turn(conn, input=[user("and on")], previous_response_id=own.id))
        async with alice.responses.connect() as conn:
            completed_ok(await run_turn(conn, input=[user("next")], previous_response_id=first.id))


async def test_a_stored_response_records_its_tenant_id_never_the_key(shared):
    async with sdk(shared, ALICE_KEY) as alice, sdk(shared, UNNAMED_KEY) as unnamed:
        by_alice = await alice.responses.create(model=MODEL, input="hi")
        by_unnamed = await unnamed.responses.create(model=MODEL, input="hi")
    store = shared.shim.env.store
    assert (await store.load(by_alice.id, "alice")).tenant == "alice"
    assert await store.load(by_alice.id, None) is None
    state = await store.load(by_unnamed.id, anonymous_tenant_id(UNNAMED_KEY))
    assert state is not None and UNNAMED_KEY not in repr(state)


async def test_without_keys_everyone_is_the_same_tenant(make_server):
    server = make_server()
    async with sdk(server, "any") as one, sdk(server, "other") as two:
        stored = await one.responses.create(model=MODEL, input="shared")
        assert (await two.responses.retrieve(stored.id)).id == stored.id


async def test_input_items_pages_newest_first_by_default(shared):
    async with sdk(shared, ALICE_KEY) as alice:
        stored = await alice.responses.create(model=MODEL, input=[user("one"), user("two"), user("three")])
        newest = await alice.responses.input_items.list(stored.id, limit=2)
        assert [i.content[0].text for i in newest.data] == ["three", "two"] and newest.has_more
        rest = await alice.responses.input_items.list(stored.id, limit=2, after=newest.last_id)
        assert [i.content[0].text for i in rest.data] == ["one"] and not rest.has_more
        ascending = await alice.responses.input_items.list(stored.id, order="asc")
        assert [i.content[0].text for i in ascending.data] == ["one", "two", "three"]
        with pytest.raises(openai.BadRequestError) as bad:
            await alice.responses.input_items.list(stored.id, limit=0)
        assert bad.value.code == "invalid_value"


async def test_another_tenants_response_still_streaming_answers_as_an_unknown_id(make_server, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text(f"alice {ALICE_KEY}\nbob {BOB_KEY}\n")
    server = make_server(api_keys_file=str(keys), simulated_tokens_per_s=16.0)
    async with sdk(server, ALICE_KEY) as alice, sdk(server, BOB_KEY) as bob:
        stream = await alice.responses.create(model=MODEL, input="alice's secret", stream=True)
        parent = (await anext(stream)).response.id
        with pytest.raises(openai.BadRequestError) as theirs:
            await bob.responses.create(model=MODEL, input="continue", previous_response_id=parent)
        assert theirs.value.code == "previous_response_not_found"
        with pytest.raises(openai.ConflictError):
            await alice.responses.create(model=MODEL, input="continue", previous_response_id=parent)
        await stream.close()
