"""Give freed heap memory back to the operating system after connections close.

CPython frees a closed connection's objects, but glibc keeps the freed pages in the process
(RSS stays at its peak after a burst of clients). `malloc_trim(0)` returns them; it costs a
few milliseconds, so it runs in a worker thread, once per burst of closes. A no-op
where the C library has no `malloc_trim` (musl, macOS).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
from collections.abc import Callable
from dataclasses import dataclass


def _libc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None


@dataclass
class Trimmer:
    """Coalesces the closes of a burst: one trim `delay_s` after the first close of the burst."""

    delay_s: float = 1.0
    _pending: asyncio.TimerHandle | None = None

    def maybe_trim(self) -> None:
        if _TRIM is None or self._pending is not None:
            return
        self._pending = asyncio.get_running_loop().call_later(self.delay_s, self._start)

    def _start(self) -> None:
        self._pending = None
        if _TRIM is not None:
            asyncio.get_running_loop().create_task(asyncio.to_thread(_TRIM, 0))


_TRIM = _libc_trim()
