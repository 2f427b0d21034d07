"""A batch of conversation items sized by its shape (`batch_footprint`): the full walk's figure, never below it.

The reference is the footprint's definition (`support.sizes`), which walks every node. Items of the usual
shapes must be sized without the walk (the point of `batch_footprint`); every other shape falls back to it.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.sizes import footprint_by_definition

from server_shim import item_held
from server_shim.backends.base import TextDelta
from server_shim.events import EventSequence, OutputAssembler
from server_shim.item_held import batch_footprint

texts = st.text(max_size=300)
keys = st.text(max_size=80)
leaves = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(allow_nan=False), texts)
parts = st.dictionaries(keys, st.one_of(leaves, st.just([]), st.lists(leaves, max_size=3)), max_size=6)
items = st.dictionaries(keys, st.one_of(leaves, st.lists(parts, max_size=4), st.lists(leaves, max_size=3)), max_size=8)
json_values = st.recursive(leaves, lambda inner: st.lists(inner) | st.dictionaries(keys, inner), max_leaves=30)


def _decoded(batch: list[Any]) -> tuple[Any, ...]:
    """The batch as a request's JSON decodes to it: no container shared between two places."""
    return tuple(orjson.loads(orjson.dumps(batch)))


@settings(max_examples=400, deadline=None)
@given(st.lists(items | json_values, max_size=5))
def test_any_decoded_batch_is_sized_to_the_walks_figure(batch):
    decoded = _decoded(batch)
    assert batch_footprint(decoded) == footprint_by_definition(decoded)


USUAL = {
    "a user message": {"type": "message", "role": "user", "content": "Next step?"},
    "a call's output": {"type": "function_call_output", "call_id": "call_1", "output": "ok" * 2_000},
    "a call": {
        "type": "function_call",
        "id": "fc_1",
        "call_id": "call_1",
        "name": "f",
        "arguments": "{}",
        "status": "completed",
    },
    "the assistant's message": {
        "id": "msg_1",
        "type": "message",
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "hi é 😀", "annotations": [], "logprobs": []}],
    },
}


@pytest.mark.parametrize("name", USUAL)
def test_the_usual_items_are_sized_without_the_walk(name, monkeypatch):
    batch = _decoded([USUAL[name], USUAL[name]])
    expected = footprint_by_definition(batch)
    monkeypatch.setattr(item_held, "footprint", lambda value: pytest.fail(f"walked {value!r}"))
    assert batch_footprint(batch) == expected


def test_the_assemblers_output_message_is_sized_without_the_walk(monkeypatch):
    """The output batch as the turn sizes it: the assembler's own item (not decoded from JSON)."""
    assembler = OutputAssembler(EventSequence(), encoded=True)
    for text in ("Hel", "lo"):
        assembler.feed(TextDelta(text))
    assembler.close()
    batch = tuple(assembler.output)
    expected = footprint_by_definition(batch)
    monkeypatch.setattr(item_held, "footprint", lambda value: pytest.fail(f"walked {value!r}"))
    assert batch_footprint(batch) == expected


@pytest.mark.parametrize(
    "item",
    [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "parts"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "t"}]},
        {**USUAL["the assistant's message"], "content": []},
        {**USUAL["the assistant's message"], "content": [{"type": "output_text", "text": "t", "annotations": [1]}]},
        {
            **USUAL["the assistant's message"],
            "content": [{"type": "output_text", "text": "t", "annotations": [], "logprobs": [{"token": "t"}]}],
        },
        {**USUAL["the assistant's message"], "status": None},
        {"k" * 65: "a key longer than the shared ones"},
        {1: "a key without a length"},
        {},
        {"content": {"a": "dict value"}},
        {"n": 2**100, "x": 1.5, "b": True, "z": None, "s": b"bytes"},
    ],
)
def test_any_other_shape_is_walked_to_the_same_figure(item):
    assert batch_footprint((item,)) == footprint_by_definition((item,))


def test_a_message_with_the_assemblers_keys_and_string_content_is_sized_as_a_dict_of_strings(monkeypatch):
    """The assembler's five keys are tested first (its content list fails the string test): an item with those keys
    whose content is a string is no assembler message, and is still sized as a dict of strings, without the walk."""
    batch = _decoded([{**USUAL["the assistant's message"], "content": "a string, é"}])
    expected = footprint_by_definition(batch)
    monkeypatch.setattr(item_held, "footprint", lambda value: pytest.fail(f"walked {value!r}"))
    assert batch_footprint(batch) == expected


def test_a_subclass_of_a_plain_type_is_walked_to_the_same_figure():
    class Text(str):
        pass

    class Parts(list):
        pass

    for item in ({"content": Text("x")}, {"content": Parts([{"type": "input_text"}])}, {Text("k"): "v"}):
        assert batch_footprint((item,)) == footprint_by_definition((item,))


def test_an_item_or_a_list_held_twice_is_walked_to_the_same_figure():
    """The walk counts a container once however often it is reached: a batch holding an item twice, or the
    assistant's message whose two empty lists are one list, is walked."""
    item = dict(USUAL["a user message"])
    assert batch_footprint((item, item)) == footprint_by_definition((item, item))
    empty: list[Any] = []
    part = {"type": "output_text", "text": "t", "annotations": empty, "logprobs": empty}
    message = ({**USUAL["the assistant's message"], "content": [part]},)
    assert batch_footprint(message) == footprint_by_definition(message)


def test_an_emptied_list_is_sized_with_the_room_it_keeps():
    logprobs = [{"token": "t"}] * 100
    logprobs.clear()
    part = {"type": "output_text", "text": "t", "annotations": [], "logprobs": logprobs}
    message = ({**USUAL["the assistant's message"], "content": [part]},)
    assert batch_footprint(message) == footprint_by_definition(message)


@pytest.mark.parametrize("text", ["é" * 3000, "漢" * 3000, "🙂" * 3000, "plain" * 600])
def test_a_history_counts_the_utf8_copy_its_encoding_leaves_in_a_string(text):
    """`History` encodes a batch (for its JSON size) and sizes it: a non-ASCII string holds its UTF-8 copy from
    the encoding on, so the batch is sized after it (sized before, CJK text was under-counted by ~40%)."""
    from server_shim.history import History

    batch = ({"type": "message", "role": "user", "content": text},)
    history = History(None, batch)
    assert history.items_held == footprint_by_definition(batch)
