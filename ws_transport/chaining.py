"""Full history in, `previous_response_id` + new items out: the chaining rule, with no sockets.

A caller that resends its whole history each turn (as most frameworks do) passes a list whose
start is what the server already holds under some response id: the previous request's input
followed by that response's output. `ChainBook.plan` finds that response and splits off the new
items. Items are compared by identity first (the common case: the caller appends to one list,
so old items are the very same objects, and the check costs a pointer compare per item) and by
value only when identity fails (a framework that rebuilds dicts, or dumps SDK models, each turn).

Identity-first means an item mutated in place after it was sent is taken as unchanged; that is
the price of not re-reading the history every turn (replace an item to change it: a new object is compared
by value). The other request fields are compared with a copy taken when the chain was recorded, so a
`tools` list or `metadata` dict changed in place does end the chain.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import pydantic

Params = dict[str, Any]


def names_its_own_state(params: Params) -> bool:
    """Whether the caller chose the server-side state itself (`previous_response_id` or `conversation`):
    such a request is sent as is, never chained. A `None` value chooses nothing: LlamaIndex's
    `OpenAIResponses` sends `previous_response_id=None` on every call unless it tracks responses itself."""
    return params.get("previous_response_id") is not None or params.get("conversation") is not None


@dataclass(slots=True)
class Chain:
    """What the server holds under `response_id`: the items of the conversation so far, in order."""

    response_id: str
    params: Params
    prefix: list[Any]
    prefix_nbytes: int
    generation: int
    stored: bool
    fields: dict[str, Any] | None = None
    """`params` as JSON-ready request fields, so a chained turn with equal params reuses them."""
    head: bytes | None = None
    """`fields` encoded as the start of a `response.create` frame (see `TurnRequest.frame`), once they were."""

    def usable_on(self, generation: int) -> bool:
        """A connection-local chain only works on the socket that made it; a stored one anywhere."""
        return self.generation == generation or self.stored


@dataclass(slots=True)
class Plan:
    """A request split against the chains: `new_items` is everything when `chain` is None."""

    params: Params
    items: list[Any]
    chain: Chain | None
    new_items: list[Any]
    recordable: bool = True

    @property
    def stored(self) -> bool:
        return self.params.get("store") is not False


@dataclass
class ChainBook:
    """The conversations a session can continue, least recently used dropped first; thread-safe."""

    capacity: int = 64
    _chains: OrderedDict[str, Chain] = field(default_factory=OrderedDict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __len__(self) -> int:
        return len(self._chains)

    def plan(self, params: Params, raw_input: Any) -> Plan:
        items = input_items(raw_input)
        if names_its_own_state(params) or not isinstance(raw_input, (list, str)):
            return Plan(params, items, None, items, recordable=False)
        with self._lock:
            chain = self._find(params, items)
            if chain is not None:
                self._chains.move_to_end(chain.response_id)
        if chain is None:
            return Plan(params, items, None, items)
        return Plan(params, items, chain, items[len(chain.prefix) :])

    def record(
        self,
        plan: Plan,
        response_id: str,
        output: list[Any],
        nbytes: int,
        generation: int,
        fields: dict[str, Any] | None = None,
    ) -> Chain | None:
        """Remember the response a completed turn produced; it replaces the chain it extended."""
        if not plan.recordable:
            return None
        params = plan.chain.params if plan.chain is not None else snapshot(plan.params)
        if params is None:
            return None
        chain = Chain(response_id, params, [*plan.items, *output], nbytes, generation, plan.stored, fields)
        if plan.chain is not None and plan.chain.fields is fields:
            chain.head = plan.chain.head
        with self._lock:
            if plan.chain is not None:
                self._chains.pop(plan.chain.response_id, None)
            self._chains[response_id] = chain
            while len(self._chains) > self.capacity:
                self._chains.popitem(last=False)
        return chain

    def adopt_output(self, chain: Chain, output: Sequence[Any]) -> None:
        """Swap the recorded output dicts for the objects the caller got, so next turn matches by identity."""
        with self._lock:
            start = len(chain.prefix) - len(output)
            if start >= 0:
                chain.prefix[start:] = output

    def forget(self, chain: Chain | None) -> None:
        if chain is not None:
            with self._lock:
                self._chains.pop(chain.response_id, None)

    def _find(self, params: Params, items: list[Any]) -> Chain | None:
        for chain in reversed(self._chains.values()):
            if len(chain.prefix) < len(items) and chain.params == params and starts_with(items, chain.prefix):
                return chain
        return None


def snapshot(params: Params) -> Params | None:
    """`params` with every dict, list and tuple copied (other values shared), or None when too deep to copy.

    A chain compares a later call's params with these: held by reference, a `tools` list or `metadata`
    dict the caller changed in place between calls compared equal to itself, and the chain's request
    fields, encoded on the first call, went out again stale. Taken once per chain, not per turn (a chained
    turn's params equal its chain's, which it keeps).
    """
    try:
        return _copy_containers(params)
    except RecursionError:
        return None


def _copy_containers(value: Any) -> Any:
    kind = type(value)
    if kind is dict:
        return {key: _copy_containers(item) for key, item in value.items()}
    if kind is list:
        return [_copy_containers(item) for item in value]
    if kind is tuple:
        return tuple(_copy_containers(item) for item in value)
    return value


def input_items(raw_input: Any) -> list[Any]:
    """The input as a list of items: a plain string is one user message, as the API defines it."""
    if isinstance(raw_input, str):
        return [{"type": "message", "role": "user", "content": raw_input}]
    if isinstance(raw_input, list):
        return raw_input
    return []


def starts_with(items: Sequence[Any], prefix: Sequence[Any]) -> bool:
    """Whether `items` begins with `prefix`; the last prefix item (the newest output) is checked first.

    The rest is first compared as lists, in C (identity first, then `==`: equal dicts and equal
    SDK models are the same items), and item by item only when that fails.
    """
    n = len(prefix)
    if n == 0 or len(items) < n or not same_item(items[n - 1], prefix[n - 1]):
        return False
    head, known = items[: n - 1], prefix[: n - 1]
    if _equal_lists(head, known):
        return True
    return all(a is b or same_item(a, b) for a, b in zip(head, known, strict=True))


def _equal_lists(a: Sequence[Any], b: Sequence[Any]) -> bool:
    """`a == b`, False where an item's `==` raises (an object that cannot compare)."""
    try:
        return bool(a == b)
    except Exception:
        return False


