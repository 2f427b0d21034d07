"""Responses -> Chat Completions for the chat backends: the history as messages, and the request body.

Every conversion a chat backend makes from what the turn hands it lives here or in
`server_shim/tools.py` (tools and `tool_choice`, and mapping calls back), so a new item or tool
type is taught to all chat backends in one place. A `responses` upstream uses none of it.

Messages, function and custom tool calls and their outputs are rendered; every other item type
(reasoning, compaction, hosted tool calls and their results) is dropped for chat backends, which
could not have produced them and cannot read them.

A rendered prompt is immutable: `chat_prompt` extends the prompt cached for the history's
longest rendered prefix with the messages of the batches added since, and keeps each message's
JSON encoding so the backend body is a byte join, not a re-encoding of the history. The same
turns always render to the same bytes, so the backends' prefix caches hit on every turn.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import orjson
from orjson import OPT_SORT_KEYS, dumps

from ..history import History, Item
from ..tools import NAMESPACE_SEPARATOR, chat_tool_choice, chat_tools
from .base import BackendRequest, encode

Message = dict[str, Any]

RENDERING = "chat"
"""The key of the chat rendering in a `History`'s cache."""
TOOL_ROLE = b'"role":"tool"'


@dataclass(slots=True, eq=False)
class ChatPrompt:
    """The history as chat messages (instructions excluded), kept as their JSON encodings only.

    A chain of segments: each `extend` adds one segment and points at the prompt it extends,
    so the states of a conversation share their history and N turns hold O(total bytes), not
    O(N^2). A segment keeps each message's encoding (what the backend body joins) and not the
    message dict: the strings of a dict would be shared with the items, but its containers cost
    about as much again as the fragments, and only rare paths (a tokenizer, the guard simulator)
    read messages back, decoding them. Every `RUN`th segment of a chain is a `_Checkpoint`, which also
    holds the fragments of the `RUN` segments it ends: `messages`, `fragments` and the backend body
    walk the chain a step per checkpoint (and per segment after the last one), gathering the
    fragments in C. Immutable once made, though not `frozen` (a frozen dataclass sets each field
    through `object.__setattr__`: a third of what a segment cost to make, two a turn).
    """

    parent: ChatPrompt | None = field(default=None, repr=False)
    own_fragments: tuple[bytes, ...] = ()
    count: int = 0
    """Messages in the whole chain."""
    nbytes: int = 0
    """JSON bytes of the whole chain (what the backend body carries)."""
    held: int = 0
    """Memory the whole chain holds (see `footprint`), for the byte bounds of the cache and the store."""
    since: int = 0
    """Segments since the chain's last checkpoint, this one included (0: a checkpoint, or no segment)."""

    def extend(self, messages: list[Message]) -> ChatPrompt:
        if len(messages) != 1:
            return self._extend_many(messages) if messages else self
        return self._extend_one(_sized(dumps(messages[0], option=OPT_SORT_KEYS)))

    def extend_items(self, items: Sequence[Item]) -> ChatPrompt:
        """This prompt and then the messages of one batch of items (what `History.rendering` extends by)."""
        if len(items) == 1 and items[0].get("type", "message") == "message":
            return self._extend_one(_message_fragment(items[0]))  # most batches: a user's input or a reply
        return self.extend(render_items(items))

    def _extend_one(self, fragment: bytes) -> ChatPrompt:
        """A segment of one message, given as its canonical encoding (sized to fit: it is cached)."""
        size = len(fragment)  # held as `fragments_held` counts a one-message segment
        since = self.since + 1
        return (ChatPrompt if since < RUN else _checkpoint)(
            self if self.count else None,
            (fragment,),
            self.count + 1,
            self.nbytes + size + 1,
            self.held + ONE_HELD + size,
            since,
        )

    def _extend_many(self, messages: list[Message]) -> ChatPrompt:
        fragments = tuple([_sized(dumps(m, option=OPT_SORT_KEYS)) for m in messages])
        count = len(fragments)
        size = sum(map(len, fragments))
        since = self.since + 1
        return (ChatPrompt if since < RUN else _checkpoint)(
            self if self.count else None,
            fragments,
            self.count + count,
            self.nbytes + size + count,
            self.held + SEGMENT_HELD + sys.getsizeof(fragments) + count * BYTES_HELD + size,  # `fragments_held`
            since,
        )

    def _runs(self) -> list[tuple[bytes, ...]]:
        """The chain's fragments in runs, oldest first: a checkpoint's run at a time, then each segment's after
        the last checkpoint; the fragments themselves gathered in C by whoever chains the runs (a generator over
        every fragment cost twice a walk over every segment, which cost ~12 bytecodes a segment per turn)."""
        runs = []
        node: ChatPrompt | None = self
        while node is not None:
            if isinstance(node, _Checkpoint):
                runs.append(node.run)
                node = node.back
            else:
                runs.append(node.own_fragments)
                node = node.parent
        runs.reverse()
        return runs

    @property
    def messages(self) -> tuple[Message, ...]:
        """Every message, decoded from its fragment (a new dict each call)."""
        return tuple(orjson.loads(f) for f in self.fragments)

    @property
    def fragments(self) -> tuple[bytes, ...]:
        return tuple(chain.from_iterable(self._runs()))

    def __eq__(self, other: object) -> bool:
        """Equal histories: the same encoded messages (the chains may be built differently)."""
        if not isinstance(other, ChatPrompt):
            return NotImplemented
        return self.nbytes == other.nbytes and self.fragments == other.fragments

    __hash__ = None  # type: ignore[assignment]

    @property
    def own_nbytes(self) -> int:
        """JSON bytes of this segment's messages (what `nbytes` counts for them)."""
        return self.nbytes - (self.parent.nbytes if self.parent is not None else 0)

    @property
    def last_message(self) -> Message | None:
        """The newest message, decoded (a new dict each call)."""
        return orjson.loads(self.own_fragments[-1]) if self.own_fragments else None

    @property
    def last_tool_message(self) -> Message | None:
        """The newest message if it is a tool's output, else None; decoded only when its JSON could be one
        (it holds `"role":"tool"`, as every tool message's canonical encoding does). Looked for with `find`: on 3.11
        `bytes in bytes` first reads its operand as an integer, raising and clearing a TypeError (~1k instructions)."""
        if not self.own_fragments or self.own_fragments[-1].find(TOOL_ROLE) < 0:
            return None
        message: Message = orjson.loads(self.own_fragments[-1])
        return message if message["role"] == "tool" else None

    def encoded_messages(self, instructions: str | None, *, before: bytes = b"", after: bytes = b"") -> bytes:
        """The JSON array of messages, with the request's instructions as the leading system message, between
        `before` and `after` (the rest of a body): the whole history is copied once, by one join."""
        items = [encode({"content": instructions, "role": "system"})] if instructions else []
        items.extend(chain.from_iterable(self._runs()))
        if not items:
            return before + b"[]" + after
        items[0] = before + b"[" + items[0]
        items[-1] += b"]" + after
        return b",".join(items)


