"""Which allocator the server runs on, and `serve` running itself again on the C allocator.

Kept apart from the rest of the server (standard library only): `responses-ws serve` decides here
whether to replace itself before it imports the server, so running twice costs one interpreter start
and this module, not two imports of everything.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from collections.abc import Callable, Mapping


def libc_trim() -> Callable[[int], int] | None:
    """glibc's `malloc_trim` (give the C heap's free pages back), or None where the C library has none."""
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None


def c_allocator() -> bool:
    """Whether Python's objects come from the C allocator (`PYTHONMALLOC=malloc`): pymalloc counts the blocks
    it hands out, the C allocator does not (`sys.getallocatedblocks()` is 0)."""
    return sys.getallocatedblocks() == 0


def allocator_line(c_allocator: bool) -> str:
    """The start-up line on memory after bursts, from the allocator the process runs on.

    With Python's own allocator (pymalloc) part of the RSS of a burst of clients stays after they
    leave: the objects of the loops that run while idle, re-made during the burst in its memory,
    keep some of its arenas. The C allocator's free pages go back with the trim (README, "Load").
    """
    if c_allocator:
        return "memory: C allocator: memory freed after a burst of clients goes back to the system"
    return "memory: Python's allocator (pymalloc) keeps part of a burst's peak RSS; PYTHONMALLOC=malloc gives it back"


def c_allocator_environment(
    environ: Mapping[str, str], *, ignores_environment: bool, trims: bool, dev_mode: bool = False
) -> dict[str, str] | None:
    """The environment `serve` runs itself again with to get the C allocator, or None to go on as it is.

    Python picks its allocator once, from `PYTHONMALLOC`, before any code runs; so a `serve` started
    without it replaces itself (`exec`, same process id) with the same command and `PYTHONMALLOC=malloc`.
    None when the variable is set to anything (the operator chose: `PYTHONMALLOC=pymalloc` keeps
    Python's allocator), when the interpreter ignores the environment (`-E`, `-I`: the variable would
    not take effect), and where the C library cannot give free pages back (no `malloc_trim`: musl,
    macOS), where nothing here measured what the C allocator would gain. In development mode (`-X dev`)
    the C allocator keeps the debug hooks dev mode would have installed (`malloc_debug`: buffer overflows
    and use-after-free in C extensions are still reported).
    """
    if environ.get("PYTHONMALLOC") or ignores_environment or not trims:
        return None
    return {**environ, "PYTHONMALLOC": "malloc_debug" if dev_mode else "malloc"}
