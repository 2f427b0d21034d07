"""The simulated backend's documented contract (README): deterministic, paced, tool calls on request."""

from __future__ import annotations

import json
import time

import pytest

from server_shim.backends import SimulatedBackend
from server_shim.backends.base import BackendRequest, Finish, TextDelta, ToolCallDelta, Usage, encode, estimate_tokens
from server_shim.backends.chat_convert import chat_prompt, render_items
from server_shim.backends.simulated import MAX_OUTPUT_TOKENS
from server_shim.history import History
from server_shim.tools import ChatTools

LOOKUP = [{"type": "function", "name": "lookup"}]


def request(
    items, *, tools=None, max_output_tokens=None, previous=(), tool_choice=None, options=None, chat_tools=None
) -> BackendRequest:
    """The Responses items as a turn hands them: `previous` (earlier turns), then `items` (this one)."""
    return BackendRequest(
        chat_tools=chat_tools,
        model="simulated-1",
        history=History().extend(previous).extend(items),
        previous_items=len(previous),
        tools=tools,
        tool_choice=tool_choice,
        max_output_tokens=max_output_tokens,
        options=options or {},
    )


def user(text):
    return {"type": "message", "role": "user", "content": text}


async def collect(backend, req):
    return [delta async for delta in backend.stream(req)]


async def test_it_streams_max_output_tokens_text_tokens_default_16():
    backend = SimulatedBackend()
    default = await collect(backend, request([user("hi")]))
    assert sum(isinstance(d, TextDelta) for d in default) == 16
    five = await collect(backend, request([user("hi")], max_output_tokens=5))
    assert sum(isinstance(d, TextDelta) for d in five) == 5
    assert five[-2:] == [Usage(five[-2].input_tokens, 5, 0), Finish("stop")]


async def test_it_is_deterministic():
    backend = SimulatedBackend()
    req = request([user('call lookup {"n": 1}')], tools=LOOKUP)
    assert await collect(backend, req) == await collect(backend, req)


async def test_a_call_line_naming_a_tool_of_the_request_becomes_that_function_call():
    deltas = await collect(SimulatedBackend(), request([user('please\ncall lookup {"n": 42}')], tools=LOOKUP))
    calls = [d for d in deltas if isinstance(d, ToolCallDelta)]
    assert len(calls) == 2 and calls[0].name == "lookup" and calls[0].call_id.startswith("call_sim_")
    assert json.loads("".join(c.arguments for c in calls)) == {"n": 42}
    assert deltas[-1] == Finish("tool_calls")


async def test_a_call_line_for_an_unknown_tool_or_bad_json_is_just_text():
    backend = SimulatedBackend()
    for text in ('call other {"n": 1}', "call lookup {not json"):
        deltas = await collect(backend, request([user(text)], tools=LOOKUP))
        assert not any(isinstance(d, ToolCallDelta) for d in deltas)
    assert not any(isinstance(d, ToolCallDelta) for d in await collect(backend, request([user("call lookup {}")])))


async def test_after_a_tool_output_the_reply_contains_that_output():
    items = [
        user('call lookup {"n": 1}'),
        {"type": "function_call", "call_id": "call_9", "name": "lookup", "arguments": '{"n": 1}'},
        {"type": "function_call_output", "call_id": "call_9", "output": "record one"},
    ]
    deltas = await collect(SimulatedBackend(), request(items, tools=LOOKUP))
    text = "".join(d.text for d in deltas if isinstance(d, TextDelta))
    assert "record one" in text and "call_9" in text


async def test_the_cached_prefix_is_reported_as_cached_tokens():
    deltas = await collect(SimulatedBackend(), request([user("y" * 400)], previous=[user("x" * 400)]))
    usage = next(d for d in deltas if isinstance(d, Usage))
    assert 0 < usage.cached_tokens < usage.input_tokens
    first = await collect(SimulatedBackend(), request([user("x" * 400)]))
    assert next(d for d in first if isinstance(d, Usage)).cached_tokens == 0


