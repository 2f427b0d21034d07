"""A minimal TCP load balancer on loopback: each new connection goes to the first upstream that accepts.

It stands where nginx or Envoy would in front of shim replicas: when a replica dies, its
connections drop and new ones land on the next replica. It counts the bytes it forwards to
each upstream, so a test can tell when a request has reached a replica.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter


class FirstAliveProxy:
    def __init__(self, upstream_ports: list[int]) -> None:
        self.upstream_ports = upstream_ports
        self.bytes_to = Counter[int]()
        self.connections_to = Counter[int]()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.sockets[0].getsockname()[1]

    async def start(self) -> FirstAliveProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self

    async def _accept(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        for port in self.upstream_ports:
            try:
                upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                continue
            self.connections_to[port] += 1
            pumps = [
                asyncio.create_task(self._pump(client_reader, upstream_writer, port)),
                asyncio.create_task(self._pump(upstream_reader, client_writer, None)),
            ]
            self._tasks.update(pumps)
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            for task in pumps:
                task.cancel()
            for writer in (client_writer, upstream_writer):
                writer.close()
            return
        client_writer.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, port: int | None) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await reader.read(65536):
                if port is not None:
                    self.bytes_to[port] += len(data)
                writer.write(data)
                await writer.drain()

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
