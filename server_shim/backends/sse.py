"""Lines of a backend's streamed answer, with a bound on how long one line may grow.

`httpx`'s `aiter_lines` keeps buffering until a newline arrives, so a backend that never sends
one (a bug or a hostile upstream) grows the shim's memory without end. Here a line longer than
`max_line_bytes` is a malformed stream: a `BackendError` (a backend fault), and the buffer is dropped.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from ..errors import BackendError

MAX_LINE_BYTES = 16 * 1024 * 1024


async def bounded_lines(chunks: AsyncIterator[bytes], max_line_bytes: int = MAX_LINE_BYTES) -> AsyncIterator[str]:
    """The lines of `chunks` (without their `\n` or `\r\n`), each at most `max_line_bytes`."""
    parts: list[bytes] = []  # the unfinished line, in pieces: no copy per chunk
    size = 0
    async for chunk in chunks:
        start = 0
        while (end := chunk.find(b"\n", start)) != -1:
            line = b"".join([*parts, chunk[start:end]]) if parts else chunk[start:end]
            parts.clear()
            size = 0
            if len(line) > max_line_bytes:
                raise _too_long(max_line_bytes)
            yield line.removesuffix(b"\r").decode(errors="replace")
            start = end + 1
        if start < len(chunk):
            parts.append(chunk[start:])
            size += len(chunk) - start
            if size > max_line_bytes:
                raise _too_long(max_line_bytes)
    if parts:
        yield b"".join(parts).removesuffix(b"\r").decode(errors="replace")


def _too_long(limit: int) -> BackendError:
    return BackendError(f"backend sent a line longer than {limit} bytes (a malformed stream)")
