"""Rendering items into chat messages: append-only, stable bytes, documented Chat Completions shapes."""

from __future__ import annotations

import json
import sys

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from openai.types.chat import ChatCompletionMessageParam
from pydantic import TypeAdapter

from server_shim.backends.base import BackendRequest
from server_shim.backends.chat_convert import (
    CHECKPOINT_HELD,
    RUN,
    SEGMENT_HELD,
    ChatPrompt,
    _chat_message,
    _Checkpoint,
    chat_body,
    encode,
    fragments_held,
    render_items,
    renders,
)
from server_shim.footprint import footprint
from server_shim.history import History

MESSAGE = TypeAdapter(ChatCompletionMessageParam)


def user(text):
    return {"type": "message", "role": "user", "content": text}


def assistant(text):
    return {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}


def call(call_id, name="lookup", arguments='{"n": 1}'):
    return {"type": "function_call", "call_id": call_id, "name": name, "arguments": arguments}


def output(call_id, text):
    return {"type": "function_call_output", "call_id": call_id, "output": text}


AGENT_LOOP = [
    [user("find 1")],  # turn 1 input
    [call("call_1")],  # turn 1 output
    [output("call_1", "record 1")],  # turn 2 input
    [assistant("Found record 1.")],  # turn 2 output
    [user("now 2")],
    [assistant("Looking."), call("call_2"), call("call_3")],  # text then two parallel calls in one output
    [output("call_2", "r2"), output("call_3", "r3")],
    [assistant("Done.")],
]


def chained(batches) -> ChatPrompt:
    prompt = ChatPrompt()
    for batch in batches:
        prompt = prompt.extend(render_items(batch))
    return prompt


def test_messages_have_the_documented_chat_shapes():
    messages = chained(AGENT_LOOP).messages
    for message in messages:
        MESSAGE.validate_python(message)
    assert [m["role"] for m in messages] == [
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
        "assistant",
        "tool",
        "tool",
        "assistant",
    ]
    assert messages[1] == {
        "content": "",
        "role": "assistant",
        "tool_calls": [{"function": {"arguments": '{"n": 1}', "name": "lookup"}, "id": "call_1", "type": "function"}],
    }
    assert messages[2] == {"content": "record 1", "role": "tool", "tool_call_id": "call_1"}
    assert messages[5]["content"] == "Looking."
    assert [c["id"] for c in messages[5]["tool_calls"]] == ["call_2", "call_3"]


def test_chained_batches_render_the_same_bytes_as_the_whole_history_at_once():
    whole = ChatPrompt().extend(render_items([item for batch in AGENT_LOOP for item in batch]))
    assert chained(AGENT_LOOP).encoded_messages("Be brief.") == whole.encoded_messages("Be brief.")


def test_every_turns_prompt_is_a_byte_prefix_of_the_next():
    prompt = ChatPrompt()
    previous = prompt.encoded_messages("sys")
    for batch in AGENT_LOOP:
        prompt = prompt.extend(render_items(batch))
        current = prompt.encoded_messages("sys")
        assert current.startswith(previous[:-1])  # drop the closing bracket
        previous = current


def test_extending_never_re_encodes_or_changes_the_parent():
    parent = chained(AGENT_LOOP[:3])
    fragments = parent.fragments
    child = parent.extend(render_items([user("more")]))
    assert parent.fragments == fragments and len(parent.messages) == 3
    assert child.parent is parent, "the child shares its parent's history instead of copying it"
    assert all(a is b for a, b in zip(child.fragments, parent.fragments, strict=False))
    assert child.nbytes == parent.nbytes + len(encode(child.messages[-1])) + 1
    assert parent.extend([]) is parent


def test_the_encoding_is_the_json_array_of_the_messages_with_sorted_keys():
    prompt = chained(AGENT_LOOP)
    encoded = prompt.encoded_messages("Be brief.")
    decoded = json.loads(encoded)
    assert decoded == [{"content": "Be brief.", "role": "system"}, *prompt.messages]
    assert encoded == orjson.dumps(decoded, option=orjson.OPT_SORT_KEYS)
    assert prompt.encoded_messages(None) == orjson.dumps(list(prompt.messages), option=orjson.OPT_SORT_KEYS)


