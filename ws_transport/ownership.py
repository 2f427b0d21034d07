"""Who runs the sync client's private loop (`portal.py`): the rules, without I/O, the clock passed in."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .errors import SessionClosed

IDLE_S = 1.0
"""How long the loop is left unread between calls before the keeper runs it: far below the ~20 s
within which servers expect a ping answered (uvicorn's and websockets' default `ping_timeout`)."""
KEEPER = -1
"""`Ownership.driver` while the keeper thread runs the loop."""


class Move(enum.Enum):
    """What a calling thread does with its call (`Ownership.take`)."""

    DRIVE = "run the loop on this thread until the call is done"
    HAND = "hand the call to the thread running the loop"
    ASK = "ask the keeper to stop running the loop, then take again"
    WAIT = "the keeper was asked already: wait until it stopped, then take again"


DRIVE, HAND, ASK, WAIT = Move.DRIVE, Move.HAND, Move.ASK, Move.WAIT
"""The moves as module constants: on 3.11 an enum member looked up on its class costs ~4x a plain attribute."""


@dataclass
class Ownership:
    """Who runs the portal's loop, decided without I/O (the clock passed in; the portal holds its lock)."""

    idle_s: float = IDLE_S
    driver: int | None = None
    """The thread running the loop (its ident, or `KEEPER`); None while nobody does."""
    handed: int = 0
    """Calls on the loop whose callers do not run it: handed over, or left unfinished by their driver."""
    released_at: float = 0.0
    keeper_asked: bool = False
    stopped: bool = False

    def take(self, thread: int, *, can_drive: bool) -> Move:
        """A call from `thread` (`can_drive`: it runs no other loop); `SessionClosed` once stopped."""
        if self.stopped:
            raise SessionClosed("the client was closed")
        if self.driver is None and can_drive:
            self.driver = thread
            return DRIVE
        if self.driver == KEEPER and can_drive and not self.handed:
            asked, self.keeper_asked = self.keeper_asked, True
            return WAIT if asked else ASK
        self.handed += 1
        return HAND

    def release(self, now: float, *, unfinished: bool = False) -> bool:
        """The driver stopped running the loop (`unfinished`: its own call goes on); True: the keeper must run it now."""
        self.driver = None
        self.released_at = now
        self.keeper_asked = False
        self.handed += unfinished
        return self.handed > 0

    def finished(self) -> None:
        """A call counted in `handed` finished."""
        self.handed -= 1

    def keeper_wait(self, now: float) -> float | None:
        """For the keeper: None when it runs the loop now (it is the driver then), else how long to sleep first."""
        if self.driver is not None:
            return self.idle_s
        if self.handed or now - self.released_at >= self.idle_s:
            self.driver = KEEPER
            return None
        return self.released_at + self.idle_s - now