REASONING = {"type": "reasoning", "id": "rs_1", "summary": []}
CALL = {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": "{}"}
OUTPUT = {"type": "function_call_output", "call_id": "c1", "output": "seven"}


@pytest.mark.parametrize(
    ("previous", "items", "previous_items"),
    [
        ([user("x" * 400)], [user("y" * 400)], None),  # a chained turn: the newest batch is the input
        ([user("x" * 400), CALL], [OUTPUT, user("and then?")], None),  # a tool output and steering input
        ([user("x" * 400)], [REASONING], None),  # an input that renders to no message
        ([user("x" * 400), CALL], [user("after a call")], 1),  # the input starts before the newest batch
        ([user("x" * 400)], [user("y" * 40)], 0),  # a tail the turn re-sends whole (truncated)
    ],
)
async def test_cached_tokens_count_the_prompt_before_this_turns_input_as_chat_messages(previous, items, previous_items):
    """What the simulator reports as cached: the rendered prompt less this turn's input rendered on its own,
    whether the input is the newest batch (read from the prompt's newest segment) or not (rendered again)."""
    req = request(items, previous=previous)
    if previous_items is not None:
        req.previous_items = previous_items
    prompt = chat_prompt(req.history)
    new = sum(len(encode(m)) + 1 for m in render_items(req.new_items))
    input_tokens = estimate_tokens(prompt.nbytes)
    cached = estimate_tokens(prompt.nbytes - new) if prompt.nbytes > new else 0
    usage = next(d for d in await collect(SimulatedBackend(), req) if isinstance(d, Usage))
    assert (usage.input_tokens, usage.cached_tokens) == (input_tokens, min(cached, input_tokens))


async def test_time_to_first_token_and_tokens_per_second_are_honoured():
    backend = SimulatedBackend(ttft_s=0.1, tokens_per_s=100)
    start = time.perf_counter()
    await collect(backend, request([user("hi")], max_output_tokens=6))
    assert 0.14 <= time.perf_counter() - start < 0.6  # 0.1 s + 5 intervals of 10 ms


async def test_it_names_itself_a_simulator():
    backend = SimulatedBackend(model="simulated-1")
    assert backend.name == "simulated" and await backend.models() == ["simulated-1"]


PATCH_AND_AGENTS = [
    {"type": "custom", "name": "apply_patch"},
    {
        "type": "namespace",
        "name": "agents",
        "description": "d",
        "tools": [
            {
                "type": "function",
                "name": "spawn",
                "parameters": {
                    "type": "object",
                    "properties": {"task": {"type": "string"}, "n": {"type": "integer", "minimum": 3}},
                    "required": ["task", "n"],
                },
            }
        ],
    },
]


def arguments(deltas):
    return "".join(d.arguments for d in deltas if isinstance(d, ToolCallDelta))


async def test_a_custom_line_calls_the_custom_tool_with_the_rest_of_the_message_as_input():
    text = "apply this\ncustom apply_patch *** Begin Patch\n*** Add File: a.txt\n*** End Patch"
    deltas = await collect(SimulatedBackend(), request([user(text)], tools=PATCH_AND_AGENTS))
    assert deltas[0].name == "apply_patch"
    assert json.loads(arguments(deltas)) == {"input": "*** Begin Patch\n*** Add File: a.txt\n*** End Patch"}


async def test_a_forced_tool_choice_calls_that_tool_with_arguments_valid_for_its_schema():
    forced = {"type": "function", "name": "spawn", "namespace": "agents"}
    deltas = await collect(SimulatedBackend(), request([user("hi")], tools=PATCH_AND_AGENTS, tool_choice=forced))
    assert deltas[0].name == "agents__spawn"
    assert json.loads(arguments(deltas)) == {"task": "simulated", "n": 3}
    required = await collect(SimulatedBackend(), request([user("hi")], tools=PATCH_AND_AGENTS, tool_choice="required"))
    assert required[0].name == "apply_patch"


async def test_a_json_schema_format_yields_an_instance_of_the_schema():
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "minLength": 12},
            "when": {"type": "string", "format": "date"},
            "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}, "minItems": 2},
            "kind": {"anyOf": [{"type": "null"}, {"enum": ["a", "b"]}]},
            "score": {"type": "number", "minimum": 0.5, "maximum": 0.7},
        },
        "required": ["city", "when", "tags", "kind", "score"],
        "additionalProperties": False,
        "$defs": {"tag": {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}},
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "weather", "schema": schema}}
    deltas = await collect(SimulatedBackend(), request([user("hi")], options={"response_format": fmt}))
    answer = json.loads("".join(d.text for d in deltas if isinstance(d, TextDelta)))
    assert answer == {
        "city": "simulatedxxx",
        "when": "2026-01-01",
        "tags": [{"ok": True}, {"ok": True}],
        "kind": None,
        "score": 0.5,
    }
    assert deltas == await collect(SimulatedBackend(), request([user("hi")], options={"response_format": fmt}))


HUGE_STRING = {"type": "string", "minLength": 100_000_000}