@pytest.mark.parametrize("instructions", [None, "Be brief."])
@pytest.mark.parametrize("turns", [0, 1, 2, len(AGENT_LOOP)])
def test_a_chat_body_is_the_json_object_of_its_fields_and_messages(turns, instructions):
    """The messages joined into the body between its other fields (one join: `before` and `after`), for an
    empty prompt, one message, and many segments."""
    prompt = chained(AGENT_LOOP[:turns])
    system = [{"content": instructions, "role": "system"}] if instructions else []
    assert json.loads(prompt.encoded_messages(instructions)) == [*system, *prompt.messages]
    request = BackendRequest(model="m", history=History(), instructions=instructions, max_output_tokens=3)
    body = json.loads(chat_body(request, prompt, None, None))
    assert body == {
        "model": "m",
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 3,
        "messages": [*system, *prompt.messages],
    }


def test_key_order_of_the_input_does_not_change_the_bytes():
    a = {"type": "message", "role": "user", "content": "x"}
    b = {"content": "x", "role": "user", "type": "message"}
    assert ChatPrompt().extend(render_items([a])).fragments == ChatPrompt().extend(render_items([b])).fragments


def test_developer_becomes_system_and_text_parts_join_into_a_string():
    (message,) = render_items(
        [
            {
                "type": "message",
                "role": "developer",
                "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}],
            }
        ]
    )
    assert message == {"content": "ab", "role": "system"}


def test_images_and_files_become_chat_content_parts():
    (message,) = render_items(
        [
            {
                "type": "message",
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "see"},
                    {"type": "input_image", "image_url": "https://example.invalid/a.png", "detail": "auto"},
                    {"type": "input_file", "file_id": "file_1", "filename": "a.pdf"},
                ],
            }
        ]
    )
    MESSAGE.validate_python(message)
    assert message["content"] == [
        {"text": "see", "type": "text"},
        {"image_url": {"url": "https://example.invalid/a.png"}, "type": "image_url"},
        {"file": {"file_id": "file_1", "filename": "a.pdf"}, "type": "file"},
    ]


def test_a_tool_output_given_as_parts_renders_as_text():
    (message,) = render_items(
        [{"type": "function_call_output", "call_id": "c", "output": [{"type": "input_text", "text": "ok"}]}]
    )
    assert message == {"content": "ok", "role": "tool", "tool_call_id": "c"}


@pytest.mark.parametrize("item", [{"type": "reasoning", "id": "rs_1", "summary": []}])
def test_items_without_a_chat_form_render_nothing(item):
    assert render_items([item]) == []


@pytest.mark.parametrize(
    "batch",
    [
        [user("hi")],
        [{"type": "reasoning", "id": "rs_1", "summary": []}],
        *AGENT_LOOP,
        [{"role": "user", "content": "x"}],
    ],
)
def test_whether_a_batch_renders_is_known_without_rendering_it(batch):
    assert renders(batch) == bool(render_items(batch))


def test_a_segments_size_and_held_bytes_are_what_its_fragments_take():
    prompt = chained(AGENT_LOOP)
    node = prompt
    sizes = set()
    while node is not None:
        assert node.own_nbytes == sum(len(f) + 1 for f in node.own_fragments)
        assert fragments_held(node.own_fragments) == footprint(node.own_fragments)
        parent_held = node.parent.held if node.parent is not None else 0
        assert node.held - parent_held == SEGMENT_HELD + footprint(node.own_fragments)
        sizes.add(len(node.own_fragments))
        node = node.parent
    assert 1 in sizes and max(sizes) > 1, "segments of one message and of several"


@pytest.mark.parametrize(
    "batches",
    [
        AGENT_LOOP,
        [[user("hi")], [assistant("a")], [user("b"), {"role": "developer", "content": "c"}], [{"type": "reasoning"}]],
    ],
)
def test_a_batch_extends_a_prompt_as_its_rendered_messages_do(batches):
    by_items, by_messages = ChatPrompt(), ChatPrompt()
    for batch in batches:
        by_items, by_messages = by_items.extend_items(batch), by_messages.extend(render_items(batch))
        assert (by_items.count, by_items.nbytes, by_items.held) == (
            by_messages.count,
            by_messages.nbytes,
            by_messages.held,
        )
        assert by_items == by_messages


def _naive_fragments(prompt):
    """Every segment's fragments, walking parents one by one: the reference the checkpoints must agree with."""
    runs, node = [], prompt
    while node is not None:
        runs.append(node.own_fragments)
        node = node.parent
    return tuple(f for run in reversed(runs) for f in run)


