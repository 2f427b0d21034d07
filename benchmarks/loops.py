"""The timed conversation loops, one per way of talking to a server, shared by the suites.

Each runs `turns` turns of the shared sequence (benchmarks/turns.py) with the official SDK and
returns one row per turn: the recorder's breakdown (common.Recorder) plus what the backend
received when it runs in this process. The turn starts just before the SDK call and ends
when the SDK hands over the parsed terminal event (`response.completed`, or the end of a
Chat Completions stream).
"""

from __future__ import annotations

from typing import Any

import httpx2
import orjson
from openai import AsyncOpenAI
from websockets.asyncio.client import connect

from server_shim.backends import BackendRequest, TextDelta
from server_shim.history import History

from .common import Recorder, bounded, probe_websocket
from .raw_clients import FAILED_PREFIXES, without_none
from .turns import MODEL, OUTPUT_TOKENS, as_input, assistant_message, expected_backend_messages, user_message

TURN_TIMEOUT_S = 60.0
RAW_HEADERS = {"authorization": "Bearer bench", "content-type": "application/json"}


def row(recorder: Recorder, turn: int) -> dict[str, Any]:
    out: dict[str, Any] = recorder.breakdown()
    out["backend_messages"] = recorder.backend_messages
    out["expected_messages"] = expected_backend_messages(turn)
    return out


async def _ws_completed(conn: Any) -> Any:
    async for event in conn:
        if event.type == "response.completed":
            return event.response
        if event.type in ("error", "response.failed", "response.incomplete"):
            raise RuntimeError(f"WebSocket turn failed: {str(event)[:500]}")
    raise RuntimeError("the WebSocket closed before response.completed")


async def websocket(
    client: AsyncOpenAI, recorder: Recorder, turns: int, *, model: str = MODEL, chained: bool = True
) -> list[dict[str, Any]]:
    """SDK `responses.connect()`: `previous_response_id` + the new item, or (chained=False) the whole history."""
    rows = []
    async with client.responses.connect() as conn:
        probe_websocket(conn, recorder)
        previous: str | None = None
        history: list[dict[str, Any]] = []
        for turn in range(turns):
            message = user_message(turn)
            history.append(message)
            extra: dict[str, Any] = {"previous_response_id": previous} if chained and previous else {}
            items: Any = [message] if chained else history  # plain dicts, as agents build them
            recorder.reset()
            recorder.mark("start")
            await conn.response.create(
                model=model,
                input=items,
                store=False,
                max_output_tokens=OUTPUT_TOKENS,
                **extra,
            )
            response = await bounded(_ws_completed(conn), TURN_TIMEOUT_S, f"WebSocket turn {turn + 1}")
            recorder.mark("end")
            rows.append(row(recorder, turn))
            previous = response.id
            history += as_input(response.output)
    return rows


async def _http_completed(stream: Any, recorder: Recorder) -> Any:
    """Read the SSE stream to its end; the turn ends when `response.completed` is parsed."""
    response = None
    async for event in stream:
        if event.type == "response.completed":
            recorder.mark("end")
            response = event.response
        elif event.type in ("error", "response.failed", "response.incomplete"):
            raise RuntimeError(f"HTTP turn failed: {str(event)[:500]}")
    if response is None:
        raise RuntimeError("the HTTP stream ended before response.completed")
    return response


async def http_responses(
    client: AsyncOpenAI, recorder: Recorder, turns: int, *, model: str = MODEL, chained: bool = False
) -> list[dict[str, Any]]:
    """SDK `responses.create(stream=True)`: stateless with the whole history (`store: false`),
    or chained with `previous_response_id` + the new item (`store: true`)."""
    rows = []
    previous: str | None = None
    history: list[dict[str, Any]] = []
    for turn in range(turns):
        message = user_message(turn)
        history.append(message)
        extra: dict[str, Any] = {"previous_response_id": previous} if chained and previous else {}
        items: Any = [message] if chained else history
        recorder.reset()
        recorder.mark("start")
        stream = await client.responses.create(
            model=model,
            input=items,
            store=chained,
            stream=True,
            max_output_tokens=OUTPUT_TOKENS,
            **extra,
        )
        response = await bounded(_http_completed(stream, recorder), TURN_TIMEOUT_S, f"HTTP turn {turn + 1}")
        rows.append(row(recorder, turn))
        previous = response.id
        history += as_input(response.output)
    return rows


