"""Running validators and classifiers so that they cannot be bypassed.

A hook may be a plain function or an `async def`; either way its result is awaited before the
turn goes on, so an async validator that refuses a request does refuse it. A hook that raises
anything but `APIError` (the documented refusal) fails the turn with `server_error`: a broken
or crashing check closes the gate, it never lets the turn through. So does a classifier that
returns something other than `{str: str}`.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from .eager import on_task
from .errors import APIError, internal_error
from .items import Item

if TYPE_CHECKING:
    from .requests import CreateRequest
    from .state import ResponseState

log = logging.getLogger(__name__)

Validator = Callable[[list[Item], "ResponseState | None", "CreateRequest"], Awaitable[None] | None]
"""Called with the new items only and the previous state (read-only); raises `APIError` to refuse."""

Classifier = Callable[[list[Item]], Awaitable[dict[str, str]] | dict[str, str]]
"""Called with the new items only; returns labels added to the response metadata."""


async def call_hook(hook: Callable[..., Any], *args: Any) -> Any:
    """`hook(*args)`, awaited when it returns an awaitable; any exception but `APIError` becomes `server_error`."""
    try:
        result = hook(*args)
        if inspect.isawaitable(result):
            await on_task()  # a plugin's coroutine may need a current task (a timeout, an HTTP client)
            result = await result
    except APIError:
        raise
    except Exception as exc:
        log.exception("check %s raised: the turn fails closed", _name(hook))
        raise internal_error() from exc
    return result


async def run_validators(
    validators: Sequence[Validator], new_items: list[Item], previous: ResponseState | None, request: CreateRequest
) -> None:
    """Each validator in order; the first refusal (or failure) stops the turn."""
    for validator in validators:
        await call_hook(validator, new_items, previous, request)


async def run_classifiers(classifiers: Sequence[Classifier], new_items: list[Item]) -> dict[str, str]:
    """Every classifier's labels as `classifier.<name>` metadata; a later classifier wins a duplicate name."""
    labels: dict[str, str] = {}
    for classify in classifiers:
        found = await call_hook(classify, new_items)
        if not isinstance(found, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in found.items()):
            log.error("classifier %s returned %r, not {str: str}: the turn fails closed", _name(classify), found)
            raise internal_error()
        labels.update((f"classifier.{name}", value) for name, value in found.items())
    return labels


def _name(hook: Callable[..., Any]) -> str:
    return getattr(hook, "__qualname__", None) or repr(hook)
