"""Chat Completions <-> Responses translation, without sockets: requests, messages, chaining, answers.

Responses events come from the shim's own event assembler (the code that builds what the server
sends), and every answer is parsed by the SDK's `ChatCompletion` / `ChatCompletionChunk` models.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionMessage
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from chat_mapping import ChunkStream, completion_from_response, messages_to_items
from server_shim.backends.base import Finish, TextDelta, ToolCallDelta, Usage
from server_shim.events import EventSequence, OutputAssembler, response_object
from server_shim.requests import CreateRequest
from ws_transport.chat_completions import ChatBook, Untranslatable, translate_call

TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look a record up.",
        "parameters": {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]},
    },
}
EVENTS = TypeAdapter(ResponseStreamEvent)


def test_parameters_translate_to_their_responses_names() -> None:
    call = translate_call(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "max_completion_tokens": 64,
            "temperature": 0.2,
            "tools": [TOOL],
            "tool_choice": {"type": "function", "function": {"name": "lookup"}},
            "reasoning_effort": "low",
            "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": "object"}}},
            "verbosity": "low",
            "parallel_tool_calls": False,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )
    assert call.fields == {
        "model": "m",
        "temperature": 0.2,
        "parallel_tool_calls": False,
        "store": False,
        "max_output_tokens": 64,
        "reasoning": {"effort": "low"},
        "text": {"format": {"type": "json_schema", "name": "r", "schema": {"type": "object"}}, "verbosity": "low"},
        "tools": [
            {
                "type": "function",
                "name": "lookup",
                "description": "Look a record up.",
                "parameters": TOOL["function"]["parameters"],
                "strict": False,
            }
        ],
        "tool_choice": {"type": "function", "name": "lookup"},
    }
    assert call.stream and call.include_usage
    CreateRequest.model_validate({**call.fields, "input": []})


def test_logprobs_ask_for_the_output_texts_log_probabilities() -> None:
    call = translate_call({"model": "m", "messages": [], "logprobs": True, "top_logprobs": 3})
    assert call.fields == {"model": "m", "store": False, "include": ["message.output_text.logprobs"], "top_logprobs": 3}
    assert translate_call({"model": "m", "messages": [], "logprobs": False}).fields == {"model": "m", "store": False}
    CreateRequest.model_validate({**call.fields, "input": []})


def test_none_valued_arguments_count_as_not_given() -> None:
    call = translate_call({"model": "m", "messages": [], "n": None, "stop": None, "seed": None, "temperature": None})
    assert call.fields == {"model": "m", "store": False}


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        ({"n": 2}, "n > 1"),
        ({"logit_bias": {"50256": -100}}, "logit_bias"),
        ({"top_logprobs": 2}, "top_logprobs without logprobs"),
        ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"stop": ["\n"]}, "stop"),
        ({"seed": 7}, "seed"),
        ({"max_tokens": 5}, "max_tokens below 16, the Responses API minimum"),
        ({"extra_body": {"top_k": 3}}, "extra_body"),
        ({"tools": [{"type": "custom", "custom": {"name": "x"}}]}, "custom tools"),
        ({"brand_new_option": 1}, "unknown parameter brand_new_option"),
    ],
)
def test_parameters_without_a_faithful_translation_are_refused_with_the_reason(
    extra: dict[str, Any], reason: str
) -> None:
    with pytest.raises(Untranslatable) as refused:
        translate_call({"model": "m", "messages": [], **extra})
    assert refused.value.reason == reason


def test_every_message_role_becomes_the_matching_items() -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "developer", "content": [{"type": "text", "text": "Use tools."}]},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
            ],
        },
        {
            "role": "assistant",
            "content": "Looking.",
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"id":3}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "name": "lookup", "content": [{"type": "text", "text": "record 3"}]},
        ChatCompletionMessage(role="assistant", content="It is record 3."),
    ]
    assert messages_to_items(messages) == [
        {"type": "message", "role": "system", "content": "Be brief."},
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Use tools."}]},
        {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_text", "text": "What is this?"},
                {"type": "input_image", "image_url": "https://example.com/a.png", "detail": "auto"},
            ],
        },
        {"type": "message", "role": "assistant", "content": "Looking."},
        {"type": "function_call", "call_id": "call_1", "name": "lookup", "arguments": '{"id":3}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "record 3"},
        {"type": "message", "role": "assistant", "content": "It is record 3."},
    ]


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        ({"role": "function", "name": "f", "content": "x"}, "function messages"),
        ({"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}, "input_audio content"),
        ({"role": "user", "name": "alice", "content": "hi"}, "message name"),
        ({"role": "assistant", "audio": {"id": "a1"}}, "assistant audio"),
    ],
)
def test_messages_without_a_faithful_translation_are_refused(message: dict[str, Any], reason: str) -> None:
    with pytest.raises(Untranslatable) as refused:
        messages_to_items([message])
    assert refused.value.reason == reason


def _assistant_call(call_id: str, arguments: str = '{"id":3}') -> dict[str, Any]:
    call = {"id": call_id, "type": "function", "function": {"name": "lookup", "arguments": arguments}}
    return {"role": "assistant", "content": None, "refusal": None, "tool_calls": [call]}


def _call(messages: list[Any], **extra: Any) -> Any:
    return translate_call({"model": "m", "messages": messages, "tools": [TOOL], **extra})


def test_a_turn_with_other_tools_or_settings_still_continues_the_conversation() -> None:
    """A framework's follow-up call without tools (AutoGen's reflection) is the same conversation."""
    book = ChatBook()
    history: list[Any] = [_user("find 3")]
    book.record(book.plan(_call(history)), _assistant_call("call_1"), "resp_1", link=None)
    follow = [*history, _assistant_call("call_1"), {"role": "tool", "tool_call_id": "call_1", "content": "3"}]
    plan = book.plan(translate_call({"model": "m", "messages": follow, "temperature": 0}))
    assert plan.turn is not None and plan.new_messages == follow[2:]


def test_only_messages_after_the_answered_turn_are_new() -> None:
    book = ChatBook()
    history: list[Any] = [{"role": "system", "content": "s"}, {"role": "user", "content": "find 3"}]
    first = book.plan(_call(history))
    assert first.turn is None and first.new_messages == history
    book.record(first, _assistant_call("call_1"), "resp_1", link="chain-1")

    # The framework rebuilds every dict and re-serializes the arguments with other spacing.
    history = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "find 3"},
        {"role": "assistant", "content": "", "tool_calls": [_assistant_call("call_1", '{"id": 3}')["tool_calls"][0]]},
        {"role": "tool", "tool_call_id": "call_1", "content": "record 3"},
    ]
    second = book.plan(_call(history))
    assert second.turn is not None and second.turn.link == "chain-1"
    assert second.new_messages == [history[3]]
    book.record(second, {"role": "assistant", "content": "done"}, "resp_2", link="chain-2")
    assert len(book) == 1  # the continued turn was replaced

    third = book.plan(_call([*history, ChatCompletionMessage(role="assistant", content="done"), _user("next")]))
    assert third.turn is not None and third.turn.response_id == "resp_2" and len(third.new_messages) == 1


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


@pytest.mark.parametrize(
    "change",
    ["edited_history", "edited_answer", "other_model", "nothing_new"],
)
def test_a_history_that_does_not_continue_the_turn_goes_in_full(change: str) -> None:
    book = ChatBook()
    history: list[Any] = [_user("find 3")]
    book.record(book.plan(_call(history)), {"role": "assistant", "content": "It is 3."}, "resp_1", link=None)
    answer: dict[str, Any] = {"role": "assistant", "content": "It is 3."}
    extra: dict[str, Any] = {}
    follow = [answer, _user("and 4?")]
    if change == "edited_history":
        history = [_user("find 4")]
    elif change == "edited_answer":
        follow[0] = {"role": "assistant", "content": "It is three."}
    elif change == "other_model":
        extra = {"model": "other"}
    else:
        follow = [answer]
    plan = book.plan(_call([*history, *follow], **extra))
    assert plan.turn is None and plan.start == 0


def test_forgotten_turns_are_not_continued() -> None:
    book = ChatBook(capacity=1)
    first = book.plan(_call([_user("a")]))
    turn = book.record(first, {"role": "assistant", "content": "A"}, "resp_a", link=None)
    book.record(book.plan(_call([_user("b")])), {"role": "assistant", "content": "B"}, "resp_b", link=None)
    assert book.plan(_call([_user("a"), {"role": "assistant", "content": "A"}, _user("c")])).turn is None
    book.forget(turn)
    assert book.plan(_call([_user("b"), {"role": "assistant", "content": "B"}, _user("c")])).turn is not None


def _events(deltas: list[Any], *, status: str = "completed", reason: str | None = None) -> list[dict[str, Any]]:
    """The events the shim sends for these backend deltas."""
    seq = EventSequence()
    request = CreateRequest(model="simulated-1", tools=[{"type": "function", "name": "lookup"}])
    created = response_object("resp_x", request, status="in_progress", created_at=1_700_000_000)
    events = [seq("response.created", response=created)]
    assembler = OutputAssembler(seq)
    for delta in deltas:
        events.extend(assembler.feed(delta))
    events.extend(assembler.close())
    final = response_object(
        "resp_x",
        request,
        status=status,
        output=assembler.output,
        usage=assembler.usage,
        incomplete_reason=reason,
        created_at=1_700_000_000,
    )
    events.append(seq(f"response.{status}", response=final))
    for event in events:
        EVENTS.validate_python(event)
    return events


def _chunks(events: list[dict[str, Any]], include_usage: bool = False) -> list[ChatCompletionChunk]:
    stream = ChunkStream(include_usage=include_usage)
    return [ChatCompletionChunk.model_validate(c) for e in events for c in stream.feed(e)]


TOOL_DELTAS = [
    TextDelta("Let me look. "),
    ToolCallDelta(0, "", "call_a", "lookup"),
    ToolCallDelta(0, '{"id":'),
    ToolCallDelta(0, "3}"),
    ToolCallDelta(1, '{"id":4}', "call_b", "lookup"),
    Usage(120, 9, cached_tokens=100),
    Finish("tool_calls"),
]


def test_a_response_becomes_a_chat_completion_with_the_same_content_calls_and_usage() -> None:
    final = _events(TOOL_DELTAS)[-1]["response"]
    Response.model_validate(final)
    completion = ChatCompletion.model_validate(completion_from_response(final))
    choice = completion.choices[0]
    assert (completion.id, completion.created, completion.model) == ("resp_x", 1_700_000_000, "simulated-1")
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me look. "
    assert [(c.id, c.function.name, c.function.arguments) for c in choice.message.tool_calls or []] == [
        ("call_a", "lookup", '{"id":3}'),
        ("call_b", "lookup", '{"id":4}'),
    ]
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens, completion.usage.total_tokens) == (
        120,
        9,
        129,
    )
    assert completion.usage.prompt_tokens_details is not None
    assert completion.usage.prompt_tokens_details.cached_tokens == 100


def test_streamed_chunks_rebuild_the_same_message_as_the_final_response() -> None:
    events = _events(TOOL_DELTAS)
    chunks = _chunks(events, include_usage=True)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert {c.id for c in chunks} == {"resp_x"}
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    calls: dict[int, dict[str, str]] = {}
    for chunk in chunks:
        for call in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            entry = calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
            entry["id"] += call.id or ""
            entry["name"] += (call.function.name or "") if call.function else ""
            entry["arguments"] += (call.function.arguments or "") if call.function else ""
    message = completion_from_response(events[-1]["response"])["choices"][0]["message"]
    assert text == message["content"]
    assert [calls[i] for i in sorted(calls)] == [
        {"id": c["id"], "name": c["function"]["name"], "arguments": c["function"]["arguments"]}
        for c in message["tool_calls"]
    ]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert all(c.usage is None for c in chunks[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 9


def test_without_include_usage_no_chunk_carries_usage() -> None:
    chunks = _chunks(_events([TextDelta("hi"), Usage(3, 1), Finish("stop")]))
    assert all(c.usage is None and c.choices for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_a_response_cut_by_the_token_limit_finishes_with_length() -> None:
    events = _events([TextDelta("partial"), Finish("length")], status="incomplete", reason="max_output_tokens")
    assert _chunks(events)[-1].choices[0].finish_reason == "length"
    assert completion_from_response(events[-1]["response"])["choices"][0]["finish_reason"] == "length"


def test_a_failed_response_streams_one_error_the_sdk_raises() -> None:
    stream = ChunkStream()
    failed = {"type": "response.failed", "response": {"id": "r", "error": {"code": "backend_error", "message": "down"}}}
    assert stream.feed(failed) == [{"error": {"code": "backend_error", "message": "down", "type": "server_error"}}]
    assert stream.feed({"type": "error", "error": {"code": "backend_error", "message": "down"}}) == []
    assert json.dumps(stream.feed({"type": "response.in_progress"})) == "[]"


@pytest.mark.parametrize("caller", ["appended", "rebuilt"])
def test_the_answered_prefix_is_never_translated_again_and_the_items_are_the_same(
    caller: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Per call, only the new messages (and, on record, the answer) are translated and normalized, yet
    the plan's items and the recorded forms equal a full translation of the whole history every turn."""
    import ws_transport.chat_completions as chat_completions

    translated: list[int] = []
    normalized: list[Any] = []
    full_translation, full_normalize = chat_completions.messages_to_items, chat_completions.normalize

    def counting_translation(messages: Any) -> list[dict[str, Any]]:
        messages = list(messages)
        translated.append(len(messages))
        return full_translation(messages)

    def counting_normalize(message: Any) -> tuple[Any, ...]:
        normalized.append(message)
        return full_normalize(message)

    monkeypatch.setattr(chat_completions, "messages_to_items", counting_translation)
    monkeypatch.setattr(chat_completions, "normalize", counting_normalize)
    book = ChatBook()
    messages: list[Any] = [{"role": "system", "content": "s"}, _user("find 0")]
    for turn in range(30):
        sent = json.loads(json.dumps([_plain(m) for m in messages])) if caller == "rebuilt" else messages
        translated.clear()
        normalized.clear()
        plan = book.plan(_call(sent))
        assert plan.items == full_translation(sent)
        assert plan.new_items == full_translation(sent[plan.start :])
        answer = ChatCompletionMessage.model_validate(_assistant_call(f"call_{turn}", f'{{"id": {turn}}}'))
        recorded = book.record(plan, answer.model_dump(mode="json"), f"resp_{turn}", link=turn)
        assert recorded.normalized == [full_normalize(m) for m in sent]
        assert recorded.items == full_translation([*sent, answer])
        if turn:
            assert plan.turn is not None and plan.start == len(sent) - 1
            assert sum(translated) == 1  # the one new message (a tool output); the answer's own items on record
            assert len(normalized) == 3  # the caller's copy of the answer, the new message, the answer on record
        messages += [answer, {"role": "tool", "tool_call_id": f"call_{turn}", "content": f"record {turn}"}]


def _plain(message: Any) -> Any:
    return message.model_dump(mode="json", exclude_none=True) if isinstance(message, ChatCompletionMessage) else message
