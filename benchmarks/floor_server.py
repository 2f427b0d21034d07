"""The floor server: uvicorn's WebSocket stack answering each `response.create` with prebuilt events.

`python -m benchmarks.floor_server PORT EVENTS_JSON`. EVENTS_JSON maps a reply length
(`"1"`, `"64"`: output tokens) to the exact frames the shim sent for such a turn, captured by
the `floor` suite. Every frame that arrives gets the frames of the length it names
(`"max_output_tokens":64` in its bytes, else the shortest), one ASGI send per event as the
protocol has one event per frame; a frame that names a `stream_id` lane gets it spliced into
each event (the `client` suite's `ws_transport` clients use lanes). Nothing is parsed, validated,
cached or looked up: what this process spends per turn is what uvicorn, the `websockets` sans-I/O
protocol and the socket cost, the floor the shim's own cost is measured against.

`POST .../responses` gets the shortest reply as HTTP answers it (the terminal event's response as
JSON, or the events as SSE when the body asks for `"stream":true`), so an HTTP client reads the
same turn; any other HTTP request gets `ok` (readiness).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import orjson
import uvicorn

LANE = re.compile(rb'"stream_id":("[^"]*")')
STREAM = re.compile(rb'"stream":\s*true')


def http_replies(frames: list[str]) -> tuple[bytes, bytes]:
    """One turn as HTTP answers it: the final response's JSON, and the SSE stream of its events."""
    final = orjson.dumps(orjson.loads(frames[-1])["response"])
    sse = b"".join(b"event: " + orjson.loads(f)["type"].encode() + b"\ndata: " + f.encode() + b"\n\n" for f in frames)
    return final, sse


def build_app(replies: dict[str, list[str]]) -> Any:
    """A raw ASGI app: prebuilt replies on the WebSocket and to `POST .../responses`, 200 `ok` otherwise."""
    by_marker = [(f'"max_output_tokens":{n}'.encode(), frames) for n, frames in replies.items()]
    shortest = replies[min(replies, key=int)]
    final, sse = http_replies(shortest)

    def reply_for(data: bytes) -> list[str]:
        frames = shortest
        for marker, found in by_marker:
            if marker in data:
                frames = found
                break
        lane = LANE.search(data) if b'"stream_id"' in data else None
        if lane is None:
            return frames
        splice = ',"stream_id":' + lane.group(1).decode() + "}"
        return [f[:-1] + splice for f in frames]

    async def http(scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        if scope["method"] != "POST" or not scope["path"].endswith("/responses"):
            content, kind = b"ok", b"text/plain"
        elif STREAM.search(body):
            content, kind = sse, b"text/event-stream"
        else:
            content, kind = final, b"application/json"
        headers = [(b"content-type", kind), (b"content-length", str(len(content)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": content})

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
        elif scope["type"] == "http":
            await http(scope, receive, send)
        elif scope["type"] == "websocket":
            await receive()  # websocket.connect
            await send({"type": "websocket.accept"})
            while True:
                message = await receive()
                if message["type"] == "websocket.disconnect":
                    return
                data = message.get("bytes") or message.get("text", "").encode()
                for frame in reply_for(data):
                    await send({"type": "websocket.send", "text": frame})

    return app


def main(argv: list[str]) -> None:
    port, events_path = int(argv[0]), Path(argv[1])
    replies = orjson.loads(events_path.read_bytes())
    uvicorn.run(
        build_app(replies),
        host="127.0.0.1",
        port=port,
        ws="websockets-sansio",
        ws_per_message_deflate=False,
        ws_max_size=16 * 1024 * 1024,
        log_level="warning",
        lifespan="on",
    )


if __name__ == "__main__":
    main(sys.argv[1:])
