"""Token accounting per turn, counted incrementally: only the messages a turn adds are tokenized.

Each response keeps the token count of its prompt through its own input (`ResponseState.tokens`).
The next turn counts the previous response's output and its own new input, and reports

    input_tokens  = previous count + previous output + new input (+ the instructions)
    cached_tokens = previous count + previous output   (the unchanged prefix a backend cache reuses)

A turn without `previous_response_id` counts its whole history and reports no cached tokens.

Counters, per deployment (`tokenizer` in the config file):
- `estimate` (default): UTF-8 bytes of each message's JSON encoding / 4, the same rule the shim
  uses when a backend reports no usage; free (the encodings are cached), not exact;
- `llama.cpp` (`POST /tokenize`), `llama-cpp-python` (`POST /extras/tokenize`), `vllm`
  (`POST /tokenize`): the backend's own tokenizer on each message's text (content, tool call
  names and arguments), plus `template_tokens_per_message` for the chat template's wrapping.
  Exact for the text; the template's share is what you configure.

Which figure the client sees: a backend that reports real usage keeps its `input_tokens`, and the
counted prefix fills `cached_tokens` when the backend reports none; when the backend's usage is an
estimate (llama.cpp sends none), the counted figures replace it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

import httpx2
import orjson

from .backends.base import Usage
from .backends.chat_convert import chat_prompt, render_items
from .errors import BackendError

if TYPE_CHECKING:
    from .config import DeploymentConfig
    from .state import ResponseState

log = logging.getLogger(__name__)
Message = dict[str, Any]


class TokenCounter(Protocol):
    name: str
    exact: bool

    async def count(self, messages: Sequence[Message]) -> int: ...


def message_text(message: Message) -> str:
    """What a tokenizer sees of a chat message: its text, and its tool calls' names and arguments."""
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
    pieces = [content or ""]
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        pieces.append(f"{function.get('name', '')}{function.get('arguments', '')}")
    return "".join(pieces)


