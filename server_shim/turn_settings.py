"""What a turn derives from the request's settings alone, derived once per connection while they stay the same.

An agent's chained turns repeat the same settings (model, instructions, tools, options) and change only
`input` and `previous_response_id`. The Response object's echo (but its `previous_response_id`, set per turn),
the containers of it to be sized, and the backend's fields (`request_fields`) depend on nothing else, so a
connection keeps the last derivation (`SettingsMemo`) and reuses it while the settings are exactly the same.
Many connections of one server usually send the same settings too (one agent's configuration, many agents): a
connection's first turn, or a turn whose settings changed, takes the derivation of these settings from the server's
few most recent ones (`SharedDerivations`) when another connection made it, rather than deriving them again.

"The same" is decided on the settings' JSON: `orjson.dumps` of every field a derivation reads (every declared
field but `input`, `previous_response_id`, `stream_id` and `generate`), the extra fields and the private ones.
Equal bytes mean the same values of the same JSON types in the same key order: what `==` alone would not
tell (`1 == 1.0 == True`, `{"a": 1, "b": 2} == {"b": 2, "a": 1}`) though the echo would differ on the wire.
A request's values are what a JSON parser gives (`json_slices` gives exactly what `orjson.loads` does), so
nothing two equal encodings stand for can differ in a way a derivation sees; a value orjson cannot encode
is derived afresh, not remembered. `tests/test_shim_turn_settings.py` holds a reused derivation to a fresh
one for any change of the settings (hypothesis).

Nothing derived is changed in place by its readers: the echo is spread into each Response object, backends
get their own copies of the two field dicts (`TurnPlan.backend_request`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from operator import itemgetter
from typing import Any, Literal

import orjson

from .event_frames import EchoJson
from .events import echo_of
from .footprint import footprint
from .request_fields import chat_options, responses_fields
from .requests import CreateRequest
from .response_held import ECHO_DEFAULT_SIZES

PER_TURN = frozenset({"input", "previous_response_id", "stream_id", "generate"})
"""The declared fields no derivation here reads: they may change while the derivation is reused."""
_settings_of = itemgetter(*(name for name in CreateRequest.model_fields if name not in PER_TURN))
MAX_KEY_BYTES = 64 * 1024
"""Settings whose JSON is larger are derived afresh each turn, neither remembered nor shared."""
MAX_HELD_BYTES = 128 * 1024
"""A derivation is remembered (by its connection, and shared) only while the objects of its request's settings and
what was derived from them hold at most this much memory (`footprint`): a connection's memo holds them outside the
caches' byte bounds (its cached states mostly hold the same objects: their Response objects echo the memo's, but
not the extra fields nor the backends' copies), and JSON of small containers holds ~25 times its length in objects,
so the JSON's length alone let each connection keep ~1.5 MB that no bound counted."""
UNWALKED_KEY_BYTES = 4 * 1024
"""Settings whose JSON is at most this long are remembered without being measured: whatever their shape, they hold
less than `MAX_HELD_BYTES` (`tests/test_shim_turn_settings.py` holds the worst shapes to it)."""
SHARED_DERIVATIONS = 16
"""The derivations a server keeps for all its connections (`SharedDerivations`): at most this many, each within
`MAX_KEY_BYTES` of JSON and `MAX_HELD_BYTES` of objects."""


class Derived:
    """The request's settings as a turn uses them (see the module's docstring)."""

    __slots__ = ("echo_held", "echo_json", "echoed", "fields", "options", "parts", "response_template", "template_held")

    def __init__(self, request: CreateRequest) -> None:
        echoed, given = echo_of(request)
        self.echoed = echoed
        """The request fields its Response objects echo (`events.echo_of`), as the first request had them."""
        self.parts = echoed_parts(echoed, given)
        """The echoed containers to be sized in slices (`request_held`)."""
        self.echo_held: dict[int, int] | None = None if self.parts else {}
        """Their footprints by `id`, once measured (None: not yet)."""
        self.echo_json: EchoJson | Literal[False] | None = None
        """The echo's JSON but for `previous_response_id`, once a WebSocket turn encoded it (`event_frames`; False:
        it cannot be encoded)."""
        self.response_template: dict[str, Any] | None = None
        """A Response object with the echo, once a turn made one (`events.response_object` copies it, ~1 KB: its
        values are the echo's own objects)."""
        self.template_held: int | None = None
        """What the template's echoed fields hold, once a turn's state measured them (`response_held.made_held`)."""
        self.options = chat_options(request)
        """What a Chat Completions backend gets beside the conversation."""
        self.fields = responses_fields(request)
        """What a `responses` upstream gets beside the conversation."""

    def echo(self, request: CreateRequest) -> dict[str, Any]:
        """The echo for `request` (with these settings): the derived one with its own `previous_response_id` (the
        key stays where it was: `ECHO_DEFAULTS` has it)."""
        return {**self.echoed, "previous_response_id": request.__dict__["previous_response_id"]}


