"""Chat Completions requests as Responses requests: parameters, messages, and the chaining rule. No I/O.

Most frameworks call `chat.completions.create` with the whole message list every turn. To ride
a WebSocket session, a call becomes a `response.create`: its parameters and messages are
translated here, and `ChatBook` finds the answered turn the messages continue, so only the
messages after that turn's answer go out, with its `previous_response_id`.

A call is translated only when the translation is faithful; otherwise `Untranslatable` names
the reason and the call goes over HTTP unchanged. The other direction (Responses output and
events back to `ChatCompletion` / `ChatCompletionChunk`) is in `chat_replies.py`.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from chat_mapping import Unmapped, as_dict, message_items, messages_to_items, tool, tool_choice

Message = Mapping[str, Any]

COPIED = (
    "model",
    "temperature",
    "top_p",
    "parallel_tool_calls",
    "metadata",
    "prompt_cache_key",
    "prompt_cache_retention",
    "safety_identifier",
    "service_tier",
    "user",
)
"""Parameters with the same name and meaning in both APIs."""

NO_EQUIVALENT = (
    "audio",
    "frequency_penalty",
    "function_call",
    "functions",
    "logit_bias",
    "moderation",
    "prediction",
    "presence_penalty",
    "prompt_cache_options",
    "seed",
    "stop",
    "web_search_options",
)
"""Parameters the Responses API lacks (or shapes differently): a call setting one goes over HTTP."""

REQUEST_ONLY = frozenset({"messages", "stream", "stream_options", "extra_headers", "extra_query", "timeout"})

LOGPROBS_INCLUDE = "message.output_text.logprobs"
"""The Responses `include` entry that asks for the output text's log probabilities (chat `logprobs: true`)."""

MIN_OUTPUT_TOKENS = 16
"""The Responses API refuses `max_output_tokens` below this; a smaller chat limit stays on HTTP."""


Untranslatable = Unmapped
"""This call cannot be sent as a Responses request without changing its meaning; `reason` says why."""


@dataclass(frozen=True, slots=True)
class ChatCall:
    """A `chat.completions.create` call translated: Responses fields (no input), and how to answer."""

    fields: dict[str, Any]
    messages: list[Any]
    stream: bool
    include_usage: bool


def translate_call(kwargs: Mapping[str, Any]) -> ChatCall:
    """The Responses request for `chat.completions.create(**kwargs)` (given arguments only); raises `Untranslatable`."""
    given = {k: v for k, v in kwargs.items() if v is not None}
    _check_unsupported(given)
    fields: dict[str, Any] = {k: given[k] for k in COPIED if k in given}
    fields["store"] = given.get("store") is True  # chat completions are not stored unless asked
    limit = given.get("max_completion_tokens", given.get("max_tokens"))
    if limit is not None:
        if limit < MIN_OUTPUT_TOKENS:
            raise Untranslatable(f"max_tokens below {MIN_OUTPUT_TOKENS}, the Responses API minimum")
        fields["max_output_tokens"] = limit
    if given.get("logprobs"):  # the output text's log probabilities, as the Responses API asks for them
        fields["include"] = [LOGPROBS_INCLUDE]
        if "top_logprobs" in given:
            fields["top_logprobs"] = given["top_logprobs"]
    if "reasoning_effort" in given:
        fields["reasoning"] = {"effort": given["reasoning_effort"]}
    text = _text_config(given)
    if text:
        fields["text"] = text
    if "tools" in given:
        fields["tools"] = [tool(t) for t in given["tools"]]
    if "tool_choice" in given:
        fields["tool_choice"] = tool_choice(given["tool_choice"])
    stream_options = given.get("stream_options") or {}
    stream = given.get("stream") is True
    if stream and "include_obfuscation" in stream_options:
        fields["stream_options"] = {"include_obfuscation": stream_options["include_obfuscation"]}
    messages = given.get("messages")
    if not isinstance(messages, list):
        messages = list(messages or ())
    return ChatCall(fields, messages, stream, stream and stream_options.get("include_usage") is True)