class EstimateCounter:
    """Bytes of each message's JSON encoding / 4 (at least 1 per message): the documented estimate."""

    name = "estimate"
    exact = False

    async def count(self, messages: Sequence[Message]) -> int:
        return sum(max(1, len(orjson.dumps(message)) // 4) for message in messages)


FLAVORS = {
    "llama.cpp": ("/tokenize", lambda model, text: {"content": text, "add_special": False}),
    "llama-cpp-python": ("/extras/tokenize", lambda model, text: {"input": text}),
    "vllm": ("/tokenize", lambda model, text: {"model": model, "prompt": text, "add_special_tokens": False}),
}


class TokenizeCounter:
    """The backend's own tokenizer over HTTP, one request per message, concurrently."""

    exact = True

    def __init__(
        self, flavor: str, root_url: str, *, model: str | None = None, per_message: int = 0, timeout_s: float = 5.0
    ) -> None:
        if flavor not in FLAVORS:
            raise ValueError(f"tokenizer {flavor!r}: choose from estimate, {', '.join(FLAVORS)}")
        self.name = flavor
        self.path, self._body = FLAVORS[flavor]
        self.root_url = root_url.rstrip("/")
        self.model = model
        self.per_message = per_message
        self._client = httpx2.AsyncClient(timeout=timeout_s)
        self._added: int | None = None
        """Tokens the endpoint adds to any text (a BOS llama-cpp-python always prepends), subtracted."""

    async def count(self, messages: Sequence[Message]) -> int:
        if self._added is None:
            self._added = await self._tokens("")
        counts = await asyncio.gather(*(self._tokens(message_text(m)) for m in messages))
        return sum(max(0, n - self._added) + self.per_message for n in counts)

    async def _tokens(self, text: str) -> int:
        try:
            reply = await self._client.post(self.root_url + self.path, json=self._body(self.model, text))
            reply.raise_for_status()
            body = reply.json()
        except (httpx2.HTTPError, ValueError) as exc:
            raise BackendError(f"tokenizer {self.name} at {self.root_url}: {exc}") from exc
        return int(body["count"]) if "count" in body else len(body["tokens"])

    async def aclose(self) -> None:
        await self._client.aclose()


def root_of(base_url: str) -> str:
    """Tokenize endpoints live beside `/v1`, not under it."""
    base = base_url.rstrip("/")
    return base[: -len("/v1")] if base.endswith("/v1") else base


@dataclass(frozen=True, slots=True)
class Counted:
    input_tokens: int
    cached_tokens: int
    through: tuple[str, int]
    """(counter name, tokens of the prompt through this turn's input): what the response keeps."""


async def turn_tokens(
    counter: TokenCounter,
    previous: Sequence[Any] | None,
    prefix: Callable[[], Sequence[Message]],
    prior_output: Sequence[Message],
    new_input: Sequence[Message],
    instructions: str | None,
) -> Counted:
    """Count one turn: only `prior_output` and `new_input` when the previous response has a count.

    `previous` is the previous response's `(counter name, tokens)`; when it is missing or was
    counted by another counter, `prefix()` (every message before this turn) is counted in full once.
    """
    if previous is not None and previous[0] == counter.name:
        cached = previous[1] + await counter.count(prior_output)
    else:
        messages = prefix()
        cached = await counter.count(messages) if messages else 0
    through = cached + await counter.count(new_input)
    extra = await counter.count([{"role": "system", "content": instructions}]) if instructions else 0
    return Counted(through + extra, cached, (counter.name, through))


def account(usage: Usage | None, counted: Counted | None) -> Usage | None:
    """The usage the client sees: the backend's where it is real, the counted figures where it is not."""
    if usage is None or counted is None:
        return usage
    if usage.estimated:
        return replace(
            usage, input_tokens=counted.input_tokens, cached_tokens=counted.cached_tokens
        )  # output still estimated
    if usage.cached_tokens == 0:
        return replace(usage, cached_tokens=min(counted.cached_tokens, usage.input_tokens))
    return usage


class TokenCount:
    """One turn's count, run beside inference; a tokenizer that fails leaves the backend's figures."""

    def __init__(self, task: asyncio.Task[Counted] | None) -> None:
        self._task = task

    @classmethod
    def start(
        cls,
        counter: TokenCounter | None,
        previous: ResponseState | None,
        new: Sequence[Message],
        instructions: str | None,
    ) -> TokenCount:
        if counter is None:
            return NOT_COUNTED
        prior_output: Sequence[Message] = ()
        if previous is not None and previous.output_items:
            prior_output = render_items(previous.output_items)  # the previous response's output, as chat messages
        prefix = (lambda: list(chat_prompt(previous.history).messages)) if previous is not None else list
        work = turn_tokens(counter, previous.tokens if previous else None, prefix, prior_output, new, instructions)
        return cls(asyncio.get_running_loop().create_task(work))

    async def result(self) -> Counted | None:
        if self._task is None:
            return None
        try:
            return await self._task
        except BackendError as exc:
            log.warning("token count failed, the backend's usage stands: %s", exc)
            return None

    def done(self) -> Counted | None:
        """The count if it has already finished (a turn cut short does not wait for it)."""
        task = self._task
        if task is None or not task.done() or task.cancelled() or task.exception() is not None:
            return None
        return task.result()

    def cancel(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()


NOT_COUNTED = TokenCount(None)
"""A count of nothing, shared: every turn without a tokenizer (the usual case) gets it, not an object of its own
(it holds no task; nothing changes it)."""


def counters_by_model(deployments: Sequence[DeploymentConfig]) -> dict[str, TokenizeCounter]:
    """A tokenizer per model alias, from the highest-priority deployment of that alias that names one."""
    counters: dict[str, TokenizeCounter] = {}
    for deployment in sorted(deployments, key=lambda d: -d.priority):
        if deployment.tokenizer == "estimate":
            continue
        root = deployment.tokenizer_url or root_of(deployment.base_url or "")
        for alias, model in deployment.models.items():
            if alias not in counters:
                counters[alias] = TokenizeCounter(
                    deployment.tokenizer, root, model=model, per_message=deployment.template_tokens_per_message
                )
    return counters


async def whole_prompt_tokens(
    counter: TokenCounter, messages: Sequence[Message], instructions: str | None
) -> int | None:
    """A whole conversation counted at once (the `input_tokens` route); None when the tokenizer fails."""
    try:
        counted = await turn_tokens(counter, None, list, (), messages, instructions)
    except BackendError as exc:
        log.warning("token count failed, estimating instead: %s", exc)
        return None
    return counted.input_tokens
