"""plugins.langchain: real LangChain agents and graphs through the real shim on loopback, both transports.

What crossed the wire is read on the server: `server.shim.stats` counts WebSocket connections and
bytes, and the recording validator sees exactly the new items of each turn and the
`previous_response_id` it continued.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import TYPE_CHECKING, Any

import langchain_openai
import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import before_model
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage, RemoveMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.message import REMOVE_ALL_MESSAGES
from langgraph.prebuilt import ToolNode, tools_condition
from support.wire import API_KEY, MODEL

import ws_transport
from plugins import langchain as lc
from server_shim import BackgroundServer

if TYPE_CHECKING:
    from conftest import RecordingValidator, ServerFactory

pytestmark = pytest.mark.timeout(60)


@tool
def lookup(n: int) -> str:
    """Look up a record by number."""
    return f"record {n}: " + "x" * 200


@tool
def double(x: int) -> str:
    """Double a number."""
    return str(2 * x)


TOOLS = [lookup, double]
STEPS = [
    'Find record 3.\ncall lookup {"n": 3}',
    'Now double 21.\ncall double {"x": 21}',
]
"""A two-step task; on the simulated backend each step is a tool call, then a text answer (4 model turns)."""


def make_model(server: BackgroundServer, transport: str, **fields: Any) -> lc.ChatOpenAI:
    return lc.ChatOpenAI(model=MODEL, base_url=server.base_url, api_key=API_KEY, transport=transport, **fields)


def thread(name: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": name}}


def summary(messages: list[BaseMessage]) -> list[tuple[str, str]]:
    """What an answer is, independent of ids: each message's kind, text and tool calls."""
    rows = []
    for message in messages:
        calls = [(c["name"], c["args"]) for c in getattr(message, "tool_calls", [])]
        rows.append((type(message).__name__.removesuffix("Chunk"), f"{message.text}|{calls}"))
    return rows


def response_ids(messages: list[BaseMessage]) -> list[str]:
    return [m.response_metadata["id"] for m in messages if isinstance(m, AIMessage)]


def run_task(agent: Any, name: str) -> list[BaseMessage]:
    for step in STEPS:
        agent.invoke({"messages": [HumanMessage(step)]}, thread(name))
    return agent.get_state(thread(name)).values["messages"]


def assert_only_new_items_after_first_turn(calls: list[Any], ids: list[str]) -> None:
    """Turn 1 carries the first message; every later turn names the turn before it and carries only what is new."""
    assert len(calls) == len(ids) == 2 * len(STEPS)
    assert calls[0].previous_id is None
    assert [c["type"] for c in calls[0].items] == ["message"]
    for turn in range(1, len(calls)):
        assert calls[turn].previous_id == ids[turn - 1]
        expected = "function_call_output" if turn % 2 else "message"
        assert [item["type"] for item in calls[turn].items] == [expected]


def assert_full_history_every_turn(calls: list[Any]) -> None:
    assert all(call.previous_id is None for call in calls)
    assert [len(call.items) for call in calls] == [1, 3, 5, 7]


@pytest.fixture
def http_answer(make_server: ServerFactory) -> list[tuple[str, str]]:
    """The reference: the task over plain HTTP with the full history each turn."""
    server = make_server()
    agent = create_agent(make_model(server, "http"), TOOLS, checkpointer=InMemorySaver())
    return summary(run_task(agent, "reference"))


# create_agent, both transports ------------------------------------------------------------


def test_websocket_agent_matches_http_over_one_socket_sending_only_new_items(
    server: BackgroundServer, recorder: RecordingValidator, http_answer: list[tuple[str, str]]
) -> None:
    model = make_model(server, "websocket")
    agent = create_agent(model, TOOLS, checkpointer=InMemorySaver())

    messages = run_task(agent, "t1")

    assert summary(messages) == http_answer
    assert server.shim.stats.websocket_connections == 1
    assert_only_new_items_after_first_turn(recorder.calls, response_ids(messages))
    stats = model.ws_session("t1").stats
    assert (stats.turns, stats.fallbacks, stats.resends) == (4, 0, 0)


