"""`plugins.langchain.resend`: the resend after a lost chain, driven with plain functions (no model, no server).

The end-to-end path (a real agent whose chain the shim lost) is in `test_plugins_langchain.py`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx2
import openai
import pytest

from plugins.langchain import resend
from plugins.langchain.resend import FULL_HISTORY


def bad_request(code: str) -> openai.BadRequestError:
    request = httpx2.Request("POST", "http://127.0.0.1/v1/responses")
    response = httpx2.Response(400, request=request)
    return openai.BadRequestError(code, response=response, body={"code": code, "message": code})


LOST = bad_request("previous_response_not_found")


class Calls:
    """A call that fails with `error` while the request is chained, and answers once it is in full."""

    def __init__(self, error: openai.BadRequestError) -> None:
        self.error = error
        self.seen: list[dict[str, Any]] = []

    def __call__(self, kwargs: dict[str, Any]) -> str:
        self.seen.append(kwargs)
        if not kwargs.get(FULL_HISTORY):
            raise self.error
        return "answer"

    def stream(self, kwargs: dict[str, Any]) -> Iterator[str]:
        self.seen.append(kwargs)
        if not kwargs.get(FULL_HISTORY):
            raise self.error
        yield from ("a", "b")

    async def astream(self, kwargs: dict[str, Any]) -> AsyncIterator[str]:
        for chunk in self.stream(kwargs):
            yield chunk


def always(error: BaseException, kwargs: dict[str, Any]) -> bool:
    return resend.lost_chain(error)


def never(error: BaseException, kwargs: dict[str, Any]) -> bool:
    return False


def test_a_lost_chain_is_called_again_with_the_full_history_once() -> None:
    calls = Calls(LOST)
    assert resend.call(always, calls, {"x": 1}) == "answer"
    assert calls.seen == [{"x": 1}, {"x": 1, FULL_HISTORY: True}]


def test_a_lost_chain_the_model_may_not_resend_is_raised_as_is() -> None:
    calls = Calls(LOST)
    with pytest.raises(openai.BadRequestError) as caught:
        resend.call(never, calls, {})
    assert caught.value is LOST and len(calls.seen) == 1


def test_any_other_bad_request_is_raised_without_a_resend() -> None:
    invalid = bad_request("invalid_value")
    calls = Calls(invalid)
    with pytest.raises(openai.BadRequestError) as caught:
        resend.call(always, calls, {})
    assert caught.value is invalid and len(calls.seen) == 1


async def test_the_async_call_resends_the_same_way() -> None:
    calls = Calls(LOST)

    async def send(kwargs: dict[str, Any]) -> str:
        return calls(kwargs)

    assert await resend.acall(always, send, {}) == "answer"
    assert calls.seen[-1] == {FULL_HISTORY: True}


def test_a_stream_that_fails_before_its_first_chunk_is_resent() -> None:
    calls = Calls(LOST)
    assert list(resend.stream(always, calls.stream, {})) == ["a", "b"]
    assert len(calls.seen) == 2


async def test_an_async_stream_that_fails_before_its_first_chunk_is_resent() -> None:
    calls = Calls(LOST)
    assert [chunk async for chunk in resend.astream(always, calls.astream, {})] == ["a", "b"]
    assert len(calls.seen) == 2


def test_an_empty_stream_stays_empty() -> None:
    assert list(resend.stream(always, lambda kwargs: iter(()), {})) == []
