"""A connection's derivation from the settings (`turn_settings`), reused while they stay the same, is what a fresh
derivation gives for any change of the settings: value for value, type for type, key order for key order."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai import AsyncOpenAI
from support.wire import API_KEY, LOOKUP_TOOL, MODEL, completed_ok, run_turn

from server_shim.footprint import footprint
from server_shim.requests import CreateRequest, parse_create
from server_shim.turn_settings import (
    MAX_HELD_BYTES,
    MAX_KEY_BYTES,
    UNWALKED_KEY_BYTES,
    Derived,
    SettingsMemo,
    SharedDerivations,
    held_within_bound,
    settings_key,
)

JSON = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.sampled_from([0, 1, -1, 0.0, -0.0, 1.0, 2.5]),
        st.text(max_size=3),
    ),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.sampled_from("abc"), inner, max_size=3)),
    max_leaves=5,
)
"""Values `==` confuses (`0 == 0.0 == -0.0 == False`, `1 == 1.0 == True`), in dicts whose key order may differ."""
SETTINGS = {
    "instructions": st.one_of(st.none(), st.sampled_from(["be brief", "be kind"])),
    "tools": st.one_of(
        st.none(),
        st.lists(
            st.fixed_dictionaries(
                {"type": st.just("function"), "name": st.sampled_from("fg")},
                optional={"strict": st.sampled_from([True, False]), "parameters": JSON.filter(lambda v: v is not None)},
            ),
            max_size=2,
        ),
    ),
    "tool_choice": st.one_of(st.none(), st.just("auto"), st.just({"type": "function", "name": "f"})),
    "parallel_tool_calls": st.one_of(st.none(), st.booleans()),
    "store": st.one_of(st.none(), st.booleans()),
    "max_output_tokens": st.one_of(st.none(), st.integers(1, 3)),
    "temperature": st.one_of(st.none(), st.sampled_from([0.0, 1.0, 0.5])),
    "top_p": st.one_of(st.none(), st.sampled_from([0.0, 1.0])),
    "metadata": st.one_of(st.none(), st.dictionaries(st.sampled_from("xy"), st.sampled_from(["1", "2"]), max_size=2)),
    "text": st.one_of(
        st.none(),
        st.just({"format": {"type": "json_object"}}),
        st.just({"verbosity": "low", "format": {"type": "text"}}),
        st.just({"format": {"type": "text"}, "verbosity": "low"}),
    ),
    "user": st.one_of(st.none(), st.sampled_from(["u", "v"])),
    "reasoning": st.one_of(st.none(), st.just({"effort": "low"}), st.just({"summary": "auto"})),
    "top_logprobs": st.one_of(st.none(), st.integers(0, 2)),
    "include": st.one_of(st.none(), st.just(["message.output_text.logprobs"]), st.just([])),
    "service_tier": st.one_of(st.none(), st.sampled_from(["auto", "default"])),
    "truncation": st.one_of(st.none(), st.sampled_from(["auto", "disabled"])),
    "prompt": st.one_of(st.none(), st.just({"id": "p"}), st.just({"id": "p", "version": "1"})),
    "unknown_field": JSON,
}
PER_TURN = {
    "input": st.sampled_from(["hi", "next", [{"type": "message", "role": "user", "content": "x"}]]),
    "previous_response_id": st.one_of(st.none(), st.sampled_from(["resp_a", "resp_b"])),
    "stream_id": st.one_of(st.none(), st.sampled_from(["a", "b"])),
    "generate": st.one_of(st.none(), st.booleans()),
}
BODIES = st.fixed_dictionaries({"model": st.sampled_from(["m", "n"])}, optional={**SETTINGS, **PER_TURN})


@st.composite
def changed(draw: st.DrawFn, body: dict[str, Any]) -> dict[str, Any]:
    """`body` with its per-turn fields drawn anew, and maybe one setting changed or set again in another order."""
    new = {k: v for k, v in body.items() if k not in PER_TURN}
    new.update(draw(st.fixed_dictionaries({}, optional=PER_TURN)))
    how = draw(st.sampled_from(["same", "one", "reordered"]))
    if how == "one":
        name = draw(st.sampled_from(sorted(SETTINGS)))
        new[name] = draw(SETTINGS[name])
    elif how == "reordered":
        new = dict(reversed(list(new.items())))
    return new


def request(body: dict[str, Any]) -> CreateRequest:
    return parse_create({"type": "response.create", **body}, websocket=True)


def exact(a: Any, b: Any) -> bool:
    """Equal as JSON writes them: the same types, key orders and floats' signs (`==` says 1 == 1.0 == True)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(exact(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(exact(x, y) for x, y in zip(a, b, strict=True))
    return repr(a) == repr(b)


def assert_same(reused: Derived, fresh: Derived, req: CreateRequest) -> None:
    assert exact(reused.echo(req), fresh.echo(req))
    assert exact(reused.options, fresh.options)
    assert exact(reused.fields, fresh.fields)
    assert exact(reused.parts, fresh.parts)
    assert [footprint(part) for part in reused.parts] == [footprint(part) for part in fresh.parts]


