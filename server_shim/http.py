"""HTTP routes on the same app: `POST/GET/DELETE /v1/responses`, models, health."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from json import JSONDecodeError
from typing import TYPE_CHECKING, Any, TypeVar

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse

from . import json_slices, metrics, tracing
from .backends.base import ReportsStatus
from .errors import APIError, internal_error, invalid
from .items import Item
from .json_shape import Shape, TooManyValues
from .limits import RequestLimits, too_many_values
from .requests import parse_create
from .tenants import scope_tenant
from .turn import Turn
from .turn_settings import SettingsMemo

if TYPE_CHECKING:
    from .app import ShimState
    from .state import ResponseState

log = logging.getLogger(__name__)

T = TypeVar("T")


def json_response(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


def error_response(error: APIError) -> Response:
    metrics.ERRORS.labels(error.code).inc()
    response = json_response({"error": error.body()}, error.status)
    if error.retry_after_s is not None:
        response.headers["Retry-After"] = str(max(1, math.ceil(error.retry_after_s)))
    return response


async def create_response(request: Request) -> Response:
    shim: ShimState = request.app.state.shim
    refusal = shim.gate.admit_request()
    if refusal is not None:
        return error_response(refusal.api_error())
    try:
        body, shape = await json_body(await read_body(request, shim.settings.max_body_bytes), shim)
    except APIError as error:
        return error_response(error)
    try:
        create = parse_create(body, websocket=False, limits=shim.env.limits, depth=shape.depth)
        if create.background:
            raise invalid("unsupported_parameter", "'background: true' is not supported by this server.", "background")
        tenant = scope_tenant(request.scope)
        memo = SettingsMemo(shim.derivations, tenant)  # the server's: an agent's repeated settings derived once
        turn = Turn(create, shim.env, cache=None, transport="http", tenant=tenant, memo=memo)
        turn.result.trace_carrier = tracing.carrier(request.scope["headers"])
        await turn.prepare()
    except APIError as error:
        return error_response(error)
    except Exception:
        log.exception("request refused by an unexpected error")
        return error_response(internal_error())
    refusal = shim.limiter.acquire(turn.tenant, shim.clock())
    if refusal is not None:
        return error_response(refusal.api_error())
    if create.stream:
        return StreamingResponse(_sse(turn, shim), media_type="text/event-stream")
    outcome = await complete_turns(request, shim, [turn])
    return outcome if isinstance(outcome, Response) else json_response(outcome[0])


async def json_body(raw: bytes, shim: ShimState) -> tuple[dict[str, Any], Shape]:
    """The request body as a JSON object (counted as received) and its shape, or a 400 saying what it is instead."""
    shim.stats.bytes_received += len(raw)
    metrics.BYTES_RECEIVED.labels("http").inc(len(raw))
    return await decode_body(raw, shim.settings.sliced_parse_bytes, shim.env.limits)


async def decode_body(raw: bytes, slice_from: int, limits: RequestLimits) -> tuple[dict[str, Any], Shape]:
    """The body as a JSON object and its shape: its values counted first (more than `max_json_values`:
    refused unparsed), parsed in slices that let other requests run when it is large."""
    try:
        body, shape = await json_slices.load_measured(
            raw, len(raw), slice_from, limits.max_json_values, limits.max_json_depth
        )
    except TooManyValues:
        raise too_many_values(limits.max_json_values) from None
    except JSONDecodeError as exc:
        raise invalid("invalid_json", f"The request body is not valid JSON: {exc}.") from None
    if not isinstance(body, dict):
        raise invalid("invalid_type", "The request body must be a JSON object.")
    return body, shape


async def complete_turns(
    request: Request, shim: ShimState, turns: list[Turn], run: Callable[[Turn], Awaitable[Any]] | None = None
) -> list[dict[str, Any]] | Response:
    """Run prepared, admitted turns to their ends together (cancelled if the client goes away), each by
    `run` (default `complete_turn`): their terminal Response objects, or the error response of the
    first that failed. The tenant's slots (one per turn) are released however it ends."""
    try:
        terminals = await unless_disconnected(request, _complete_all(turns, run or complete_turn))
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("turn failed unexpectedly")
        return error_response(internal_error())
    finally:
        shim.limiter.release(turns[0].tenant, len(turns))
        for turn in turns:
            shim.record_turn(turn)
    failed = next((turn.result.error for turn in turns if turn.result.error is not None), None)
    answered = [terminal for terminal in terminals or () if terminal is not None]
    if failed is not None or len(answered) != len(turns):
        return error_response(failed or internal_error())
    return answered


