"""An OpenAI-compatible chat server that misbehaves on purpose: refuses, fails, stalls or trickles.

Each request takes the next queued behaviour (`ok` when none is queued):
- `http_400` / `http_500`: an error status with a body naming a file path, an address and a key;
- `stall`: headers, then nothing;
- `trickle`: headers, then a `: keep-alive` comment line every 0.1 s, never a token;
- `one_then_stall`: one token, then nothing.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import AsyncIterator

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

MODEL = "fault-model"
LEAKY_ERROR = "context too long for /srv/models/secret.gguf on 10.1.2.3:8080 (key sk-live-SECRET)"


def _chunk(content: str | None, finish: str | None = None) -> bytes:
    delta = {"content": content} if content is not None else {}
    body = {
        "id": "c",
        "object": "chat.completion.chunk",
        "model": MODEL,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(body).encode() + b"\n\n"


class FaultBackend:
    def __init__(self) -> None:
        self.queue: list[str] = []
        self.requests = 0
        self.open_streams = 0
        self.port = _free_port()
        app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._completions, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
            ]
        )
        self._server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="critical"))
        self._thread = threading.Thread(target=self._server.run, name="fault-backend", daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> FaultBackend:
        self._thread.start()
        while not self._server.started:
            threading.Event().wait(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)

    async def _models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "test"}]})

    async def _completions(self, request: Request) -> Response:
        await request.body()
        self.requests += 1
        mode = self.queue.pop(0) if self.queue else "ok"
        if mode.startswith("http_"):
            status = int(mode[5:])
            return JSONResponse({"error": {"message": LEAKY_ERROR, "type": "invalid_request_error"}}, status)
        return StreamingResponse(self._stream(mode), media_type="text/event-stream")

    async def _stream(self, mode: str) -> AsyncIterator[bytes]:
        self.open_streams += 1
        try:
            if mode == "ok":
                yield _chunk("fine")
                yield _chunk(None, "stop")
                yield b"data: [DONE]\n\n"
                return
            if mode == "one_then_stall":
                yield _chunk("one")
            while True:
                await asyncio.sleep(0.1)
                if mode == "trickle":
                    yield b": keep-alive\n\n"
        finally:
            self.open_streams -= 1


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