@settings(max_examples=400, deadline=None)
@given(BODIES.flatmap(lambda body: st.tuples(st.just(body), changed(body))))
def test_a_reused_derivation_is_a_fresh_one_for_any_change_of_the_settings(bodies):
    first, second = (request(body) for body in bodies)
    memo = SettingsMemo()
    memo.derived(first)
    assert_same(memo.derived(second), Derived(second), second)


@pytest.mark.parametrize("name", sorted(SETTINGS))
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_each_setting_changed_alone_is_derived_again(name, data):
    body = data.draw(BODIES)
    value = data.draw(SETTINGS[name].filter(lambda v: not exact(v, body.get(name))))
    second = request({**body, name: value})
    memo = SettingsMemo()
    memo.derived(request(body))
    assert_same(memo.derived(second), Derived(second), second)


@settings(max_examples=100, deadline=None)
@given(BODIES, st.fixed_dictionaries({}, optional=PER_TURN))
def test_the_derivation_is_reused_while_only_the_per_turn_fields_change(body, per_turn):
    memo = SettingsMemo()
    first = memo.derived(request(body))
    assert memo.derived(request({**body, **per_turn})) is first


def test_settings_equal_by_value_but_not_as_json_are_derived_again():
    memo = SettingsMemo()
    tool = {"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": True}
    first = memo.derived(request({"model": "m", "tools": [tool], "temperature": 1.0}))
    for other in (
        {"tools": [{**tool, "strict": 1}], "temperature": 1.0},
        {"tools": [dict(reversed(list(tool.items())))], "temperature": 1.0},
        {"tools": [tool], "temperature": 1.0, "metadata": {}},
    ):
        again = memo.derived(request({"model": "m", **other}))
        assert again is not first
        first = memo.derived(request({"model": "m", "tools": [tool], "temperature": 1.0}))
    assert memo.derived(request({"model": "m", "tools": [tool], "temperature": 1.0, "input": "x"})) is first


async def test_a_chain_whose_settings_change_echoes_each_turns_own(server):
    """Over one connection (one memo): every Response object echoes its own request's settings and parent."""
    base = {"tools": [LOOKUP_TOOL], "temperature": 1.0, "metadata": {"a": "1", "b": "2"}, "instructions": "be brief"}
    turns = [
        base,
        base,
        {**base, "metadata": {"b": "2", "a": "1"}},
        {**base, "temperature": 0.5},
        {**base, "instructions": None, "text": {"verbosity": "low"}},
        base,
    ]
    async with AsyncOpenAI(base_url=server.base_url, api_key=API_KEY) as sdk, sdk.responses.connect() as conn:
        previous = None
        for fields in turns:
            sent = {k: v for k, v in fields.items() if v is not None}
            turn = await run_turn(conn, input="hi", previous_response_id=previous, **sent)
            completed_ok(turn)
            echoed = turn.response
            assert echoed["previous_response_id"] == previous
            assert list(echoed["metadata"].items()) == list(sent["metadata"].items())
            assert echoed["temperature"] == sent["temperature"]
            assert echoed["instructions"] == sent.get("instructions")
            assert echoed["text"]["verbosity"] == sent.get("text", {}).get("verbosity", "medium")
            assert echoed["tools"][0]["name"] == LOOKUP_TOOL["name"]
            assert echoed["model"] == MODEL
            previous = echoed["id"]


def test_settings_larger_than_the_bound_are_derived_afresh_each_turn():
    memo = SettingsMemo()
    large = {"model": "m", "instructions": "x" * MAX_KEY_BYTES}
    assert memo.derived(request(large)) is not memo.derived(request(large))
    small = {"model": "m", "instructions": "x"}
    assert memo.derived(request(small)) is memo.derived(request(small))


@settings(max_examples=100, deadline=None)
@given(BODIES, st.fixed_dictionaries({}, optional=PER_TURN))
def test_a_connection_takes_the_derivation_another_one_made_of_the_same_settings(body, per_turn):
    shared = SharedDerivations()
    first = SettingsMemo(shared).derived(request(body))
    again = request({**body, **per_turn})
    assert SettingsMemo(shared).derived(again) is first
    assert_same(first, Derived(again), again)


def test_the_shared_derivations_keep_the_most_recently_used_few():
    shared = SharedDerivations(entries=2)
    bodies = [{"model": "m", "instructions": name} for name in ("a", "b", "c")]
    a, b = (SettingsMemo(shared).derived(request(body)) for body in bodies[:2])
    assert SettingsMemo(shared).derived(request(bodies[0])) is a  # a used again: b is now the oldest
    SettingsMemo(shared).derived(request(bodies[2]))
    assert len(shared) == 2
    assert SettingsMemo(shared).derived(request(bodies[0])) is a
    assert SettingsMemo(shared).derived(request(bodies[1])) is not b


