"""The conversation as Responses items: batches shared along a chain, renderings continued, never redone."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from server_shim.backends.chat_convert import chat_prompt
from server_shim.history import History


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text}


def reply(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}


class CountingRenderer:
    """A renderer that records every batch it is asked to render."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []

    def __call__(self, rendering: tuple[str, ...], batch: Any) -> tuple[str, ...]:
        texts = [str(item["content"]) for item in batch]
        self.batches.append(texts)
        return rendering + tuple(texts)


def test_extending_shares_the_parent_and_keeps_items_in_order() -> None:
    first = History().extend([user("a")])
    second = first.extend([reply("b")]).extend([user("c")])
    assert [item["content"] for item in second.items[::2]] == ["a", "c"]
    assert second.parent is not None and second.parent.parent is first, "a chain of batches, not copies"
    assert (len(second), second.batches) == (3, 3)
    assert second.after(1) == (reply("b"), user("c"))
    assert first.extend([]) is first


def test_a_renderer_sees_only_the_batches_added_since_the_cached_rendering() -> None:
    render = CountingRenderer()
    turn1 = History().extend([user("a")])
    assert turn1.rendering("r", (), render) == ("a",)
    turn2 = turn1.extend([reply("b")]).extend([user("c")])
    assert turn2.rendering("r", (), render) == ("a", "[{'type': 'output_text', 'text': 'b'}]", "c")
    assert turn2.rendering("r", (), render) is turn2.rendering("r", (), render), "cached"
    assert [len(batch) for batch in render.batches] == [1, 1, 1], "each batch rendered once, batch by batch"


def test_the_same_batches_render_to_the_same_bytes_whatever_was_cached() -> None:
    batches = [[user("find 1")], [reply("Looking.")], [user("and 2")], [reply("Done.")]]
    incremental = History()
    for batch in batches:
        incremental = incremental.extend(batch)
        chat_prompt(incremental)  # a chat backend rendering on every turn
    rebuilt = History.from_batches(batches)  # from the Redis store: nothing cached
    assert rebuilt == incremental
    assert chat_prompt(rebuilt).encoded_messages("sys") == chat_prompt(incremental).encoded_messages("sys")


def test_the_memory_held_counts_items_and_their_cached_rendering() -> None:
    history = History().extend([user("x" * 10_000)])
    items_only = history.held
    assert items_only == history.items_held > 10_000
    chat_prompt(history)
    assert history.held > items_only + 10_000, "the rendering (message and its JSON) held on top of the items"


json_items = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.dictionaries(st.text(max_size=10), json_items, max_size=5), max_size=4), max_size=4))
def test_the_json_size_is_each_items_encoding_and_a_byte(batches: list[list[dict[str, Any]]]) -> None:
    """`nbytes` (what token estimates read) is taken from one encoding of the batch as an array: the same figure as
    encoding each item apart and counting a byte between items, whatever the items hold."""
    history = History.from_batches(batches)
    assert history.nbytes == sum(len(orjson.dumps(item)) + 1 for batch in batches for item in batch)
    assert History(None, ()).nbytes == 0
