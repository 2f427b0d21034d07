"""Events encoded from templates (`event_frames`) are byte for byte what encoding the event dicts gives.

The WebSocket sends a message's events and the Response object's from templates; HTTP and chat encode
the dicts. For generated requests, texts, log probabilities, lanes, labels, usage and outcomes, each
template's bytes are compared with `orjson.dumps` of the dict `events.py` builds for the same event,
and each parses as the SDK's typed event.
"""

from __future__ import annotations

import itertools
import time
from unittest import mock

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.wire import strict_ws_event

from server_shim import events
from server_shim.backends.base import Finish, TextDelta, ToolCallDelta, Usage
from server_shim.event_frames import ResponseFrames
from server_shim.events import EventSequence, OutputAssembler, echoed_fields, not_stored, response_object
from server_shim.requests import CreateRequest
from server_shim.tokens import account
from server_shim.turn_settings import Derived

SURROGATE = "\ud800"
json_values = st.recursive(
    st.one_of(
        st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False), st.text(max_size=5)
    ),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)),
    max_leaves=6,
)
requests = st.fixed_dictionaries(
    {"model": st.text(min_size=1, max_size=8)},
    optional={
        "instructions": st.one_of(st.none(), st.text(max_size=8)),
        "tools": st.lists(
            st.fixed_dictionaries({"type": st.just("function"), "name": st.text(max_size=4)}), max_size=2
        ),
        "store": st.booleans(),
        "temperature": st.floats(0, 2),
        "max_output_tokens": st.integers(1, 10**6),
        "metadata": st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=3),
        "text": st.fixed_dictionaries({}, optional={"verbosity": st.sampled_from(["low", "high"])}),
        "reasoning": st.fixed_dictionaries({}, optional={"effort": st.sampled_from(["low", "high"])}),
        "service_tier": st.sampled_from(["auto", "default", "flex"]),
        "prompt_cache_key": st.text(max_size=6),
        "unknown_field": json_values,
    },
)
logprob = st.fixed_dictionaries(  # as `backends.base.as_logprobs` gives them
    {
        "token": st.text(max_size=3),
        "bytes": st.lists(st.integers(0, 255), max_size=3),
        "logprob": st.floats(-9, 0),
        "top_logprobs": st.just([]),
    }
)
text_deltas = st.lists(
    st.builds(TextDelta, st.text(max_size=12), st.lists(logprob, max_size=2).map(tuple)), min_size=1, max_size=5
)
lanes = st.one_of(st.none(), st.from_regex(r"[A-Za-z0-9_.\-]{1,12}", fullmatch=True))


def _ids():
    counter = itertools.count()
    return lambda prefix: f"{prefix}_{next(counter):032x}"


def _assemble(deltas, stream_id, *, encoded, status, first=0):
    """The message's events as the assembler gives them, and its output, with ids the same from run to run."""
    seq = EventSequence(stream_id)
    seq.next = first
    assembler = OutputAssembler(seq, encoded=encoded)
    with mock.patch.object(events, "new_id", _ids()):
        sent = [event for delta in deltas for event in assembler.feed(delta)]
        sent += assembler.close(status)
    return sent, assembler


def _encoded(event):
    return event if isinstance(event, bytes) else orjson.dumps(event)


@settings(max_examples=300, deadline=None)
@given(text_deltas, lanes, st.sampled_from(["completed", "incomplete"]), st.integers(0, 10**6))
def test_a_messages_templates_write_what_its_event_dicts_encode_to(deltas, stream_id, status, first):
    plain, by_dicts = _assemble(deltas, stream_id, encoded=False, status=status, first=first)
    templated, by_templates = _assemble(deltas, stream_id, encoded=True, status=status, first=first)
    assert all(isinstance(event, bytes) for event in templated)
    assert templated == [orjson.dumps(event) for event in plain]
    assert by_templates.output == by_dicts.output
    assert by_templates.output_json == [orjson.dumps(item) for item in by_dicts.output]
    for event in templated:
        strict_ws_event(orjson.loads(event))