def test_http_transport_is_the_control(server: BackgroundServer, recorder: RecordingValidator) -> None:
    model = make_model(server, "http")
    agent = create_agent(model, TOOLS, checkpointer=InMemorySaver())

    messages = run_task(agent, "t1")

    assert server.shim.stats.websocket_connections == 0
    assert_full_history_every_turn(recorder.calls)
    assert model.ws_session() is None
    assert summary(messages)[-1][1].startswith("Tool call_sim_")


def test_websocket_sends_fewer_bytes_than_http(make_server: ServerFactory) -> None:
    sent = {}
    for transport in ("http", "websocket"):
        server = make_server()
        run_task(create_agent(make_model(server, transport), TOOLS, checkpointer=InMemorySaver()), "t")
        sent[transport] = server.shim.stats.bytes_received
    assert sent["websocket"] < sent["http"]


# sync and async, invoke and streaming -----------------------------------------------------


async def run_async(agent: Any, name: str, mode: str) -> tuple[list[BaseMessage], int]:
    """Run the task with `ainvoke` or `astream_events`; returns the messages and the streamed chunk count."""
    chunks = 0
    for step in STEPS:
        payload = {"messages": [HumanMessage(step)]}
        if mode == "ainvoke":
            await agent.ainvoke(payload, thread(name))
        else:
            async for event in agent.astream_events(payload, thread(name), version="v2"):
                chunks += event["event"] == "on_chat_model_stream"
    return (await agent.aget_state(thread(name))).values["messages"], chunks


def run_sync(agent: Any, name: str, mode: str) -> tuple[list[BaseMessage], int]:
    """Run the task with `invoke` or `stream(stream_mode="messages")`."""
    chunks = 0
    for step in STEPS:
        payload = {"messages": [HumanMessage(step)]}
        if mode == "invoke":
            agent.invoke(payload, thread(name))
        else:
            for message, _meta in agent.stream(payload, thread(name), stream_mode="messages"):
                chunks += isinstance(message, AIMessageChunk)
    return agent.get_state(thread(name)).values["messages"], chunks


@pytest.mark.parametrize("transport", ["websocket", "http"])
@pytest.mark.parametrize("mode", ["invoke", "stream", "ainvoke", "astream_events"])
async def test_every_calling_style_gives_the_http_answer(
    make_server: ServerFactory,
    recorder: RecordingValidator,
    http_answer: list[tuple[str, str]],
    transport: str,
    mode: str,
) -> None:
    server = make_server(validators=[recorder])
    model = make_model(server, transport)
    agent = create_agent(model, TOOLS, checkpointer=InMemorySaver())

    if mode in ("ainvoke", "astream_events"):
        messages, chunks = await run_async(agent, "t", mode)
    else:
        messages, chunks = await asyncio.to_thread(run_sync, agent, "t", mode)

    assert summary(messages) == http_answer
    if mode in ("stream", "astream_events"):
        assert chunks > len(recorder.calls), "the model streamed"
    if transport == "websocket":
        assert server.shim.stats.websocket_connections == 1
        assert_only_new_items_after_first_turn(recorder.calls, response_ids(messages))
    else:
        assert server.shim.stats.websocket_connections == 0
        assert_full_history_every_turn(recorder.calls)
    await model.aclose()


# a LangGraph graph ------------------------------------------------------------------------


