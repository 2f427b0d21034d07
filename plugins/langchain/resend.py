"""The resend after a lost chain: one rule (`full_history_kwargs`) and thin drivers for each call shape.

A request that continued a response (`previous_response_id`) fails with `previous_response_not_found`
when the server no longer holds that response (a reconnect with `store=False`, cache eviction).
Nothing is lost: the call is made once more with the whole history, as over HTTP. A stream is
resent only when it fails before its first chunk, which is where that error comes.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, TypeVar

import openai

log = logging.getLogger("plugins.langchain")

T = TypeVar("T")
Kwargs = dict[str, Any]

FULL_HISTORY = "_responses_ws_full_history"
"""Private call keyword: build this request from the whole history (the resend after a lost chain)."""


MayResend = Callable[[BaseException, Kwargs], bool]
"""The model's say on whether this error, for a call with these keywords, is a chain it may resend."""


def lost_chain(error: BaseException) -> bool:
    """Whether the server no longer holds the `previous_response_id` a request named."""
    return isinstance(error, openai.BadRequestError) and error.code == "previous_response_not_found"


def full_history_kwargs(may_resend: MayResend, error: BaseException, kwargs: Kwargs) -> Kwargs:
    """The keywords of the resend with the full history; raises `error` again when it must not be resent."""
    if not may_resend(error, kwargs):
        raise error
    log.debug("plugins.langchain: %s; resending with the full history", getattr(error, "code", error))
    return {**kwargs, FULL_HISTORY: True}


def call(may_resend: MayResend, send: Callable[[Kwargs], T], kwargs: Kwargs) -> T:
    try:
        return send(kwargs)
    except openai.BadRequestError as error:
        return send(full_history_kwargs(may_resend, error, kwargs))


async def acall(may_resend: MayResend, send: Callable[[Kwargs], Awaitable[T]], kwargs: Kwargs) -> T:
    try:
        return await send(kwargs)
    except openai.BadRequestError as error:
        return await send(full_history_kwargs(may_resend, error, kwargs))


def stream(may_resend: MayResend, send: Callable[[Kwargs], Iterator[T]], kwargs: Kwargs) -> Iterator[T]:
    chunks = send(kwargs)
    try:
        first = next(chunks)
    except StopIteration:
        return iter(())
    except openai.BadRequestError as error:
        return send(full_history_kwargs(may_resend, error, kwargs))
    return itertools.chain([first], chunks)


async def astream(
    may_resend: MayResend, send: Callable[[Kwargs], AsyncIterator[T]], kwargs: Kwargs
) -> AsyncIterator[T]:
    chunks = send(kwargs)
    try:
        first = await anext(chunks)
    except StopAsyncIteration:
        return
    except openai.BadRequestError as error:
        chunks = send(full_history_kwargs(may_resend, error, kwargs))
    else:
        yield first
    async for chunk in chunks:
        yield chunk