def echoed_parts(echoed: dict[str, Any], given: Iterable[str]) -> list[dict[str, Any] | list[Any]]:
    """The request's containers that the Response object echoes (a `text.format` schema, a `tool_choice`...: up to
    `max_json_values` values), to be measured in slices; `ResponseState` takes their footprints as known rather
    than walking them at once. The tools are measured apart. Only the fields the request set (`given`) are looked
    at: every other one echoes a default, measured once (`ECHO_DEFAULT_SIZES`)."""
    parts: list[dict[str, Any] | list[Any]] = []
    for name in given:
        value = echoed[name]
        if name == "tools" or not isinstance(value, (dict, list)):
            continue
        nested = value.values() if isinstance(value, dict) and name in ("text", "reasoning") else (value,)
        for part in nested:  # text and reasoning: fresh dicts, merged over the defaults
            if isinstance(part, (dict, list)) and id(part) not in ECHO_DEFAULT_SIZES:
                parts.append(part)
    return parts


def held_within_bound(key: bytes, request: CreateRequest, derived: Derived) -> bool:
    """Whether the memo may keep `derived` (see `MAX_HELD_BYTES`): measured only for settings of more than
    `UNWALKED_KEY_BYTES` of JSON, once per change of the settings."""
    if len(key) <= UNWALKED_KEY_BYTES:
        return True
    settings = (_settings_of(request.__dict__), request.__pydantic_extra__, request.__pydantic_private__)
    return footprint((settings, derived.echoed, derived.options, derived.fields)) <= MAX_HELD_BYTES


def settings_key(request: CreateRequest) -> bytes | None:
    """The settings' JSON (see the module's docstring); None when orjson cannot encode them."""
    try:
        return orjson.dumps((_settings_of(request.__dict__), request.__pydantic_extra__, request.__pydantic_private__))
    except TypeError:  # orjson.JSONEncodeError: a value JSON does not have
        return None


class SharedDerivations:
    """The server's most recently derived settings, by tenant and the settings' JSON, for every connection of the
    tenant (the least recently used dropped past `entries`). Sharing one is safe: nothing derived is changed in
    place by its readers, and what a derivation fills in later (footprints by `id`, the echo's JSON) is the same
    whichever turn fills it in."""

    __slots__ = ("_by_key", "entries")

    def __init__(self, entries: int = SHARED_DERIVATIONS) -> None:
        self.entries = entries
        self._by_key: OrderedDict[tuple[str | None, bytes], Derived] = OrderedDict()

    def __len__(self) -> int:
        return len(self._by_key)

    def get(self, key: tuple[str | None, bytes]) -> Derived | None:
        derived = self._by_key.get(key)
        if derived is not None:
            self._by_key.move_to_end(key)
        return derived

    def put(self, key: tuple[str | None, bytes], derived: Derived) -> None:
        self._by_key[key] = derived
        if len(self._by_key) > self.entries:
            self._by_key.popitem(last=False)


class SettingsMemo:
    """A connection's last derivation, reused while its requests' settings stay exactly the same; another one
    taken from `shared` (the server's) when the same tenant's connections derived these settings lately."""

    __slots__ = ("_derived", "_key", "_shared", "_tenant")

    def __init__(self, shared: SharedDerivations | None = None, tenant: str | None = None) -> None:
        self._key: bytes | None = None
        self._derived: Derived | None = None
        self._shared = shared
        self._tenant = tenant

    def derived(self, request: CreateRequest) -> Derived:
        key = settings_key(request)
        if key is not None and key == self._key and self._derived is not None:
            return self._derived
        if key is None or len(key) > MAX_KEY_BYTES:
            return Derived(request)
        shared = self._shared
        scoped = (self._tenant, key)
        derived = shared.get(scoped) if shared is not None else None
        if derived is None:
            derived = Derived(request)
            if not held_within_bound(key, request, derived):
                return derived
            if shared is not None:
                shared.put(scoped, derived)
        self._key, self._derived = key, derived
        return derived
