"""The conversation a backend continues: Responses items, append-only, with each backend's rendering cached.

The turn hands every backend the same thing, the items as the client and the server's own
responses left them; each backend converts them into what it sends (a chat backend into
messages, a `responses` upstream not at all). A conversion is expensive only if it starts
over each turn, so a `History` keeps, per renderer, the rendering of its longest rendered
prefix: the next turn's history inherits it and the renderer extends it by the new items only.

Items arrive in batches (a turn's input, a response's output) and a renderer sees them batch
by batch, whatever was cached: the rendering is a function of the items and their batches
alone, so a history rebuilt elsewhere (from the Redis store) renders to the same bytes.

A history is a chain of batches, each pointing at the history it extends, so the states of a
conversation share their items and N turns hold O(total bytes), not O(N^2).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import orjson

from .item_held import batch_footprint

Item = dict[str, Any]
R = TypeVar("R")


class History:
    """One batch of items on top of the history it extends, plus a per-renderer cache of
    `(batches covered, rendering)`."""

    __slots__ = ("_renderings", "batches", "count", "items_held", "nbytes", "own", "parent")

    def __init__(self, parent: History | None = None, own: tuple[Item, ...] = (), own_held: int | None = None) -> None:
        self.parent = parent
        self.own = own
        """This node's batch."""
        nbytes = len(orjson.dumps(own)) - 1 if own else 0  # each item's JSON and one byte: the array less a bracket
        if own_held is None:  # after the encoding: it leaves a UTF-8 copy in each non-ASCII string, held from then on
            own_held = batch_footprint(own) if own else 0
        if parent is None:
            self.count: int = len(own)
            """Items in the whole chain."""
            self.batches: int = 1 if own else 0
            self.nbytes: int = nbytes
            """JSON size of the whole chain: what token estimates use."""
            self.items_held: int = own_held
            """Memory the chain's items hold (see `batch_footprint`; `own_held`: the batch's, when measured already)."""
            self._renderings: tuple[tuple[str, int, Any], ...] = ()
            """(key, batches covered, rendering) per renderer: a tuple shared with the parent until this node
            renders (a dict per node cost ~200 bytes a turn)."""
        else:  # one test of `parent` for all five (a turn makes two nodes)
            self.count = parent.count + len(own)
            self.batches = parent.batches + 1 if own else parent.batches
            self.nbytes = parent.nbytes + nbytes
            self.items_held = parent.items_held + own_held
            self._renderings = parent._renderings

    @classmethod
    def from_batches(cls, batches: Sequence[Sequence[Item]]) -> History:
        history = cls()
        for batch in batches:
            history = history.extend(batch)
        return history

    def __len__(self) -> int:
        return self.count

    def __eq__(self, other: object) -> bool:
        """Equal items in equal batches (the renderings follow from them)."""
        if not isinstance(other, History):
            return NotImplemented
        return self.count == other.count and self.batch_list() == other.batch_list()

    __hash__ = None  # type: ignore[assignment]

    @property
    def items(self) -> tuple[Item, ...]:
        """Every item of the chain, oldest first (walks the chain: O(N))."""
        return tuple(item for batch in self.batch_list() for item in batch)

    @property
    def last_item(self) -> Item | None:
        node: History | None = self
        while node is not None and not node.own:
            node = node.parent
        return node.own[-1] if node is not None else None

    @property
    def held(self) -> int:
        """Memory the chain holds: its items and the renderings cached for it."""
        held = self.items_held
        for _, _, rendering in self._renderings:  # a loop, not a generator: asked twice a turn
            held += getattr(rendering, "held", 0)
        return held

    def batch_list(self) -> list[tuple[Item, ...]]:
        return [node.own for node in self._nodes()]

    def after(self, count: int) -> tuple[Item, ...]:
        """The items past the first `count` (a previous turn's history): walks only the new batches."""
        tail: list[tuple[Item, ...]] = []
        node: History | None = self
        while node is not None and node.count > count:
            tail.append(node.own[max(0, count - (node.count - len(node.own))) :])
            node = node.parent
        return tuple(item for batch in reversed(tail) for item in batch)

    def extend(self, items: Sequence[Item], held: int | None = None) -> History:
        """This history and then one more batch; the renderings made so far carry over. `held`: the batch's
        footprint as a tuple, when the caller measured it (`footprint_in_slices`)."""
        if not items:
            return self
        return History(self if self.count else None, tuple(items), held)

    def rendering(self, key: str, empty: R, extend: Callable[[R, Sequence[Item]], R]) -> R:
        """The whole history rendered by `extend`, continuing the longest cached rendering under `key`.

        `extend(rendering, batch)` returns a new rendering (renderings are shared between
        histories) of the old one followed by one batch of items.
        """
        cached = self._renderings
        covered, rendering = 0, empty
        found: tuple[str, int, Any] | None = None
        for entry in cached:  # a loop, not a generator: one renderer is usual
            if entry[0] == key:
                _, covered, rendering = found = entry
                break
        batches = self.batches
        if covered < batches:
            new: list[tuple[Item, ...]] = []
            node: History | None = self
            while node is not None and node.batches > covered:  # only the batches past the cached rendering
                if node.own:
                    new.append(node.own)
                node = node.parent
            for batch in reversed(new):
                rendering = extend(rendering, batch)
            if found is not None:  # most histories: this renderer's the one rendering cached
                cached = () if len(cached) == 1 else tuple([entry for entry in cached if entry is not found])
            self._renderings = (*cached, (key, batches, rendering))
        return rendering

    def _nodes(self) -> list[History]:
        nodes = []
        node: History | None = self
        while node is not None:
            if node.own:
                nodes.append(node)
            node = node.parent
        nodes.reverse()
        return nodes