RUN = 32
"""Every 32nd segment of a chain is a checkpoint: a walk over N segments takes N/32 steps and at most 31 more."""


@dataclass(slots=True, eq=False)
class _Checkpoint(ChatPrompt):
    """A segment that also holds the fragments of the `RUN` segments it ends (its own last), and the checkpoint
    before them: references to fragments the chain holds anyway, one tuple per `RUN` segments."""

    run: tuple[bytes, ...] = ()
    back: ChatPrompt | None = field(default=None, repr=False)
    """The previous checkpoint (None: the chain's first `RUN` segments)."""


def _checkpoint(
    parent: ChatPrompt | None, fragments: tuple[bytes, ...], count: int, nbytes: int, held: int, since: int
) -> ChatPrompt:
    """The segment that ends a run (`since` == `RUN`), as a `_Checkpoint`: it walks back over the run once, and
    holds (counted in `held`) the larger object and the tuple of the run's fragments."""
    runs = [fragments]
    node = parent
    while node is not None and node.since:
        runs.append(node.own_fragments)
        node = node.parent
    runs.reverse()
    run = tuple(chain.from_iterable(runs))
    held += CHECKPOINT_HELD - SEGMENT_HELD + sys.getsizeof(run)
    return _Checkpoint(parent, fragments, count, nbytes, held, 0, run, node)


SEGMENT_HELD = sys.getsizeof(ChatPrompt())
"""The segment object itself, beside its fragments."""
CHECKPOINT_HELD = sys.getsizeof(_Checkpoint())
"""A checkpoint segment object itself, beside its fragments and its run."""

