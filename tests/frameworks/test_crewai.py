"""CrewAI (openai 2.x venv): a real `Crew` of one `Agent` with a tool, its LLM wrapped by `plugins.crewai`."""

from __future__ import annotations

import os
from typing import Any

import pytest

os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")  # loopback only: no telemetry or tracing calls out
os.environ.setdefault("OTEL_SDK_DISABLED", "true")
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")

from crewai import LLM, Agent, Crew, Task
from crewai.tools import tool
from support.agent_tasks import RECORDS, TASKS, lookup
from support.wire import API_KEY

from plugins.crewai import session_of, websocket_llm

pytestmark = pytest.mark.timeout(90)

MODEL = "gpt-4o-mini"


def test_a_crew_with_a_tool_chains_each_tasks_tool_result(make_server: Any, recorder: Any, chain_report: Any) -> None:
    server = make_server(default_model=MODEL, validators=[recorder])
    llm = websocket_llm(LLM(model=f"openai/{MODEL}", base_url=server.base_url, api_key=API_KEY))
    agent = Agent(
        role="clerk", goal="find records", backstory="A records clerk.", llm=llm, tools=[tool("lookup")(lookup)]
    )
    tasks = [Task(description=task, expected_output="the record", agent=agent) for task in TASKS]
    result = Crew(agents=[agent], tasks=tasks).kickoff()
    stats = session_of(llm).stats

    assert f"record {RECORDS[-1]} is blue" in str(result)
    # each task: its first call in full (CrewAI starts every task's conversation afresh), the tool result chained
    assert (stats.turns, stats.chat_turns, stats.turns_chained, stats.fallbacks) == (6, 6, 3, 0)
    assert stats.chat_fallbacks == {}
    assert [len(call.items) for call in recorder.calls][1::2] == [1, 1, 1]
    chain_report("CrewAI Agent/Crew", "crewai", stats)


def test_an_llm_of_another_provider_is_refused() -> None:
    with pytest.raises(TypeError, match="native OpenAI LLM"):
        websocket_llm(object())