def same_item(a: Any, b: Any) -> bool:
    """Identity, then plain equality, then equality of the JSON the SDK would send for each."""
    if a is b:
        return True
    id_a, id_b = _item_id(a), _item_id(b)
    if id_a is not None and id_b is not None and id_a != id_b:
        return False
    if type(a) is dict and type(b) is dict and a == b:
        return True
    json_a, json_b = canonical(a), canonical(b)
    return json_a == json_b or meaning(json_a) == meaning(json_b)


SERVER_ONLY_FIELDS = frozenset({"id", "status"})
TEXT_PARTS = frozenset({"input_text", "output_text"})


def meaning(item: Any) -> Any:
    """What a canonical item says to the model, without what only the server's copy carries.

    Frameworks replay the output they got in their own shape (pydantic-ai, LlamaIndex): a
    function call without its `id` and `status`, an assistant message as a plain string instead
    of `output_text` parts with empty `annotations`, arguments re-serialized. Such an item is the same item.
    """
    if not isinstance(item, dict):
        return item
    if item.get("type") == "message":
        content = item.get("content")
        if isinstance(content, list):
            if all(isinstance(p, dict) and p.get("type") in TEXT_PARTS for p in content):
                content = "".join(str(p.get("text", "")) for p in content)
            else:
                content = [{k: v for k, v in p.items() if v != []} if isinstance(p, dict) else p for p in content]
        return ("message", item.get("role"), content)
    said = {k: v for k, v in item.items() if k not in SERVER_ONLY_FIELDS}
    if item.get("type") == "function_call" and isinstance(said.get("arguments"), str):
        said["arguments"] = _parsed(said["arguments"])  # re-serialized with other spacing or key order
    return said


def _parsed(text: str) -> Any:
    try:
        return ("json", orjson.loads(text))
    except orjson.JSONDecodeError:
        return text


def dump_model(model: pydantic.BaseModel) -> dict[str, Any]:
    """An SDK model as the SDK sends it back as input (its `__api_exclude__` fields left out)."""
    return model.model_dump(
        mode="json", exclude_unset=True, by_alias=True, exclude=getattr(model, "__api_exclude__", None)
    )


def canonical(value: Any) -> Any:
    """The JSON form of an item: SDK models dumped as the SDK sends them, nulls dropped, messages typed."""
    if isinstance(value, pydantic.BaseModel):
        value = dump_model(value)
    if isinstance(value, dict):
        out = {k: canonical(v) for k, v in value.items() if v is not None}
        if "role" in out and "type" not in out:
            out["type"] = "message"
        return out
    if isinstance(value, (list, tuple)):
        return [canonical(v) for v in value]
    return value


def _item_id(item: Any) -> Any:
    if isinstance(item, dict):
        return item.get("id")
    return getattr(item, "id", None)