EMPTY = ChatPrompt()
"""The rendering of no items, where every history's rendering starts."""


BYTES_HELD = b"".__sizeof__()
"""What a `bytes` object takes beside its bytes (`bytes.__sizeof__` is this plus its length)."""

ONE_HELD = SEGMENT_HELD + sys.getsizeof((b"",)) + BYTES_HELD
"""A segment of one message, beside the message's bytes."""


def fragments_held(fragments: tuple[bytes, ...]) -> int:
    """`footprint(fragments)` without its walk: the tuple (with its collector header, as `sys.getsizeof`
    counts it) and each fragment, which is exactly `bytes`."""
    return sys.getsizeof(fragments) + sum(map(bytes.__sizeof__, fragments))


def chat_prompt(history: History) -> ChatPrompt:
    """The history's chat rendering: the cached one for its longest rendered prefix, extended by the rest."""
    return history.rendering(RENDERING, EMPTY, ChatPrompt.extend_items)


def chat_tools_and_choice(request: BackendRequest) -> tuple[list[dict[str, Any]] | None, Any]:
    """The chat tools to send and the chat `tool_choice` (the turn has checked both)."""
    tools = request.chat_tools if request.chat_tools is not None else chat_tools(request.tools)
    return chat_tool_choice(request.tool_choice, tools)


def chat_body(
    request: BackendRequest,
    prompt: ChatPrompt,
    tools: list[dict[str, Any]] | None,
    choice: Any,
    *,
    stream: bool = True,
    extra: dict[str, Any] | None = None,
) -> bytes:
    """The Chat Completions JSON body (tools and choice from `chat_tools_and_choice`, maybe adjusted);
    the history is joined from the prompt's cached bytes."""
    fields: dict[str, Any] = {"model": request.model, "stream": stream, **request.options}
    if stream:
        fields["stream_options"] = {"include_usage": True}
    if tools:
        fields["tools"] = tools
        if choice is not None:
            fields["tool_choice"] = choice
    if request.max_output_tokens is not None:
        fields["max_tokens"] = request.max_output_tokens
    if extra:
        fields.update(extra)
    head = encode(fields)
    return prompt.encoded_messages(request.instructions, before=head[:-1] + b',"messages":', after=b"}")


@dataclass(slots=True)
class _Renderer:
    messages: list[Message] = field(default_factory=list)

    def add(self, item: Item) -> None:
        kind = item.get("type", "message")
        if kind == "message":
            self._message(item)
        elif kind == "function_call":
            self._call(item, item["arguments"])
        elif kind == "custom_tool_call":
            self._call(item, encode({"input": item["input"]}).decode())
        elif kind in ("function_call_output", "custom_tool_call_output"):
            output = item["output"]
            content = output if isinstance(output, str) else _text_of(output)
            self.messages.append({"content": content, "role": "tool", "tool_call_id": item["call_id"]})

    def _message(self, item: Item) -> None:
        self.messages.append(_chat_message(item))

    def _call(self, item: Item, arguments: str) -> None:
        """A function or custom tool call as an assistant tool call, named as `tools.chat_tools` names it."""
        name = item["name"] if not item.get("namespace") else f"{item['namespace']}{NAMESPACE_SEPARATOR}{item['name']}"
        call = {
            "function": {"arguments": arguments, "name": name},
            "id": item["call_id"],
            "type": "function",
        }
        last = self.messages[-1] if self.messages else None
        if last is not None and last["role"] == "assistant" and isinstance(last.get("content"), str):
            last.setdefault("tool_calls", []).append(call)
            return
        self.messages.append({"content": "", "role": "assistant", "tool_calls": [call]})


def _sized(encoded: bytes) -> bytes:
    """orjson's output copied to its size: orjson over-allocates (4 KiB for a small message), and fragments are
    cached."""
    return bytes(memoryview(encoded))


_CONTENT_KEY = b'{"content":'
_CHAT_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
"""Each item role a message usually has, and its chat role (as `_chat_message` maps it)."""
_ROLE_TAILS = {role: b',"role":' + encode(chat_role) + b"}" for role, chat_role in _CHAT_ROLES.items()}
"""The rest of a text message's canonical encoding after its content, by item role (keys sort `content`, `role`)."""


