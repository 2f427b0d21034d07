"""The function-call ids of a conversation, shared between a state and its parent.

Each turn adds a few ids; copying the whole set per turn would make a chain of N turns hold
O(N^2) ids. A `CallIds` keeps only what its turn added and points at its parent's set, so
membership walks the chain (a set lookup per turn that introduced calls).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Set


class CallIds(Set[str]):
    """An immutable set: the parent's ids plus `own`."""

    __slots__ = ("_len", "own", "parent")

    def __init__(self, parent: Set[str], own: frozenset[str]) -> None:
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
    added = frozenset(call_id for call_id in new if call_id not in known)
    return CallIds(known, added) if added else known


def own_calls(call_ids: Set[str]) -> Set[str]:
    """The ids a state added itself (all of them for a plain set), for its memory footprint."""
    return call_ids.own if isinstance(call_ids, CallIds) else call_ids