def build_graph(model: lc.ChatOpenAI) -> Any:
    bound = model.bind_tools(TOOLS)

    def call_model(state: MessagesState) -> dict[str, Any]:
        return {"messages": [bound.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", call_model)
    graph.add_node("tools", ToolNode(TOOLS))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    graph.add_edge("model", END)
    return graph.compile(checkpointer=InMemorySaver())


def test_langgraph_graph_over_websocket(
    server: BackgroundServer, recorder: RecordingValidator, http_answer: list[tuple[str, str]]
) -> None:
    graph = build_graph(make_model(server, "websocket"))

    messages = run_task(graph, "g1")

    assert summary(messages) == http_answer
    assert server.shim.stats.websocket_connections == 1
    assert_only_new_items_after_first_turn(recorder.calls, response_ids(messages))


# the middleware ---------------------------------------------------------------------------


def stock_model(server: BackgroundServer) -> langchain_openai.ChatOpenAI:
    return langchain_openai.ChatOpenAI(model=MODEL, base_url=server.base_url, api_key=API_KEY, use_responses_api=True)


def test_middleware_switches_a_stock_model_to_websocket(
    server: BackgroundServer, recorder: RecordingValidator, http_answer: list[tuple[str, str]]
) -> None:
    stock = stock_model(server)
    agent = create_agent(stock, TOOLS, checkpointer=InMemorySaver(), middleware=[lc.WebSocketTransportMiddleware()])

    messages = run_task(agent, "m1")

    assert summary(messages) == http_answer
    assert server.shim.stats.websocket_connections == 1
    assert_only_new_items_after_first_turn(recorder.calls, response_ids(messages))
    with pytest.raises(ValueError, match="not wrapped"):
        ws_transport.session_of(stock.root_client)  # the stock model itself is untouched


async def test_middleware_async_run(server: BackgroundServer, recorder: RecordingValidator) -> None:
    stock = stock_model(server)
    middleware = lc.WebSocketTransportMiddleware()
    agent = create_agent(stock, TOOLS, checkpointer=InMemorySaver(), middleware=[middleware])

    messages, _ = await run_async(agent, "m2", "ainvoke")

    assert server.shim.stats.websocket_connections == 1
    assert_only_new_items_after_first_turn(recorder.calls, response_ids(messages))
    await middleware.websocket_model(stock).aclose()


def test_middleware_with_http_leaves_the_model_alone(server: BackgroundServer, recorder: RecordingValidator) -> None:
    stock = stock_model(server)
    middleware = lc.WebSocketTransportMiddleware(transport="http")
    agent = create_agent(stock, TOOLS, checkpointer=InMemorySaver(), middleware=[middleware])

    run_task(agent, "m3")

    assert middleware.websocket_model(stock) is stock
    assert server.shim.stats.websocket_connections == 0
    assert_full_history_every_turn(recorder.calls)


# threads ----------------------------------------------------------------------------------


THREAD_TASKS = {
    "alpha": 'Find record 1.\ncall lookup {"n": 1}',
    "beta": 'Double 5.\ncall double {"x": 5}',
}


def assert_threads_kept_their_own_chains(results: dict[str, list[BaseMessage]], recorder: RecordingValidator) -> None:
    by_previous = {call.previous_id: call for call in recorder.calls if call.previous_id}
    for name, messages in results.items():
        first, second = response_ids(messages)
        # the thread's second turn continued its own first response, carrying only its own tool output
        (item,) = by_previous[first].items
        assert item["type"] == "function_call_output"
        assert item["output"] == messages[2].content
        assert second not in by_previous
        assert isinstance(messages[2], ToolMessage)
        assert THREAD_TASKS[name].splitlines()[0] in messages[0].text


async def test_parallel_async_threads_keep_separate_sessions_and_chains(
    server: BackgroundServer, recorder: RecordingValidator
) -> None:
    model = make_model(server, "websocket", store=False)
    agent = create_agent(model, TOOLS, checkpointer=InMemorySaver())

    async def one(name: str) -> list[BaseMessage]:
        result = await agent.ainvoke({"messages": [HumanMessage(THREAD_TASKS[name])]}, thread(name))
        return result["messages"]

    alpha, beta = await asyncio.gather(one("alpha"), one("beta"))

    assert_threads_kept_their_own_chains({"alpha": alpha, "beta": beta}, recorder)
    assert server.shim.stats.websocket_connections == 2
    sessions = {name: model.ws_session(name, asynchronous=True) for name in THREAD_TASKS}
    assert sessions["alpha"] is not sessions["beta"]
    assert [s.stats.turns for s in sessions.values()] == [2, 2]
    await model.aclose()


def test_parallel_sync_threads_keep_separate_sessions_and_chains(
    server: BackgroundServer, recorder: RecordingValidator
) -> None:
    model = make_model(server, "websocket", store=False)
    agent = create_agent(model, TOOLS, checkpointer=InMemorySaver())

    def one(name: str) -> list[BaseMessage]:
        return agent.invoke({"messages": [HumanMessage(THREAD_TASKS[name])]}, thread(name))["messages"]

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        results = dict(zip(THREAD_TASKS, pool.map(one, THREAD_TASKS), strict=True))

    assert_threads_kept_their_own_chains(results, recorder)
    assert server.shim.stats.websocket_connections == 2
    assert [model.ws_session(name).stats.turns for name in THREAD_TASKS] == [2, 2]


def test_agent_session_context_picks_the_session(server: BackgroundServer) -> None:
    model = make_model(server, "websocket")
    with lc.agent_session("mine"):
        model.invoke("hello")
    assert model.ws_session("mine").stats.turns == 1
    assert model.ws_session().stats.turns == 0


# lost chains, request size, configuration -------------------------------------------------


async def test_lost_chain_is_resent_with_the_full_history(
    server: BackgroundServer, recorder: RecordingValidator, http_answer: list[tuple[str, str]]
) -> None:
    model = make_model(server, "websocket", store=False)
    agent = create_agent(model, TOOLS, checkpointer=InMemorySaver())
    await agent.ainvoke({"messages": [HumanMessage(STEPS[0])]}, thread("t"))
    await model.aclose_session("t")  # the connection cache holding the chain is gone (store=False)

    await agent.ainvoke({"messages": [HumanMessage(STEPS[1])]}, thread("t"))

    messages = (await agent.aget_state(thread("t"))).values["messages"]
    assert summary(messages) == http_answer
    assert server.shim.stats.websocket_connections == 2
    resent = recorder.calls[2]  # the turn after the loss: refused by the server, then resent in full
    assert resent.previous_id is None
    assert len(resent.items) == 5
    # on the new session: the refused turn, its resend, then a chained turn again
    assert model.ws_session("t", asynchronous=True).stats.turns == 3
    assert recorder.calls[3].previous_id == response_ids(messages)[2]
    await model.aclose()


def long_history(turns: int) -> list[BaseMessage]:
    history: list[BaseMessage] = [HumanMessage("start")]
    for turn in range(turns):
        call = {"name": "lookup", "args": {"n": turn}, "id": f"call_{turn}"}
        history += [
            AIMessage("", tool_calls=[call], response_metadata={"id": f"resp_{turn}"}),
            ToolMessage(f"record {turn}", tool_call_id=f"call_{turn}"),
        ]
    return history


def test_request_carries_only_the_messages_after_the_last_response(server: BackgroundServer) -> None:
    history = long_history(50)
    model = make_model(server, "websocket")
    model.lineage.record("resp_49", history[:-2], history[-2])  # as if this model had answered that history

    ws = model._get_request_payload(history)
    http = make_model(server, "http")._get_request_payload(history)

    assert ws["previous_response_id"] == "resp_49"
    assert ws["input"] == [{"type": "function_call_output", "call_id": "call_49", "output": "record 49"}]
    assert "previous_response_id" not in http
    assert len(http["input"]) == 101


def test_a_rewritten_or_unknown_history_goes_in_full(server: BackgroundServer) -> None:
    history = long_history(3)
    model = make_model(server, "websocket")
    assert "previous_response_id" not in model._get_request_payload(history)  # never answered by this model

    model.lineage.record("resp_2", history[:-2], history[-2])
    summarized = [HumanMessage("summary of the start"), *history[1:]]
    assert "previous_response_id" not in model._get_request_payload(summarized)
    assert model._get_request_payload(history)["previous_response_id"] == "resp_2"


def test_history_rewritten_by_a_middleware_gives_the_http_answer(
    make_server: ServerFactory, recorder: RecordingValidator
) -> None:
    """A middleware rewrites the history (a summary replaces the start): that turn cannot continue the old chain."""

    @before_model
    def summarize_the_start(state: Any, runtime: Any) -> dict[str, Any] | None:
        messages = state["messages"]
        if len(messages) <= 4 or messages[0].text.startswith("Summary"):
            return None
        digest = HumanMessage("Summary: record 3 was looked up.")
        return {"messages": [RemoveMessage(id=REMOVE_ALL_MESSAGES), digest, *messages[1:]]}

    answers = {}
    for transport in ("http", "websocket"):
        recorder.calls.clear()
        server = make_server(validators=[recorder])
        agent = create_agent(
            make_model(server, transport), TOOLS, checkpointer=InMemorySaver(), middleware=[summarize_the_start]
        )
        answers[transport] = summary(run_task(agent, "t"))
    assert answers["websocket"] == answers["http"]
    # turn 3 follows the rewrite: sent in full; turn 4 continues turn 3 again
    assert [(c.previous_id is None, len(c.items)) for c in recorder.calls] == [
        (True, 1),
        (False, 1),
        (True, 5),
        (False, 1),
    ]


def test_transport_defaults_to_websocket_unless_the_environment_says_http(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(lc.TRANSPORT_ENV, raising=False)
    assert lc.ChatOpenAI(model=MODEL, api_key=API_KEY).transport == "websocket"
    monkeypatch.setenv(lc.TRANSPORT_ENV, "http")
    assert lc.ChatOpenAI(model=MODEL, api_key=API_KEY).transport == "http"
    monkeypatch.setenv(lc.TRANSPORT_ENV, "carrier-pigeon")
    with pytest.raises(ValueError, match=lc.TRANSPORT_ENV):
        lc.ChatOpenAI(model=MODEL, api_key=API_KEY)


def test_always_the_responses_api(server: BackgroundServer) -> None:
    assert make_model(server, "http").use_responses_api is True
    with pytest.raises(ValueError, match="Responses API"):
        make_model(server, "http", use_responses_api=False)


def test_other_models_on_the_same_url_keep_plain_http(server: BackgroundServer) -> None:
    """langchain-openai shares one default httpx client per base URL; the WebSocket model must not wrap it."""
    stock = stock_model(server)
    make_model(server, "websocket")
    also_stock = stock_model(server)
    for model in (stock, also_stock):
        with pytest.raises(ValueError, match="not wrapped"):
            ws_transport.session_of(model.root_client)
        with pytest.raises(ValueError, match="not wrapped"):
            ws_transport.session_of(model.root_async_client)


def test_an_edited_answer_goes_in_full_so_the_server_never_continues_the_unedited_one(
    make_server: ServerFactory, recorder: RecordingValidator
) -> None:
    """A guardrail redacts the model's answer but keeps its response id: the server must see the redaction."""
    server = make_server(validators=[recorder])
    model = make_model(server, "websocket")
    history: list[Any] = [HumanMessage("hello")]
    answer = model.invoke(history)
    history += [answer, HumanMessage("go on")]
    model.invoke(history)
    assert recorder.calls[-1].previous_id == answer.response_metadata["id"], "an unedited answer chains"

    history += [model.invoke(history).model_copy(update={"content": "[REDACTED]"}), HumanMessage("and now?")]
    model.invoke(history)
    last = recorder.calls[-1]
    assert last.previous_id is None, "an edited answer is not continued"
    assert any("[REDACTED]" in str(item.get("content")) for item in last.items)