def _message_fragment(item: Item) -> bytes:
    """`encode(_chat_message(item))`, sized to fit. A message whose content is text (a string, or one text part as
    `_chat_content` reads it) and whose role is one of the four is written as its content's JSON between the keys'
    bytes: no message dict, and one copy (the concatenation) where an encoded dict needs a second (`_sized`); on a
    chained turn, both of its batches. Any other message the long way, to the same bytes."""
    content = item["content"]
    if type(content) is list and len(content) == 1 and content[0].get("type") in _TEXT_PARTS:
        part = content[0]
        content = part.get("text") or part.get("refusal") or ""
    role = item["role"]
    tail = _ROLE_TAILS.get(role) if type(role) is str else None
    if tail is None or type(content) is not str:
        return _sized(dumps(_chat_message(item), option=OPT_SORT_KEYS))
    return _CONTENT_KEY + dumps(content) + tail


def _chat_message(item: Item) -> Message:
    role = item["role"]
    content = item["content"]
    if role == "developer":
        role = "system"
    if isinstance(content, list):
        content = _chat_content(content)
    return {"content": content, "role": role}


def render_items(items: Sequence[Item]) -> list[Message]:
    """Chat messages for a batch of items; consecutive calls join the assistant message before them."""
    if len(items) == 1 and items[0].get("type", "message") == "message":
        return [_chat_message(items[0])]  # most batches: a user's input or a reply, one message
    renderer = _Renderer()
    for item in _outputs_first(items):
        renderer.add(item)
    return renderer.messages


_OUTPUTS = frozenset({"function_call_output", "custom_tool_call_output"})
_CALLS = frozenset({"function_call", "custom_tool_call"})
_RENDERED = frozenset({"message", *_CALLS, *_OUTPUTS})


def renders(items: Sequence[Item]) -> bool:
    """Whether `render_items(items)` has any message (every other item type is dropped), without rendering."""
    for item in items:  # noqa: SIM110 - not any() over a generator: asked every simulated turn, most batches one item
        if item.get("type", "message") in _RENDERED:
            return True
    return False


def _outputs_first(items: Sequence[Item]) -> Sequence[Item]:
    """User messages between tool calls (or a batch's start) and their outputs go after the outputs.

    That is the shape of steering input prepended to a continuation (`response.steer` pending):
    the item order stays as the API defines it, but a chat model needs each tool message right
    after the assistant message that made the call.
    """
    for item in items:  # a loop, not `any()` over a generator: most batches are one item
        if item.get("type") in _OUTPUTS:
            break
    else:
        return items
    ordered: list[Item] = []
    index = 0
    while index < len(items):
        start = index
        if index == 0 or items[index - 1].get("type") in _CALLS:
            while index < len(items) and _is_user(items[index]):
                index += 1
        end = index
        while end < len(items) and index > start and items[end].get("type") in _OUTPUTS:
            end += 1
        if end > index:
            ordered.extend([*items[index:end], *items[start:index]])
            index = end
        else:
            ordered.extend(items[start : index + 1])
            index += 1
    return ordered


def _is_user(item: Item) -> bool:
    return item.get("type", "message") == "message" and item.get("role") == "user"


_TEXT_PARTS = frozenset({"input_text", "output_text", "refusal"})


def _chat_content(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    if len(parts) == 1 and parts[0].get("type") in _TEXT_PARTS:  # most contents: one text part, as `_text_of` reads it
        return parts[0].get("text") or parts[0].get("refusal") or ""
    for part in parts:  # a loop, not `all()` over a generator: most contents are one text part
        if part.get("type") not in _TEXT_PARTS:
            break
    else:
        return _text_of(parts)
    chat_parts: list[dict[str, Any]] = []
    for part in parts:
        kind = part.get("type")
        if kind in ("input_text", "output_text"):
            chat_parts.append({"text": part["text"], "type": "text"})
        elif kind == "input_image":
            chat_parts.append({"image_url": {"url": part.get("image_url") or part.get("file_id")}, "type": "image_url"})
        elif kind == "input_file":
            chat_parts.append({"file": {k: v for k, v in part.items() if k != "type"}, "type": "file"})
    return chat_parts


def _text_of(parts: list[Any]) -> str:
    texts = []
    for part in parts:
        if isinstance(part, dict):
            texts.append(part.get("text") or part.get("refusal") or "")
        elif isinstance(part, str):
            texts.append(part)
    return "".join(texts)