@settings(max_examples=300, deadline=None)
@given(
    requests,
    lanes,
    st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=2),
    text_deltas,
    st.sampled_from([None, "max_output_tokens", "steered"]),
    st.integers(0, 10**4),
    st.booleans(),
)
def test_the_response_objects_templates_write_what_its_dicts_encode_to(
    body, stream_id, labels, deltas, reason, input_tokens, stored_failed
):
    """created, in_progress and the terminal event, from one encoding of the echoed fields; a response the store
    did not take (`not_stored` changes its `store`) and tool calls are encoded whole, as before."""
    request = CreateRequest.model_validate(body)
    echoed = echoed_fields(request)
    created_at = time.time()
    seq = EventSequence(stream_id)
    frames = ResponseFrames("resp_1", int(created_at), echoed, seq)
    started = frames.started(request, labels)
    pending = response_object("resp_1", request, status="in_progress", created_at=created_at, labels=labels)
    plain = EventSequence(stream_id)
    assert started == [
        orjson.dumps(plain(kind, response=pending)) for kind in ("response.created", "response.in_progress")
    ]

    calls = [ToolCallDelta(index=0, call_id="call_1", name="f", arguments="{}")] if input_tokens % 2 else []
    _, assembler = _assemble(
        [*deltas, *calls, Usage(input_tokens, 1), Finish("stop")], stream_id, encoded=True, status="completed"
    )
    final = response_object(
        "resp_1",
        request,
        status="incomplete" if reason else "completed",
        output=assembler.output,
        usage=account(assembler.usage, None),
        incomplete_reason=reason,
        created_at=created_at,
        labels=labels,
        echoed=echoed,
    )
    if stored_failed and request.stores:
        not_stored(final, "store_unavailable")
    kind = "response.incomplete" if reason else "response.completed"
    ended = frames.ended(kind, final, assembler.output_json)
    plain.next = seq.next - (ended is not None)
    expected = orjson.dumps(plain(kind, response=final))
    assert ended is None if stored_failed and request.stores else ended == expected
    for event in [*started, expected]:
        strict_ws_event(orjson.loads(event))


@settings(max_examples=300, deadline=None)
@given(requests, *[st.sampled_from([None, "resp_a", 'resp_\u00e9"', SURROGATE])] * 2, lanes)
def test_a_derivations_echo_encoded_once_writes_what_each_turns_own_encoding_does(body, first, parent, stream_id):
    """A connection's turns with the same settings encode their echo once (`Derived.echo_json`), each splicing in its
    own `previous_response_id`: the same bytes as encoding each turn's echo, or None where that cannot be encoded."""
    derived = Derived(CreateRequest.model_validate({**body, "previous_response_id": first}))
    request = CreateRequest.model_validate({**body, "previous_response_id": parent})
    echoed = derived.echo(request)
    assert echoed == echoed_fields(request)
    for _ in range(2):  # the first turn encodes it, the next reuses it
        alone = ResponseFrames("resp_1", 1, echoed, EventSequence(stream_id)).started(request, {"l": "v"})
        memo = ResponseFrames("resp_1", 1, echoed, EventSequence(stream_id), derived).started(request, {"l": "v"})
        assert memo == alone
        assert derived.echo_json is not None
    assert alone is not None or parent == SURROGATE or derived.echo_json is False


def test_text_that_cannot_be_encoded_goes_out_as_a_dict_whose_encoding_answers_for_it():
    """A lone surrogate from a backend: the delta and the message's closing events fall back to dicts, which
    `ws_frames.encode_event` turns into an `event_encoding_failed` error event, as for any event."""
    sent, assembler = _assemble([TextDelta("ok"), TextDelta(SURROGATE)], None, encoded=True, status="completed")
    kinds = [event if isinstance(event, dict) else orjson.loads(event) for event in sent]
    assert [event["type"] for event in kinds] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    assert [isinstance(event, dict) for event in sent] == [False, False, False, True, True, True, True]
    assert [event["sequence_number"] for event in kinds] == list(range(7))
    assert assembler.output_json == []  # the Response object's output is then encoded whole


