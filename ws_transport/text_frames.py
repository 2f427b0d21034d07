"""Whole text frames read from a socket's bytes before `websockets`' parser, which keeps every other frame.

A turn's events reach the client as a run of small final text frames, usually in one read. `websockets`
parses each with a buffer and nested generators (header, length, payload), builds and checks a `Frame`
and looks its opcode up in an enum: ~24,000 instructions a frame, more than the rest of a non-streaming
turn's reading (`python -m benchmarks.client_instructions`). Split here, a frame costs a few
comparisons and a slice. Only what the parser would take as it is goes this way: an open connection
with no extension, no fragmented message under way, no frame half read, no debug logging, and a final,
unmasked text frame within `max_size`; from the first frame that is anything else (a ping, a close, a
fragment, a frame cut by the read) the rest of the read goes to the parser, which then has it all.
"""

from __future__ import annotations

from typing import Any

from websockets.protocol import State
from websockets.streams import StreamReader

AT_A_FRAME_BOUNDARY = StreamReader.at_eof.__code__
"""Where `websockets`' parser waits between frames (its `parse` loop starts each frame there)."""
FINAL_TEXT = 0x81
"""The first byte of a final text frame with no RSV bit."""
OPEN = State.OPEN


def at_a_boundary(protocol: Any) -> bool:
    """Whether `websockets`' sans-I/O `protocol` waits for a new frame with nothing buffered, on an open
    connection with no extension, no fragmented message under way and no debug logging."""
    if (
        protocol.state is not OPEN
        or protocol.cur_size is not None
        or protocol.reader.buffer
        or protocol.extensions
        or protocol.debug
    ):
        return False
    waiting = protocol.parser  # the client's parser delegates to the frame parser, which waits in `at_eof`
    while waiting.gi_yieldfrom is not None:
        waiting = waiting.gi_yieldfrom
    return waiting.gi_code is AT_A_FRAME_BOUNDARY


def next_text(data: bytes, at: int, max_size: int | None) -> tuple[int, int] | None:
    """The bounds of the payload of the whole final, unmasked text frame that starts at `data[at]`;
    None when no such frame starts there (another kind, masked, over `max_size`, or cut by the read)."""
    end = len(data)
    if end - at < 2 or data[at] != FINAL_TEXT:
        return None
    length, start = data[at + 1], at + 2
    if length > 125:  # a 16- or 64-bit length follows, or the mask bit is set (the parser's protocol error)
        if length == 126:
            size = 2
        elif length == 127:
            size = 8
        else:
            return None
        if end < start + size:
            return None
        length, start = int.from_bytes(data[start : start + size], "big"), start + size
    stop = start + length
    if stop > end or (max_size is not None and length > max_size):
        return None
    return start, stop