def test_settings_larger_than_the_bound_are_not_shared():
    shared = SharedDerivations()
    large = {"model": "m", "instructions": "x" * MAX_KEY_BYTES}
    assert SettingsMemo(shared).derived(request(large)) is not SettingsMemo(shared).derived(request(large))
    assert len(shared) == 0


async def test_connections_with_the_same_settings_share_one_derivation_and_each_echoes_its_own(server):
    """Over three connections of one server: the same settings derived once, other settings apart, and every
    Response object echoes its own request's settings."""
    same = {"tools": [LOOKUP_TOOL], "instructions": "be brief", "metadata": {"a": "1"}}
    other = {**same, "instructions": "be thorough"}
    async with AsyncOpenAI(base_url=server.base_url, api_key=API_KEY) as sdk:
        for fields, derived in ((same, 1), (same, 1), (other, 2)):
            async with sdk.responses.connect() as conn:
                turn = await run_turn(conn, input="hi", **fields)
                completed_ok(turn)
                assert turn.response["instructions"] == fields["instructions"]
                assert turn.response["tools"][0]["name"] == LOOKUP_TOOL["name"]
            assert len(server.shim.derivations) == derived


async def test_http_requests_with_the_same_settings_share_one_derivation_and_each_echoes_its_own(server):
    same = {"tools": [LOOKUP_TOOL], "instructions": "be brief", "metadata": {"a": "1"}}
    other = {**same, "instructions": "be thorough"}
    async with AsyncOpenAI(base_url=server.base_url, api_key=API_KEY) as sdk:
        for fields, derived in ((same, 1), (same, 1), (other, 2), (same, 2)):
            response = await sdk.responses.create(model=MODEL, input="hi", **fields)
            assert response.instructions == fields["instructions"] and response.tools[0].name == LOOKUP_TOOL["name"]
            assert len(server.shim.derivations) == derived


def packed(unit: str, limit: int) -> list[Any]:
    """The most copies of the JSON `unit` a list can hold with its settings' JSON within `limit` bytes."""
    import orjson

    count = (limit - len(settings_key(request({"model": "m", "x": []})) or b"")) // (len(unit) + 1)
    return orjson.loads("[" + ",".join([unit] * count) + "]")


@pytest.mark.parametrize("unit", ["{}", "[]", "0", '""', "[[]]", '{"a":{}}', "[{}]"])
def test_settings_within_the_unwalked_length_hold_less_than_the_bound_whatever_their_shape(unit):
    """`UNWALKED_KEY_BYTES` of JSON is remembered unmeasured: its worst shapes (the most containers per byte) hold
    less than `MAX_HELD_BYTES`, in the request's extra fields as in a declared one."""
    for body in ({"model": "m", "x": packed(unit, UNWALKED_KEY_BYTES)}, {"model": "m", "metadata": {"a": "b"}}):
        req = request(body)
        key = settings_key(req)
        assert key is not None and len(key) <= UNWALKED_KEY_BYTES
        derived = Derived(req)
        held = (req.__dict__, req.__pydantic_extra__, derived.echoed, derived.options, derived.fields)
        assert footprint(held) < MAX_HELD_BYTES


def test_settings_of_many_small_containers_are_neither_remembered_nor_shared():
    """60 KiB of `{}` in an unknown field is under the JSON bound but holds ~1.5 MB of objects, which no cache's
    byte bound counts (extra fields are not echoed): derived afresh each turn, kept by no connection (before, each
    connection kept ~1.5 MB: 200 idle connections took 290 MB more)."""
    shared = SharedDerivations()
    memo = SettingsMemo(shared)
    body = {"model": "m", "x": packed("{}", MAX_KEY_BYTES - 1024)}
    req = request(body)
    assert len(settings_key(req) or b"") <= MAX_KEY_BYTES
    assert not held_within_bound(settings_key(req) or b"", req, Derived(req))
    assert memo.derived(req) is not memo.derived(request(body))
    assert len(shared) == 0
    tools = {"model": "m", "tools": [{**LOOKUP_TOOL, "name": f"tool_{n}"} for n in range(40)]}
    assert len(settings_key(request(tools)) or b"") > UNWALKED_KEY_BYTES  # measured, and an agent's tools fit
    assert memo.derived(request(tools)) is memo.derived(request(tools))
    assert len(shared) == 1


def test_tenants_do_not_share_a_derivation():
    """Two tenants' connections with the same settings derive them apart: a Response object of one never holds
    objects of the other's request."""
    shared = SharedDerivations()

    def body() -> dict[str, Any]:  # each request parsed from its own frame
        return {"model": "m", "instructions": "be brief", "metadata": {"a": "1"}}

    first = SettingsMemo(shared, "tenant-a").derived(request(body()))
    assert SettingsMemo(shared, "tenant-a").derived(request(body())) is first
    other = SettingsMemo(shared, "tenant-b").derived(request(body()))
    assert other is not first and other.echoed["metadata"] is not first.echoed["metadata"]
    assert len(shared) == 2
