"""The Responses HTTP resources beyond create/get/delete: cancel, input token counts, compaction,
and JSON error bodies for unknown routes and methods (as the API answers, never Starlette's plain text).

Compaction here does not summarise (that would take a model call the client did not ask for): it
returns the conversation's user messages and one `compaction` item that stands for the whole
conversation. A later request that carries that item gets it expanded back into the items it
stands for before validation, so the conversation continues exactly without `previous_response_id`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from .backends.base import encode, estimate_tokens
from .backends.chat_convert import chat_prompt
from .compaction import pack
from .errors import APIError, internal_error, invalid
from .events import new_id
from .http import decode_body, error_response, json_response, read_body, stored_response
from .requests import parse_create
from .tenants import scope_tenant
from .tokens import whole_prompt_tokens
from .turn import Turn

if TYPE_CHECKING:
    from .app import ShimState

log = logging.getLogger(__name__)


async def cancel_response(request: Request) -> Response:
    """Only background responses can be cancelled, and this server runs none: a stored one is refused."""
    state = await stored_response(request)
    if isinstance(state, APIError):
        return error_response(state)
    return error_response(
        invalid(
            "response_not_cancellable",
            f"Response '{state.id}' was not created with 'background: true'; only background responses can be cancelled.",
            "response_id",
        )
    )


async def count_input_tokens(request: Request) -> Response:
    """`POST /v1/responses/input_tokens`: the conversation as the backend would get it, counted by the
    deployment's tokenizer when one is configured (`tokens.py`), estimated otherwise."""
    turn = await _prepared(request)
    if isinstance(turn, APIError):
        return error_response(turn)
    shim: ShimState = request.app.state.shim
    counter = shim.env.token_counter(turn.request.model)
    messages = chat_prompt(turn.history).messages  # what a tokenizer counts: the chat rendering
    tokens = await whole_prompt_tokens(counter, messages, turn.request.instructions) if counter else None
    return json_response({"object": "response.input_tokens", "input_tokens": tokens or _input_tokens(turn)})


async def compact_response(request: Request) -> Response:
    """`POST /v1/responses/compact`: the conversation's user messages, then one compaction item for all of it."""
    turn = await _prepared(request)
    if isinstance(turn, APIError):
        return error_response(turn)
    items = list(turn.history.items)
    users = [
        {"id": new_id("msg"), "type": "message", "status": "completed", "role": "user", "content": _parts(item)}
        for item in items
        if item.get("type") == "message" and item["role"] == "user"
    ]
    shim: ShimState = request.app.state.shim
    content = pack(items, shim.env.compaction_key, turn.tenant)
    compaction = {"id": new_id("cmp"), "type": "compaction", "encrypted_content": content}
    tokens = _input_tokens(turn)
    usage = {
        "input_tokens": tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 0,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": tokens,
    }
    body = {
        "id": new_id("resp"),
        "object": "response.compaction",
        "created_at": int(time.time()),
        "output": [*users, compaction],
        "usage": usage,
    }
    return json_response(body)


def _parts(item: dict[str, Any]) -> list[dict[str, Any]]:
    content = item["content"]
    if isinstance(content, str):
        return [{"type": "output_text", "text": content, "annotations": []}]
    return [
        {"type": "output_text", "text": part.get("text", ""), "annotations": []}
        for part in content
        if isinstance(part, dict) and "text" in part
    ]


async def _prepared(request: Request) -> Turn | APIError:
    """A turn prepared from the body (validated, history resolved, rendered) that never runs."""
    shim: ShimState = request.app.state.shim
    try:
        body, shape = await decode_body(
            await read_body(request, shim.settings.max_body_bytes), shim.settings.sliced_parse_bytes, shim.env.limits
        )
    except APIError as error:
        return error
    body.setdefault("model", shim.settings.default_model)
    try:
        turn = Turn(
            parse_create(body, websocket=False, limits=shim.env.limits, depth=shape.depth),
            shim.env,
            cache=None,
            tenant=scope_tenant(request.scope),
        )
        await turn.prepare()
    except APIError as error:
        return error
    return turn


def guarded(endpoint: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
    """`endpoint`, answering a bug as the API does (a JSON `server_error`), never Starlette's plain-text 500
    (which also closes the client's kept-alive connection)."""

    async def endpoint_or_server_error(request: Request) -> Response:
        try:
            return await endpoint(request)
        except Exception:
            log.exception("%s %s failed unexpectedly", request.method, request.url.path)
            return error_response(internal_error())

    return endpoint_or_server_error


def _input_tokens(turn: Turn) -> int:
    tools = turn.sent_tools
    prompt = chat_prompt(turn.history)
    nbytes = prompt.nbytes + len(turn.request.instructions or "") + (len(encode(tools)) if tools else 0)
    return estimate_tokens(nbytes)


async def http_error(request: Request, exc: Exception) -> Response:
    """Unknown routes and methods answer as the API does: a JSON error body with a code."""
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    if status == 405:
        error = APIError(
            405,
            "method_not_allowed",
            f"Method {request.method} is not allowed on {request.url.path}.",
            type="invalid_request_error",
        )
    elif status == 404:
        error = APIError(404, "not_found", f"Unknown route: {request.method} {request.url.path}.")
    else:
        error = APIError(status, "http_error", str(getattr(exc, "detail", "")) or "HTTP error.")
    response = error_response(error)
    if isinstance(exc, HTTPException) and exc.headers:
        response.headers.update(exc.headers)
    return response
