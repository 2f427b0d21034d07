"""Stateful incremental checks give the verdicts and labels a full-history check gives.

The property test drives the real turn pipeline (no sockets, real store and connection cache,
the simulated backend): random 100-turn conversations that fork from earlier responses, each turn
run twice, chained (only the new items, state from the parent response) and stateless (the whole
branch's history, as over HTTP without `previous_response_id`). The verdict (completed with its
labels, or refused with its code) must be the same every time.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server_shim.backends import SimulatedBackend
from server_shim.checks import Finding, runs, side
from server_shim.errors import APIError
from server_shim.items import Item
from server_shim.policies import ContentPolicy, Guard, Secrets
from server_shim.redis_store import decode_state, encode_state
from server_shim.requests import CreateRequest
from server_shim.state import ConnectionCache, MemoryResponseStore, ResponseState
from server_shim.turn import Turn, TurnEnv

MODEL = "simulated-1"


class RiskScore:
    """A conversation-level check: a running score over input, a count of model output runs, and a
    block once the score reaches a limit (so every later turn on that branch is refused)."""

    name = "risk"
    mutates = False
    blocking = True

    def initial(self) -> dict[str, int]:
        return {"score": 0, "outputs": 0}

    def observe(self, state: dict[str, int], items: list[Item]) -> dict[str, int]:
        return {**state, "outputs": state["outputs"] + 1}

    async def inspect(self, state: dict[str, int], items: list[Item]) -> tuple[dict[str, int], Finding]:
        await asyncio.sleep(0)
        text = " ".join(str(item["content"]) for item in items)
        state = {**state, "score": state["score"] + text.count("risky")}
        refusal = APIError(400, "risk_limit_reached", "Too risky.") if state["score"] >= 6 else None
        return state, Finding(
            labels={"risk": str(state["score"]), "risk.outputs": str(state["outputs"])}, refusal=refusal
        )


class EncodedStore(MemoryResponseStore):
    """The memory store keeping what the Redis store keeps: each state through its stored encoding."""

    async def save(self, state: ResponseState) -> None:
        batches = [orjson.dumps(batch) for batch in state.history.batch_list()]  # what its history list holds
        await super().save(decode_state(encode_state(state, "history"), batches))


GUARD = SimulatedBackend(guard={"S1": ["attack"], "S2": ["weapon"]})


def checks() -> list[Any]:
    return [
        Secrets(action="redact"),
        ContentPolicy("fruit", words=["banana"], action="flag"),
        ContentPolicy("policy", words=["forbidden"], action="block"),
        Guard(backend=GUARD, model="guard", action="flag"),
        RiskScore(),
    ]


TEXTS = [
    "hello there",
    "tell me about banana bread",
    "a risky move",
    "my mail is someone@example.org",
    "use key sk-ABCDEFGHIJKLMNOPQRSTUVWX12",
    "card 4111 1111 1111 1111 please",
    "a forbidden topic",
    "risky risky",
    "an attack with a weapon",
    'call lookup {"n": 1}',
]
LOOKUP = {
    "type": "function",
    "name": "lookup",
    "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
}


def message(role: str, text: str, parts: bool) -> Item:
    content: Any = [{"type": "input_text", "text": text}] if parts else text
    return {"type": "message", "role": role, "content": content}


ITEMS = st.lists(
    st.builds(message, st.sampled_from(["user", "user", "developer"]), st.sampled_from(TEXTS), st.booleans()),
    min_size=1,
    max_size=3,
)
STEPS = st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 9), ITEMS), min_size=100, max_size=100)


@dataclass
class Node:
    response_id: str
    history: list[Item]


async def verdict(turn: Turn) -> tuple[str, Any]:
    try:
        events = [event async for batch in turn.events() for event in batch]
    except APIError as error:
        return "refused", error.code
    last = events[-1] if events[-1]["type"] != "error" else events[-2]
    if last["type"] == "response.failed":
        return "refused", last["response"]["error"]["code"]
    assert last["type"] == "response.completed", last
    return "completed", last["response"]["metadata"]


async def check_conversation(steps: list[tuple[int, int, list[Item]]], *, overlap: bool) -> dict[str, int]:
    backend = SimulatedBackend()
    chained = TurnEnv(backend=backend, store=EncodedStore(), checks=lambda model: checks(), overlap_checks=overlap)
    stateless = TurnEnv(backend=backend, store=MemoryResponseStore(), checks=lambda model: checks())
    cache = ConnectionCache(max_responses=8, max_bytes=1 << 30)  # forks to older responses load from the store
    nodes: list[Node] = []
    seen = {"completed": 0, "refused": 0, "forks": 0, "tool_results": 0}
    for pick, fork, new_items in steps:
        parent = None if not nodes else nodes[pick % len(nodes)] if fork == 0 else nodes[-1]
        seen["forks"] += parent is not None and parent is not nodes[-1]
        calls = [item["call_id"] for item in (parent.history if parent else []) if item["type"] == "function_call"]
        if calls and parent is not None and parent.history[-1]["type"] == "function_call":
            result = {"type": "function_call_output", "call_id": calls[-1], "output": TEXTS[pick % len(TEXTS)]}
            new_items = [result, *new_items] if fork % 2 else [result]
            seen["tool_results"] += 1
        request = CreateRequest(
            model=MODEL, input=new_items, previous_response_id=parent and parent.response_id, store=True, tools=[LOOKUP]
        )
        chained_turn = Turn(request, chained, cache)
        incremental = await verdict(chained_turn)
        history = [*(parent.history if parent else []), *new_items]
        stateless_request = CreateRequest(model=MODEL, input=history, store=False, tools=[LOOKUP])
        full = await verdict(Turn(stateless_request, stateless, None))
        assert incremental == full, f"turn {len(nodes)}: chained {incremental} vs full history {full}"
        seen[incremental[0]] += 1
        if incremental[0] == "completed":
            response = chained_turn.result.response
            assert response is not None
            nodes.append(Node(response["id"], [*history, *response["output"]]))
    return seen


EXAMPLES = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@EXAMPLES
@given(STEPS)
def test_chained_and_full_history_checks_agree_on_random_forking_conversations(steps):
    seen = asyncio.run(check_conversation(steps, overlap=True))
    assert seen["completed"] + seen["refused"] == 100


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(STEPS)
def test_they_agree_with_the_checks_run_before_inference_too(steps):
    asyncio.run(check_conversation(steps, overlap=False))


def test_the_generated_conversations_exercise_forks_refusals_and_labels():
    """The property is not vacuous: a fixed conversation forks, refuses, redacts and labels."""
    steps = [(i * 7, i % 3, [message("user", TEXTS[i % len(TEXTS)], i % 2 == 0)]) for i in range(100)]
    seen = asyncio.run(check_conversation(steps, overlap=True))
    assert seen["forks"] > 10 and seen["refused"] > 5 and seen["completed"] > 50 and seen["tool_results"] > 3


def test_runs_cut_the_conversation_where_the_model_spoke():
    user = message("user", "a", False)
    call = {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}
    output = {"type": "function_call_output", "call_id": "c", "output": "x"}
    said = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "b"}]}
    assert [side(i) for i in (user, call, output, said)] == ["input", "output", "input", "output"]
    assert [(which, len(run)) for which, run in runs([user, user, call, said, output, user])] == [
        ("input", 2),
        ("output", 2),
        ("input", 2),
    ]