def _check_unsupported(given: Mapping[str, Any]) -> None:
    for name in NO_EQUIVALENT:
        if name in given:
            raise Untranslatable(name)
    if given.get("n", 1) != 1:
        raise Untranslatable("n > 1")
    if "top_logprobs" in given and not given.get("logprobs"):
        raise Untranslatable("top_logprobs without logprobs")
    if any(m != "text" for m in given.get("modalities") or ()):
        raise Untranslatable("modalities")
    if given.get("extra_body"):
        raise Untranslatable("extra_body")
    unknown = given.keys() - REQUEST_ONLY - {"n", "logprobs", "modalities", "extra_body", "store"}
    unknown -= {
        "max_tokens",
        "max_completion_tokens",
        "reasoning_effort",
        "response_format",
        "verbosity",
        "top_logprobs",
    }
    unknown -= {"tools", "tool_choice", *COPIED}
    if unknown:
        raise Untranslatable(f"unknown parameter {sorted(unknown)[0]}")


def _text_config(given: Mapping[str, Any]) -> dict[str, Any]:
    text: dict[str, Any] = {}
    response_format = given.get("response_format")
    if response_format is not None:
        kind = response_format.get("type")
        if kind == "json_schema":
            schema = response_format.get("json_schema") or {}
            text["format"] = {"type": "json_schema", **schema}
        elif kind in ("json_object", "text"):
            text["format"] = {"type": kind}
        else:
            raise Untranslatable(f"response_format {kind}")
    if "verbosity" in given:
        text["verbosity"] = given["verbosity"]
    return text


def normalize(message: Any) -> tuple[Any, ...]:
    """What a message says, independent of how a framework rebuilt it: dict or SDK object, `None` or
    empty content, tool-call arguments re-serialized with other spacing or key order."""
    m = as_dict(message)
    content = m.get("content")
    if isinstance(content, list):
        texts = [str(p.get("text")) for p in content if isinstance(p, Mapping) and p.get("type") == "text"]
        content = "".join(texts) if len(texts) == len(content) else orjson.dumps(content, option=orjson.OPT_SORT_KEYS)
    calls = tuple(
        (c.get("id"), c["function"]["name"], _canonical_arguments(c["function"]["arguments"]))
        for c in m.get("tool_calls") or ()
    )
    return (m.get("role"), content or "", calls, m.get("tool_call_id"), m.get("name"))


def _canonical_arguments(arguments: Any) -> Any:
    try:
        return orjson.dumps(orjson.loads(arguments), option=orjson.OPT_SORT_KEYS)
    except (orjson.JSONDecodeError, TypeError):
        return arguments


@dataclass(slots=True)
class ChatTurn:
    """An answered call: its fields, its messages, the answer the caller got, and the server state it left."""

    fields: dict[str, Any]
    messages: list[Any]
    normalized: list[tuple[Any, ...]]
    answer: tuple[Any, ...]
    response_id: str
    link: Any = None
    """What the transport needs to continue this turn (its chain); opaque here."""
    items: list[dict[str, Any]] | None = None
    """`messages` and the answer as Responses items: the next call's prefix, so the answered history is
    never translated again. None when the answer has no Responses form (the next call then tries itself)."""


@dataclass(slots=True)
class ChatPlan:
    """A call split against the answered turns: with `turn`, only `messages[start:]` are new."""

    call: ChatCall
    turn: ChatTurn | None
    start: int
    normalized: list[tuple[Any, ...] | None]
    items: list[dict[str, Any]] = field(default_factory=list)
    """Every message as Responses items: the answered turn's items, then the new messages'."""
    new_items: list[dict[str, Any]] = field(default_factory=list)
    """The new messages as Responses items: what a chained request sends."""

    @property
    def new_messages(self) -> list[Any]:
        return self.call.messages[self.start :]


