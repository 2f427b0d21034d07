"""The function-call ids of a conversation, shared between a state and its parent.

Each turn adds a few ids; copying the whole set per turn would make a chain of N turns hold
O(N^2) ids. A `CallIds` keeps only what its turn added and points at its parent's set, so
membership walks the chain (a lookup per turn that introduced calls). A turn adds one call or a
few: those are kept as a tuple (48 bytes for one id, where a frozenset takes 216), more as a set.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Set

SMALL = 8
"""Up to this many ids a turn added are kept as a tuple (scanned), beyond as a frozenset."""


class CallIds(Set[str]):
    """An immutable set: the parent's ids plus `own`."""

    __slots__ = ("_len", "own", "parent")

    def __init__(self, parent: Set[str], own: tuple[str, ...] | frozenset[str]) -> None:
        self.parent = parent
        self.own = own
        self._len = len(parent) + len(own)

    def __contains__(self, call_id: object) -> bool:
        node: Set[str] = self
        while isinstance(node, CallIds):
            if call_id in node.own:
                return True
            node = node.parent
        return call_id in node

    def __iter__(self) -> Iterator[str]:
        node: Set[str] = self
        while isinstance(node, CallIds):
            yield from node.own
            node = node.parent
        yield from node

    def __len__(self) -> int:
        return self._len


def with_calls(known: Set[str], new: Iterable[str]) -> Set[str]:
    """`known` plus `new`, sharing `known` rather than copying it."""
    added = tuple(dict.fromkeys(call_id for call_id in new if call_id not in known))
    if not added:
        return known
    return CallIds(known, added if len(added) <= SMALL else frozenset(added))


def own_calls(call_ids: Set[str]) -> Collection[str]:
    """The ids a state added itself (all of them for a plain set), for its memory footprint."""
    return call_ids.own if isinstance(call_ids, CallIds) else call_ids
