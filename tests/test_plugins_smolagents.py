"""plugins.smolagents: a real smolagents `ToolCallingAgent` with a tool, its model calls over one session.

The simulator calls `lookup` from the task's `call lookup {...}` line; the tool's output carries the
next step's line (`call final_answer {...}`), so each task is two model calls, as a real model
would make them: the tool, then `final_answer`. Three tasks on one agent (`reset=False`) are one
conversation of six calls. Over plain HTTP (the shim's `/v1/chat/completions`) the same agent must
give the same answers.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from smolagents import OpenAIServerModel, ToolCallingAgent, tool
from support.agent_tasks import RECORDS, TASKS, answered
from support.wire import API_KEY, MODEL

import ws_transport
from plugins.smolagents import native_tool_steps, session_of, websocket_model
from server_shim import BackgroundServer

pytestmark = pytest.mark.timeout(90)


@tool
def lookup(n: int) -> str:
    """Look up a record by number.

    Args:
        n: the record's number
    """
    answer = f"record {n} is blue"
    return f"{answer}\ncall final_answer {json.dumps({'answer': answer})}"


def run_agent(model: Any) -> list[str]:
    agent = ToolCallingAgent(tools=[lookup], model=model, verbosity_level=0, max_steps=4)
    return [str(agent.run(task, reset=index == 0)) for index, task in enumerate(TASKS)]


@pytest.mark.parametrize("stream", [False, True], ids=["generate", "generate_stream"])
def test_a_tool_calling_agent_chains_every_call_after_the_first(
    server: BackgroundServer, recorder: Any, chain_report: Any, stream: bool
) -> None:
    plain = OpenAIServerModel(model_id=MODEL, api_base=server.base_url, api_key=API_KEY)
    over_http = run_agent(plain)
    recorder.calls.clear()

    model = websocket_model(OpenAIServerModel(model_id=MODEL, api_base=server.base_url, api_key=API_KEY))
    agent = ToolCallingAgent(tools=[lookup], model=model, verbosity_level=0, max_steps=4, stream_outputs=stream)
    outputs = [str(agent.run(task, reset=index == 0)) for index, task in enumerate(TASKS)]
    stats = session_of(model).stats
    model.client.close()

    assert answered(outputs) and outputs == over_http
    assert outputs == [f"record {n} is blue" for n in RECORDS]
    assert (stats.turns, stats.chat_turns, stats.turns_chained, stats.fallbacks) == (6, 6, 5, 0)
    assert stats.chat_fallbacks == {}  # no `stop`: the adapter removed it
    assert [len(call.items) for call in recorder.calls][1:] == [1, 1, 1, 1, 1]  # only the new message each time
    chain_report("smolagents ToolCallingAgent", "smolagents", stats)


def test_without_the_adapter_smolagents_chains_nothing(server: BackgroundServer) -> None:
    """Why the adapter exists: the text replay of tool steps never contains the answer the model gave."""
    from smolagents.models import REMOVE_PARAMETER

    model = OpenAIServerModel(model_id=MODEL, api_base=server.base_url, api_key=API_KEY)
    model.client = ws_transport.wrap(model.client)
    model.kwargs["stop"] = REMOVE_PARAMETER
    assert answered(run_agent(model))
    stats = ws_transport.session_of(model.client).stats
    assert (stats.turns, stats.turns_chained) == (6, 0)


def test_a_step_is_sent_natively_only_when_it_is_one_call_and_its_observation() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": {"n": 3}}}
    replayed = [
        {"role": "user", "content": [{"type": "text", "text": "New task: find 3"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Calling tools:\n" + str([call])}]},
        {"role": "user", "content": [{"type": "text", "text": "Observation:\nrecord 3 is blue"}]},
    ]
    native = native_tool_steps(replayed)
    assert native[0] is replayed[0]
    assert native[1:] == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"n": 3}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "record 3 is blue"},
    ]
    two_calls = [replayed[0], {"role": "assistant", "content": "Calling tools:\n" + str([call, call])}, replayed[2]]
    error = [replayed[0], replayed[1], {"role": "user", "content": "Error:\nno such record"}]
    assert native_tool_steps(two_calls) == two_calls
    assert native_tool_steps(error) == error


def test_only_an_openai_server_model_is_accepted() -> None:
    with pytest.raises(TypeError, match="smolagents OpenAIServerModel"):
        websocket_model(object())


def test_a_stop_other_than_the_tool_calling_pair_reaches_the_server_and_cuts_the_answer(
    server: BackgroundServer,
) -> None:
    """Planning's `<end_plan>`, a CodeAgent's stops: they go (over HTTP, by `wrap()`'s rule) and cut the text."""
    from smolagents.models import ChatMessage

    model = websocket_model(OpenAIServerModel(model_id=MODEL, api_base=server.base_url, api_key=API_KEY))
    said = model.generate([ChatMessage(role="user", content="plan")], stop_sequences=["token"])  # type: ignore[arg-type]
    stats = session_of(model).stats
    model.client.close()
    assert said.content == "simulated reply from the responses-ws simulator "
    assert sum(stats.chat_fallbacks.values()) == 1


def test_a_code_agent_stops_at_the_end_of_its_code_block(make_server: Any, chat_server: Any) -> None:
    """A model that writes past its code block (a made-up observation, more code): the CodeAgent's stop
    sequences end the answer at `</code>`, so only the code it meant to run runs."""
    from smolagents import CodeAgent
    from support.chat_server import text_reply

    shim = make_server(backend=chat_server.base_url)
    chat_server.enqueue(
        text_reply(
            "Thought: look first.\n<code>\nprint('looking')\n</code>\nObservation: red\n<code>\nfinal_answer('red')\n</code>"
        ),
        text_reply("Thought: done.\n<code>\nfinal_answer('blue')\n</code>"),
    )
    model = websocket_model(OpenAIServerModel(model_id="gpt-test", api_base=shim.base_url, api_key=API_KEY))
    agent = CodeAgent(tools=[], model=model, verbosity_level=0, max_steps=3)
    answer = agent.run("What colour is record 3?")
    model.client.close()
    assert answer == "blue"
    assert "</code>" in chat_server.received[0].body["stop"]


def test_a_replayed_call_without_an_id_stays_text() -> None:
    call = {"type": "function", "function": {"name": "lookup", "arguments": {"n": 3}}}
    replayed = [
        {"role": "assistant", "content": "Calling tools:\n" + str([call])},
        {"role": "user", "content": "Observation:\nrecord 3 is blue"},
    ]
    assert native_tool_steps(replayed) == replayed