async def http_raw(
    client: httpx2.AsyncClient, url: str, recorder: Recorder, turns: int, *, model: str = MODEL
) -> list[dict[str, Any]]:
    """Stateless streaming HTTP without the SDK (`benchmarks/raw_clients.py`): each item of the history is
    encoded once, each body is those bytes joined, and of the SSE stream only the terminal event is decoded."""
    rows = []
    options = {"model": model, "store": False, "stream": True, "max_output_tokens": OUTPUT_TOKENS}
    head = orjson.dumps(options)[:-1] + b',"input":['
    encoded: list[bytes] = []
    for turn in range(turns):
        recorder.reset()
        recorder.mark("start")
        encoded.append(orjson.dumps(user_message(turn)))
        body = head + b",".join(encoded) + b"]}"
        response = await bounded(_raw_completed(client, url, body, recorder), TURN_TIMEOUT_S, f"raw turn {turn + 1}")
        rows.append(row(recorder, turn))
        encoded += [orjson.dumps(without_none(item)) for item in response["output"]]
    return rows


async def _raw_completed(client: httpx2.AsyncClient, url: str, body: bytes, recorder: Recorder) -> dict[str, Any]:
    """Read the SSE stream to its end; the turn ends when `response.completed` is decoded."""
    response = None
    event = ""
    async with client.stream("POST", url, content=body, headers=RAW_HEADERS) as reply:
        reply.raise_for_status()
        async for line in reply.aiter_lines():
            if line.startswith("event: "):
                event = line[7:]
                if event in ("error", "response.failed", "response.incomplete"):
                    raise RuntimeError(f"raw HTTP turn failed: {event}")
            elif line.startswith("data: ") and event == "response.completed":
                response = orjson.loads(line[6:])["response"]
                recorder.mark("end")
    if response is None:
        raise RuntimeError("the raw HTTP stream ended before response.completed")
    return response


async def websocket_raw(url: str, recorder: Recorder, turns: int, *, model: str = MODEL) -> list[dict[str, Any]]:
    """WebSocket mode without the SDK: each turn's `response.create` frame encoded by the loop (the new
    item and `previous_response_id`), and of the events only the terminal one decoded. With `http_raw`,
    the pair that leaves the SDK out of the comparison: what remains is the wire and the server."""
    rows = []
    headers = {"authorization": "Bearer bench"}
    options = {"type": "response.create", "model": model, "store": False, "max_output_tokens": OUTPUT_TOKENS}
    async with connect(url, additional_headers=headers, max_size=None, compression=None, ping_interval=None) as ws:
        previous: str | None = None
        for turn in range(turns):
            recorder.reset()
            recorder.mark("start")
            chained = {"previous_response_id": previous} if previous else {}
            frame = orjson.dumps({**options, **chained, "input": [user_message(turn)]})
            recorder.mark("sent")
            await ws.send(frame, text=True)
            response = await bounded(_raw_terminal(ws, recorder), TURN_TIMEOUT_S, f"raw WebSocket turn {turn + 1}")
            rows.append(row(recorder, turn))
            previous = response["id"]
    return rows


async def _raw_terminal(ws: Any, recorder: Recorder) -> dict[str, Any]:
    while True:
        raw = await ws.recv(decode=False)
        if raw.startswith(b'{"type":"response.completed"'):
            recorder.mark("last_byte")
            response: dict[str, Any] = orjson.loads(raw)["response"]
            recorder.mark("end")
            return response
        if raw.startswith(FAILED_PREFIXES):
            raise RuntimeError(f"raw WebSocket turn failed: {raw[:500]!r}")


async def chat_completions(
    client: AsyncOpenAI, recorder: Recorder, turns: int, *, model: str = MODEL
) -> list[dict[str, Any]]:
    """SDK `chat.completions.create(stream=True)` with the whole history, as a client without the shim would."""
    rows = []
    messages: list[Any] = []

    async def read(stream: Any) -> str:
        return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    for turn in range(turns):
        messages.append(user_message(turn))
        recorder.reset()
        recorder.mark("start")
        stream = await client.chat.completions.create(
            model=model, messages=messages, stream=True, max_tokens=OUTPUT_TOKENS
        )  # type: ignore[call-overload]
        text = await bounded(read(stream), TURN_TIMEOUT_S, f"chat completions turn {turn + 1}")
        recorder.mark("end")
        rows.append(row(recorder, turn))
        messages.append(assistant_message(text))
    return rows


async def backend_inprocess(
    backend: Any, recorder: Recorder, turns: int, *, model: str = MODEL
) -> list[dict[str, Any]]:
    """The backend's `stream()` called in this process: the floor, no server, no client SDK."""
    rows = []
    history = History()
    for turn in range(turns):
        history = history.extend([{"type": "message", **user_message(turn)}])
        request = BackendRequest(model=model, history=history, max_output_tokens=OUTPUT_TOKENS)
        recorder.reset()
        recorder.mark("start")
        text = [d.text async for d in backend.stream(request) if isinstance(d, TextDelta)]
        recorder.mark("end")
        rows.append(row(recorder, turn))
        history = history.extend([{"type": "message", **assistant_message("".join(text))}])
    return rows