def test_a_request_whose_echo_cannot_be_encoded_starts_and_ends_as_dicts():
    request = CreateRequest.model_validate({"model": "m", "unknown_field": SURROGATE, "prompt_cache_key": SURROGATE})
    seq = EventSequence()
    frames = ResponseFrames("resp_1", 1, echoed_fields(request), seq)
    assert frames.started(request, {}) is None
    final = response_object("resp_1", request, status="completed", created_at=1)
    assert frames.ended("response.completed", final, []) is None
    assert seq.next == 0


@pytest.mark.parametrize(
    "texts",
    [
        [""],
        ["", "a"],
        ['"\\\n\t\x00\x1f/'],
        ["h\u00e9llo \u4e16\u754c \U0001f600"],
        ["x" * 100_000],
        ["a", "b" * 5000, "\u00e9"],
    ],
)
@pytest.mark.parametrize("stream_id", [None, "lane-1"])
def test_a_messages_frames_for_edge_texts_are_what_its_dicts_encode_to(texts, stream_id):
    """Empty, escaped, non-ASCII and long texts, the first delta's frame made with the message's opening ones."""
    deltas = [TextDelta(text) for text in texts]
    plain, by_dicts = _assemble(deltas, stream_id, encoded=False, status="completed")
    templated, by_templates = _assemble(deltas, stream_id, encoded=True, status="completed")
    assert templated == [orjson.dumps(event) for event in plain]
    assert by_templates.output_json == [orjson.dumps(item) for item in by_dicts.output]
    for event in templated:
        strict_ws_event(orjson.loads(event))


def test_a_first_delta_that_cannot_be_encoded_follows_the_messages_encoded_opening_as_a_dict():
    sent, assembler = _assemble([TextDelta(SURROGATE), TextDelta("ok")], None, encoded=True, status="completed")
    kinds = [event if isinstance(event, dict) else orjson.loads(event) for event in sent]
    assert [event["type"] for event in kinds][:4] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
    ]
    assert [isinstance(event, dict) for event in sent] == [False, False, True, False, True, True, True]
    assert [event["sequence_number"] for event in kinds] == list(range(7))
    assert assembler.output_json == []


@settings(max_examples=200, deadline=None)
@given(
    requests,
    st.sampled_from([None, "resp_a", 'resp_\u00e9"']),
    st.sampled_from([None, "resp_b"]),
    st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=2),
    st.sampled_from([None, "max_output_tokens"]),
    st.booleans(),
)
def test_a_response_object_copied_from_its_derivations_is_the_one_made_whole(
    body, first, parent, labels, reason, with_usage
):
    """`response_object(memo=...)` copies a Response object made once per derivation: the same keys, in the same
    order, with the same values as building it whole; the copy the memo keeps is never changed by a turn's."""
    derived = Derived(CreateRequest.model_validate({**body, "previous_response_id": first}))
    request = CreateRequest.model_validate({**body, "previous_response_id": parent})
    output = [{"id": "msg_1", "type": "message"}]
    usage = Usage(3, 1) if with_usage else None
    for _ in range(2):  # the first turn makes the template, the next copies it
        made = {
            "status": "incomplete" if reason else "completed",
            "output": output,
            "usage": usage,
            "incomplete_reason": reason,
            "created_at": 5.0,
            "labels": labels,
        }
        with mock.patch.object(time, "time", return_value=7.0):
            whole = response_object("resp_1", request, **made, echoed=derived.echo(request))
            copied = response_object("resp_1", request, **made, echoed=derived.echo(request), memo=derived)
        assert list(copied.items()) == list(whole.items())
        assert orjson.dumps(copied) == orjson.dumps(whole)
        not_stored(copied, "store_unavailable")  # what a turn may change in its own
        assert derived.response_template is not None and derived.response_template["metadata"] == {}
        assert derived.response_template["store"] is derived.echoed["store"]