def test_checkpoints_every_run_of_segments_change_no_fragment_and_are_counted_in_held():
    """A chain long enough for several checkpoints (segments of one and of several messages): at every
    length, the fragments, the body and `messages` are those of the plain walk, and each segment's `held`
    adds exactly its object, its fragments and (a checkpoint) the tuple of its run."""
    prompt, lengths = ChatPrompt(), set()
    for n in range(3 * RUN + 5):
        batch = [user(f"turn {n}")] if n % 3 else [assistant(f"a{n}"), call(f"call_{n}"), output(f"call_{n}", "r")]
        parent, prompt = prompt, prompt.extend(render_items(batch))
        assert prompt.fragments == _naive_fragments(prompt)
        assert json.loads(prompt.encoded_messages("sys"))[1:] == list(map(json.loads, _naive_fragments(prompt)))
        checkpoint = isinstance(prompt, _Checkpoint)
        assert checkpoint == ((n + 1) % RUN == 0), "every RUNth segment"
        extra = CHECKPOINT_HELD + sys.getsizeof(prompt.run) if checkpoint else SEGMENT_HELD
        assert prompt.held - parent.held == extra + footprint(prompt.own_fragments)
        lengths.add(len(prompt.fragments))
    assert prompt.messages == tuple(map(orjson.loads, _naive_fragments(prompt)))
    assert len(lengths) == 3 * RUN + 5


def test_a_long_chain_holds_each_message_once_and_reads_back_in_order():
    prompt = ChatPrompt()
    for n in range(2_000):
        prompt = prompt.extend(render_items([user(f"turn {n}")]))
    assert prompt.count == 2_000 and prompt.last_message == {"content": "turn 1999", "role": "user"}
    assert [m["content"] for m in prompt.messages[:2]] == ["turn 0", "turn 1"]
    assert prompt.encoded_messages(None).count(b'"role":"user"') == 2_000
    # the footprint grows linearly: the last 1,000 turns added about as much as the first 1,000
    middle = prompt
    for _ in range(1_000):
        middle = middle.parent
    assert 0.8 < (prompt.held - middle.held) / middle.held < 1.25


def test_cached_fragments_are_right_sized_not_orjson_buffers():
    import tracemalloc

    tracemalloc.start()
    prompt = ChatPrompt()
    for n in range(500):
        prompt = prompt.extend([{"content": f"m{n}", "role": "user"}])
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert held < 500 * 1024, f"{held / 500:.0f} bytes per small message"


def test_steering_input_before_tool_outputs_renders_after_them_so_each_tool_message_follows_its_call():
    call = {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": "{}"}
    pending = [
        {"type": "message", "role": "user", "content": "use metric units"},
        {"type": "function_call_output", "call_id": "c1", "output": "seven"},
        {"type": "message", "role": "user", "content": "thanks"},
    ]
    messages = render_items([call]) + render_items(pending)
    assert [m["role"] for m in messages] == ["assistant", "tool", "user", "user"]
    assert messages[2]["content"] == "use metric units"
    plain = render_items([{"type": "message", "role": "user", "content": "hi"}, *pending[2:]])
    assert [m["content"] for m in plain] == ["hi", "thanks"], "without tool outputs nothing moves"


def test_the_same_reordering_applies_inside_a_whole_history():
    history = [
        {"type": "message", "role": "user", "content": "find it"},
        {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": "{}"},
        {"type": "message", "role": "user", "content": "use metric units"},
        {"type": "function_call_output", "call_id": "c1", "output": "seven"},
    ]
    assert [m["role"] for m in render_items(history)] == ["user", "assistant", "tool", "user"]


_TEXT = st.text(max_size=12)
_PART = st.fixed_dictionaries(
    {"type": st.sampled_from(["input_text", "output_text", "refusal", "input_image", "input_file", "other"])},
    optional={
        "text": st.one_of(_TEXT, st.none(), st.integers()),
        "refusal": st.one_of(_TEXT, st.none()),
        "image_url": _TEXT,
        "file_id": _TEXT,
    },
)
_MESSAGE_ITEM = st.fixed_dictionaries(
    {
        "role": st.one_of(st.sampled_from(["user", "assistant", "system", "developer", "tool"]), _TEXT),
        "content": st.one_of(_TEXT, st.none(), st.lists(_PART, max_size=3)),
    },
    optional={"type": st.just("message"), "id": _TEXT, "status": st.just("completed")},
)


@given(_MESSAGE_ITEM)
def test_a_message_batch_is_written_as_its_chat_message_encodes(item):
    """A one-message batch's fragment (written from its content's JSON where the content is text) is the canonical
    encoding of its chat message, whatever the role and content (or fails as rendering the message does)."""
    assert _outcome(lambda: ChatPrompt().extend_items([item]).own_fragments[0]) == _outcome(
        lambda: encode(_chat_message(item))
    )


def _outcome(make):
    try:
        return make()
    except Exception as exc:
        return type(exc)
