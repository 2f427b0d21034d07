"""The floor server: uvicorn's WebSocket stack answering each `response.create` with prebuilt events.

`python -m benchmarks.floor_server PORT EVENTS_JSON`. EVENTS_JSON maps a reply length
(`"1"`, `"64"`: output tokens) to the exact frames the shim sent for such a turn, captured by
the `floor` suite. Every frame that arrives gets the frames of the length it names
(`"max_output_tokens":64` in its bytes, else the shortest), one ASGI send per event as the
protocol has one event per frame. Nothing is parsed, validated, cached or looked up: what this
process spends per turn is what uvicorn, the `websockets` sans-I/O protocol and the socket
cost, the floor the shim's own cost is measured against.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import orjson
import uvicorn


def build_app(replies: dict[str, list[str]]) -> Any:
    """A raw ASGI app: 200 on any HTTP request (readiness), prebuilt replies on the WebSocket."""
    by_marker = [(f'"max_output_tokens":{n}'.encode(), frames) for n, frames in replies.items()]
    shortest = replies[min(replies, key=int)]

    def reply_for(data: bytes) -> list[str]:
        for marker, frames in by_marker:
            if marker in data:
                return frames
        return shortest

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
        elif scope["type"] == "http":
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
            await send({"type": "http.response.body", "body": b"ok"})
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