async def _complete_all(turns: list[Turn], run: Callable[[Turn], Awaitable[Any]]) -> list[dict[str, Any] | None]:
    return list(await asyncio.gather(*(run(turn) for turn in turns)))


async def complete_turn(turn: Turn) -> dict[str, Any] | None:
    """Run a non-streaming turn to its end; the terminal Response object, if it completed."""
    terminal: dict[str, Any] | None = None
    async with contextlib.aclosing(turn.events()) as events:
        async for batch in events:
            for event in batch:
                if event["type"] in ("response.completed", "response.incomplete"):
                    terminal = event["response"]
    return terminal


async def unless_disconnected(request: Request, work: Coroutine[Any, Any, T]) -> T | None:
    """`work`, cancelled (and its backend request with it) if the client goes away first."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait([task, watcher], return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if not task.done():
        log.info("HTTP client disconnected; its response is cancelled")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return None
    return task.result()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 as soon as it is known to exceed `limit` (by header or while reading)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise _too_large(limit)
            chunks.append(chunk)
    except ClientDisconnect:  # gone mid-body, or timed out by the protocol (which answered 408 itself)
        raise APIError(499, "client_disconnected", "The client went away before sending the whole body.") from None
    return b"".join(chunks)


def _too_large(limit: int) -> APIError:
    return APIError(413, "request_too_large", f"The request body exceeds the {limit}-byte limit.")


async def _sse(turn: Turn, shim: ShimState) -> AsyncIterator[bytes]:
    next_sequence = 0
    try:
        async with contextlib.aclosing(turn.events()) as events:
            async for batch in events:
                for event in batch:
                    next_sequence = event["sequence_number"] + 1
                    yield _sse_frame(_sse_error(event) if event["type"] == "error" else event)
                    # a backend that never waits (the simulator, a burst) would otherwise keep the loop from
                    # noticing a dropped client: Starlette's disconnect listener runs here and stops the turn
                    await asyncio.sleep(0)
    except Exception:
        log.exception("turn failed unexpectedly")
        yield _sse_frame(_sse_error({"sequence_number": next_sequence, **internal_error().event()}))
    finally:
        shim.limiter.release(turn.tenant)
        shim.record_turn(turn)


def _sse_frame(event: dict[str, Any]) -> bytes:
    return b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


def _sse_error(event: dict[str, Any]) -> dict[str, Any]:
    """The HTTP stream's error event is flat (`ResponseErrorEvent`), unlike the WebSocket one."""
    error = event["error"]
    metrics.ERRORS.labels(error["code"]).inc()
    return {
        "type": "error",
        "sequence_number": event["sequence_number"],
        "code": error["code"],
        "message": error["message"],
        "param": error["param"],
    }


async def get_response(request: Request) -> Response:
    state = await stored_response(request)
    if isinstance(state, APIError):
        return error_response(state)
    return json_response(state.response)


async def list_input_items(request: Request) -> Response:
    """The items the request that created this response added (`limit`, `order`, `after` as OpenAI's)."""
    state = await stored_response(request)
    if isinstance(state, APIError):
        return error_response(state)
    try:
        page = input_items_page(state.input_items, request.query_params)
    except APIError as error:
        return error_response(error)
    return json_response(page)


async def delete_response(request: Request) -> Response:
    shim: ShimState = request.app.state.shim
    response_id = request.path_params["response_id"]
    try:
        deleted = await shim.env.store.delete(response_id, scope_tenant(request.scope))
    except APIError as error:
        metrics.STORE_OPERATIONS.labels("delete", "error").inc()
        return error_response(error)
    metrics.STORE_OPERATIONS.labels("delete", "hit" if deleted else "miss").inc()
    if not deleted:
        return error_response(_not_found(response_id))
    return json_response({"id": response_id, "object": "response", "deleted": True})


async def stored_response(request: Request) -> ResponseState | APIError:
    """The stored response the path names, if the caller's tenant owns it; otherwise the same 404 as unknown."""
    shim: ShimState = request.app.state.shim
    response_id = request.path_params["response_id"]
    try:
        state = await shim.env.store.load(response_id, scope_tenant(request.scope))
    except APIError as error:  # the store is unreachable
        metrics.STORE_OPERATIONS.labels("load", "error").inc()
        return error
    metrics.STORE_OPERATIONS.labels("load", "miss" if state is None else "hit").inc()
    return state if state is not None else _not_found(response_id)


