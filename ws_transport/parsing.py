"""The SDK's model of a server's JSON, built by pydantic-core: the object the SDK's parser builds, in a third of the time.

The `openai` SDK parses a response with its own `construct` (Python code walking the model's
fields, validating each union field with pydantic on the way): ~0.2 ms for a small `Response`,
more than the wire costs a whole turn. Validating the same JSON with the model's own
pydantic-core validator builds the same objects in one call, except in four ways this module
closes or avoids:

- the SDK validates union fields leniently ("1" for an int) and constructs the rest unchecked
  (a string where a bool belongs is kept as is); a strict validation accepts only input that
  both read the same way, so anything else raises and the caller uses the SDK's parser;
- a constructed model's extra fields are not in its `model_fields_set`; a validated one's are:
  they are taken out here, for the models the SDK constructs (not those it validates);
- the SDK keeps an integer too large for a float exactly (2**53 + 1) in a float field it
  constructs; validation rounds it: such input goes to the SDK's parser;
- a required field missing, an unknown item type, a value of the wrong type: validation raises
  where the SDK tolerates, and the SDK's parser decides.

`Model.build(cls)` reads which fields the SDK constructs from the installed release's
annotations; a model with a constructed field of another kind (a list of floats, a list of
models) gets no fast path at all. `tests/test_transport_parsing.py` compares both parsers field
by field, fields set and extras included, over random shapes of every model and their mutants.
"""

from __future__ import annotations

import functools
import inspect
import types
import typing
from dataclasses import dataclass
from typing import Any, TypeVar

import pydantic

ModelT = TypeVar("ModelT", bound=pydantic.BaseModel)

PLAIN = (str, int, bool, object, Any)
"""Annotations the SDK's `construct` keeps as they are, as a strict validation does."""


@dataclass(frozen=True, slots=True)
class Model:
    """How to settle a validated `cls` into what the SDK's `construct` would have made of the same JSON."""

    cls: type[pydantic.BaseModel]
    floats: tuple[str, ...]
    """The JSON keys of fields the SDK constructs as floats (it keeps inexact integers there)."""
    nested: tuple[tuple[str, str, Model], ...]
    """(field name, JSON key, plan) of model fields the SDK constructs rather than validates."""

    @staticmethod
    @functools.cache
    def build(cls: type[pydantic.BaseModel]) -> Model | None:
        """The plan for `cls`, or None when its constructed fields are of a kind this module does not settle."""
        floats: list[str] = []
        nested: list[tuple[str, str, Model]] = []
        for name, field in cls.model_fields.items():
            key = field.alias or name
            kind = _unwrap(field.annotation)
            if _is_union(kind) or typing.get_origin(kind) is typing.Literal or kind in PLAIN:
                continue  # unions are validated by the SDK too; plain values are kept as is by both
            if kind is float:
                floats.append(key)
            elif inspect.isclass(kind) and issubclass(kind, pydantic.BaseModel):
                plan = Model.build(kind)
                if plan is None:
                    return None
                nested.append((name, key, plan))
            elif not _plain_container(kind):
                return None
        return Model(cls, tuple(floats), tuple(nested))


def parse(cls: type[ModelT], data: Any) -> ModelT | None:
    """`cls` made of `data` as the SDK's non-strict parser makes it, or None where only that parser knows how."""
    plan = Model.build(cls)
    if plan is None or type(data) is not dict or pydantic.VERSION.startswith("1."):
        return None
    try:
        model = cls.model_validate(data, strict=True)
    except pydantic.ValidationError:
        return None
    return model if _settle(plan, model, data) else None


def _settle(plan: Model, model: pydantic.BaseModel, data: dict[str, Any]) -> bool:
    """Take the extras out of the fields set of each constructed model; False where the SDK would differ."""
    for key in plan.floats:
        value = data.get(key)
        if type(value) is int and float(value) != value:
            return False
    extra = model.__pydantic_extra__
    if extra:
        model.__pydantic_fields_set__.difference_update(extra)
    for name, key, inner in plan.nested:
        value = data.get(key)
        if type(value) is dict and not _settle(inner, getattr(model, name), value):
            return False
    return True


def _unwrap(tp: Any) -> Any:
    """The annotation without `Annotated[...]` metadata or a `TypeAliasType` name."""
    while True:
        if typing.get_origin(tp) is typing.Annotated:
            tp = typing.get_args(tp)[0]
        elif not inspect.isclass(tp) and hasattr(tp, "__value__"):  # typing(_extensions).TypeAliasType
            tp = tp.__value__
        else:
            return tp


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType)


def _plain_container(tp: Any) -> bool:
    """A list or dict of plain values or unions: the SDK rebuilds it with the same items, as validation does."""
    if typing.get_origin(tp) not in (list, dict):
        return False
    args = [_unwrap(arg) for arg in typing.get_args(tp)]
    return all(arg in PLAIN or _is_union(arg) or typing.get_origin(arg) is typing.Literal for arg in args)