async def test_schema_driven_output_is_cut_at_the_token_budget_without_building_what_the_schema_asks():
    fmt = {"type": "json_schema", "json_schema": {"name": "huge", "schema": HUGE_STRING}}
    started = time.perf_counter()
    structured = await collect(SimulatedBackend(), request([user("hi")], options={"response_format": fmt}))
    assert sum(len(d.text) for d in structured if isinstance(d, TextDelta)) == MAX_OUTPUT_TOKENS * 8
    assert structured[-2].output_tokens == MAX_OUTPUT_TOKENS and structured[-1] == Finish("length")
    small = await collect(
        SimulatedBackend(), request([user("hi")], max_output_tokens=4, options={"response_format": fmt})
    )
    assert "".join(d.text for d in small if isinstance(d, TextDelta)) == '"simulated' + "x" * 22
    assert small[-1] == Finish("length")
    tools = [
        {"type": "function", "name": "big", "parameters": {"type": "array", "items": HUGE_STRING, "minItems": 10**9}}
    ]
    called = await collect(SimulatedBackend(), request([user("hi")], tools=tools, tool_choice="required"))
    assert len(arguments(called)) == MAX_OUTPUT_TOKENS * 8 and called[-1] == Finish("length")
    assert time.perf_counter() - started < 5, "nothing past the budget is generated"


async def test_schema_driven_output_within_the_budget_is_whole_and_finishes_normally():
    tools = [{"type": "function", "name": "small", "parameters": {"type": "string", "minLength": 20, "maxLength": 25}}]
    called = await collect(SimulatedBackend(), request([user("hi")], tools=tools, tool_choice="required"))
    assert json.loads(arguments(called)) == "simulated" + "x" * 11 and called[-1] == Finish("tool_calls")


READY_CASES = [
    request([user("hi")]),
    request([user("hi")], max_output_tokens=0),
    request([user("hi")], max_output_tokens=63),
    request([user("y" * 400)], previous=[user("x" * 400)], max_output_tokens=1),
    request([user('please\ncall lookup {"n": 42}')], tools=LOOKUP),
    request([user("hi")], tools=PATCH_AND_AGENTS, tool_choice="required"),
    request([CALL, OUTPUT], previous=[user("x")], max_output_tokens=0),
    request([CALL, OUTPUT], previous=[user("x")], max_output_tokens=5),
    request([user("hi")], options={"response_format": {"type": "json_object"}}),
    request(
        [user("hi")],
        max_output_tokens=4,
        options={"response_format": {"type": "json_schema", "json_schema": {"schema": HUGE_STRING}}},
    ),
]


@pytest.mark.parametrize("req", READY_CASES)
async def test_a_reply_that_never_waits_is_ready_at_once_as_it_streams(req):
    """`ready` (what the router takes instead of `stream` when it has it) is exactly what `stream` yields."""
    backend = SimulatedBackend()
    assert backend.ready(req) == await collect(backend, req)
    guard = SimulatedBackend(guard={"S1": ["attack"]})
    assert guard.ready(req) == await collect(guard, req)


async def test_a_reply_that_would_wait_is_not_ready_at_once():
    """Paced, 64 tokens or more (it gives the loop a turn at the 64th), or a subclass streaming its own way:
    the router streams it."""
    assert SimulatedBackend(ttft_s=0.01).ready(request([user("hi")])) is None
    assert SimulatedBackend(tokens_per_s=1000).ready(request([user("hi")])) is None
    assert SimulatedBackend().ready(request([user("hi")], max_output_tokens=64)) is None
    schema = {"type": "json_schema", "json_schema": {"schema": HUGE_STRING}}
    assert (
        SimulatedBackend().ready(request([user("hi")], max_output_tokens=64, options={"response_format": schema}))
        is None
    )
    assert SimulatedBackend().ready(request([user("hi")], max_output_tokens=63, options={"response_format": schema}))

    class Own(SimulatedBackend):
        async def stream(self, request):
            yield TextDelta("own")

    assert Own().ready(request([user("hi")])) is None


@pytest.mark.parametrize("chat_tools", [None, ChatTools()])
async def test_the_newest_tool_output_is_echoed_whether_or_not_the_request_has_tools(chat_tools):
    """With no tools the newest message is decoded only when it can be a tool's (`last_tool_message`): the
    same reply as when it is always decoded; a user's text that spells a tool role is still the user's."""
    echoed = await collect(SimulatedBackend(), request([CALL, OUTPUT], previous=[user("x")], chat_tools=chat_tools))
    assert echoed[0] == TextDelta("Tool c1 returned: seven\n") and len(echoed) == 16 + 2
    spelled = user('"role":"tool" says the user')
    plain = await collect(SimulatedBackend(), request([spelled], max_output_tokens=2, chat_tools=chat_tools))
    assert plain[:2] == [TextDelta("simulated "), TextDelta("reply ")]
    part = {"type": "input_file", "role": "tool", "file_data": "x"}  # a part's keys pass to the chat message
    multimodal = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"}, part]}
    assert chat_prompt(History().extend([multimodal])).last_tool_message is None
    assert chat_prompt(History().extend([CALL, OUTPUT])).last_tool_message["content"] == "seven"