def input_items_page(items: list[Item], query: Mapping[str, str]) -> dict[str, Any]:
    """One page of input items: newest first unless `order=asc`, after the item id `after`, at most `limit`."""
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise invalid("invalid_value", "'order' must be 'asc' or 'desc'.", "order")
    try:
        limit = int(query.get("limit", "20"))
    except ValueError:
        limit = 0
    if not 1 <= limit <= 100:
        raise invalid("invalid_value", "'limit' must be an integer from 1 to 100.", "limit")
    listed = [_listed_item(item, index) for index, item in enumerate(items)]
    if order == "desc":
        listed.reverse()
    after = query.get("after")
    if after is not None:
        ids = [item["id"] for item in listed]
        if after not in ids:  # an empty page would end a client's pagination silently
            raise APIError(
                404, "item_not_found", f"Item with id '{after}' not found in this response's input.", "after"
            )
        listed = listed[ids.index(after) + 1 :]
    page = listed[:limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": len(listed) > limit,
    }


def _listed_item(item: Item, index: int) -> Item:
    """An input item as the API lists it: with an id, and a message's text content as parts."""
    listed = item if "id" in item else {"id": f"item_{index}", **item}
    if listed.get("type") == "message" and isinstance(listed.get("content"), str):
        part = "output_text" if listed.get("role") == "assistant" else "input_text"
        listed = {**listed, "content": [{"type": part, "text": listed["content"]}]}
    return listed


async def list_models(request: Request) -> Response:
    shim: ShimState = request.app.state.shim
    try:
        names = await shim.models()
    except Exception as exc:
        return error_response(
            APIError(502, "backend_error", f"Could not list backend models: {exc}", type="server_error")
        )
    data = [{"id": name, "object": "model", "created": 0, "owned_by": "responses-ws"} for name in names]
    return json_response({"object": "list", "data": data})


def _probe_details(request: Request) -> bool:
    """With API keys, the probes answer anyone but name deployments and counts only for a valid key."""
    state = request.scope.get("state")
    return not isinstance(state, dict) or state.get("probe_details", True)


async def healthz(request: Request) -> Response:
    shim: ShimState = request.app.state.shim
    if not _probe_details(request):
        return json_response({"status": "ok"})
    return json_response({"status": "ok", "backend": shim.env.backend.name, "connections": len(shim.connections)})


async def readyz(request: Request) -> Response:
    """Ready when the store has answered once and a deployment has answered and can take traffic; the body
    shows each one.

    A shared store that stops answering later leaves this replica ready by default: every replica shares
    it, so all would go unready at once (a total outage where only turns that need the store fail), and
    turns with `store: false` or on a connection's cache still work. The body says it is unreachable;
    `readyz_requires_store` makes it 503 instead. The store's ping is bounded (0.5 s) under a probe's
    timeout."""
    shim: ShimState = request.app.state.shim
    backend = shim.env.backend
    deployments = backend.status() if isinstance(backend, ReportsStatus) else {backend.name: {"available": True}}
    reachable = await shim.env.store.ping()
    shim.store_answered = shim.store_answered or reachable
    ready = shim.store_answered and any(d["available"] and d.get("answered", True) for d in deployments.values())
    ready = ready and (reachable or not shim.settings.readyz_requires_store)
    if not _probe_details(request):
        return json_response(
            {"ready": ready and not shim.gate.draining}, 200 if ready and not shim.gate.draining else 503
        )
    if shim.gate.draining:
        return json_response({"ready": False, "draining": True, "deployments": deployments}, 503)
    store = {"kind": "memory" if shim.settings.store == "memory" else "redis", "reachable": reachable}
    return json_response({"ready": ready, "deployments": deployments, "store": store}, 200 if ready else 503)


async def metrics_endpoint(request: Request) -> Response:
    """Prometheus exposition format (`responses_ws_*`); `BearerAuth` decides who may read it."""
    body, content_type = metrics.render()
    return Response(body, media_type=content_type)


def _not_found(response_id: str) -> APIError:
    return APIError(404, "response_not_found", f"Response with id '{response_id}' not found.", "response_id")