@dataclass
class ChatBook:
    """Answered chat turns a session can continue, least recently used dropped first; thread-safe.

    The rule: the call names the same model as a turn, its messages start with that turn's
    messages followed by that turn's answer (as the caller appended it back), and something
    follows. Other fields (tools, temperature, ...) may change: they belong to each request, and
    the conversation, system messages included, is all in the chained items.
    """

    capacity: int = 64
    _turns: OrderedDict[str, ChatTurn] = field(default_factory=OrderedDict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __len__(self) -> int:
        return len(self._turns)

    def plan(self, call: ChatCall) -> ChatPlan:
        messages = call.messages
        normalized: list[tuple[Any, ...] | None] = [None] * len(messages)
        with self._lock:
            candidates = list(reversed(self._turns.values()))
        for turn in candidates:
            start = len(turn.messages) + 1
            same_model = turn.fields.get("model") == call.fields.get("model")
            if start < len(messages) and same_model and self._continues(turn, messages, normalized):
                with self._lock:
                    if turn.response_id in self._turns:
                        self._turns.move_to_end(turn.response_id)
                return _planned(call, turn, start, normalized)
        return _planned(call, None, 0, normalized)

    def record(self, plan: ChatPlan, answer: Message, response_id: str, link: Any) -> ChatTurn:
        """Remember a completed call; it replaces the turn it continued.

        Only the new messages and the answer are normalized and translated here: the answered
        prefix's forms are the continued turn's, so the work per call does not grow with the history.
        """
        messages = plan.call.messages
        known = [*plan.turn.normalized, plan.turn.answer] if plan.turn is not None else []
        fresh = zip(plan.normalized[len(known) :], messages[len(known) :], strict=True)
        normalized = known + [n if n is not None else normalize(m) for n, m in fresh]
        try:
            items: list[dict[str, Any]] | None = [*plan.items, *message_items(as_dict(answer))]
        except Unmapped:
            items = None
        turn = ChatTurn(plan.call.fields, list(messages), normalized, normalize(answer), response_id, link, items)
        with self._lock:
            if plan.turn is not None:
                self._turns.pop(plan.turn.response_id, None)
            self._turns[response_id] = turn
            while len(self._turns) > self.capacity:
                self._turns.popitem(last=False)
        return turn

    def forget(self, turn: ChatTurn | None) -> None:
        if turn is not None:
            with self._lock:
                self._turns.pop(turn.response_id, None)

    @staticmethod
    def _continues(turn: ChatTurn, messages: list[Any], normalized: list[tuple[Any, ...] | None]) -> bool:
        n = len(turn.messages)
        if _normalized(messages, n, normalized) != turn.answer:
            return False
        for i in range(n - 1, -1, -1):  # newest first: a rewritten history differs near its end
            if not _same(messages[i], turn.messages[i]) and _normalized(messages, i, normalized) != turn.normalized[i]:
                return False
        return True


def _same(message: Any, answered: Any) -> bool:
    """The cheap checks first: the very object (a caller appending to one list), or an equal plain dict
    (a framework rebuilding its messages each call); `normalize` only when both fail."""
    return message is answered or (type(message) is dict and type(answered) is dict and message == answered)


def _planned(call: ChatCall, turn: ChatTurn | None, start: int, normalized: list[Any]) -> ChatPlan:
    """The plan with its items: the answered turn's items reused, only the new messages translated."""
    new_items = messages_to_items(call.messages[start:])
    known = turn.items if turn is not None else []
    prefix = known if known is not None else messages_to_items(call.messages[:start])
    return ChatPlan(call, turn, start, normalized, [*prefix, *new_items], new_items)


def _normalized(messages: list[Any], index: int, cache: list[tuple[Any, ...] | None]) -> tuple[Any, ...]:
    value = cache[index]
    if value is None:
        value = cache[index] = normalize(messages[index])
    return value
