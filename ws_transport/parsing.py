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

The SDK's unions of items (`output`, `tools`, content parts...) name their variant in a `type`
field the SDK's metadata marks as discriminator, which pydantic does not read: validating such
a union tries every variant (28 for an output item) and keeps the one that fits. Where every
variant requires its own literal `type`, only the variant the tag names can fit, so the
validator used here is the model's own core schema with those unions made tagged unions
(`tagged_schema`): the same objects, one variant tried instead of all.

`Model.build(cls)` reads which fields the SDK constructs from the installed release's
annotations; a model with a constructed field of another kind (a list of floats, a list of
models) gets no fast path at all. `tests/test_transport_parsing.py` compares both parsers field
by field, fields set and extras included, over random shapes of every model and their mutants.
"""

from __future__ import annotations

import functools
import inspect
import logging
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import pydantic
from pydantic_core import SchemaValidator

ModelT = TypeVar("ModelT", bound=pydantic.BaseModel)
log = logging.getLogger("ws_transport")

PLAIN = (str, int, bool, object, Any)
"""Annotations the SDK's `construct` keeps as they are, as a strict validation does."""


@dataclass(frozen=True)
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

    @functools.cached_property
    def validator(self) -> SchemaValidator | None:
        """A validator of `cls`'s fields (its values, extras and fields set), with the unions its variants'
        `type` tells apart made tagged unions; None for a model whose instances pydantic makes otherwise
        (a custom `__init__`, a post-init hook, private attributes, a root model).

        Of `cls`'s fields, not of `cls`: pydantic-core reuses a complete model's own validator wherever its
        schema names the model, so a rewritten schema takes effect only below it."""
        schema = self.cls.__pydantic_core_schema__
        if not isinstance(schema, dict):  # not built yet (the SDK defers building its models' schemas)
            self.cls.model_rebuild(force=True)
            schema = self.cls.__pydantic_core_schema__
        wrapped = schema.get("type") == "definitions"
        model = schema["schema"] if wrapped else schema
        if (
            model.get("type") != "model"
            or model.get("custom_init")
            or model.get("root_model")
            or "post_init" in model
            or self.cls.__private_attributes__
        ):
            return None
        fields = {**schema, "schema": model["schema"]} if wrapped else model["schema"]
        return _built(lambda: SchemaValidator(tagged_schema(fields), config=model.get("config")))  # type: ignore[arg-type]


def parse(cls: type[ModelT], data: Any) -> ModelT | None:
    """`cls` made of `data` as the SDK's non-strict parser makes it, or None where only that parser knows how."""
    if PYDANTIC_V1 or type(data) is not dict:
        return None
    plan = Model.build(cls)
    validator = None if plan is None else plan.validator
    if plan is None or validator is None:
        return None
    try:
        result = validator.validate_python(data, strict=True)
    except pydantic.ValidationError:
        return None
    if type(result) is not tuple or len(result) != 3:  # (values, extras, fields set) in every pydantic-core 2.x
        return None
    values, extra, fields_set = result
    model = cls.__new__(cls)  # as pydantic-core's model validator makes one
    _setattr(model, "__dict__", values)
    _setattr(model, "__pydantic_extra__", extra)
    _setattr(model, "__pydantic_fields_set__", fields_set)
    _setattr(model, "__pydantic_private__", None)
    return model if _settle(plan, model, data) else None


_setattr = object.__setattr__
PYDANTIC_V1 = pydantic.VERSION.startswith("1.")


def _built(build: Any) -> SchemaValidator | None:
    """`build()`, or None (no fast path, the SDK's parser) when a pydantic-core release refuses the rewritten schema."""
    try:
        validator: SchemaValidator = build()
    except Exception as exc:  # SchemaError, or a schema shape this module did not expect
        log.warning("ws_transport: parsing with the SDK's own parser (the fast validator failed to build: %s)", exc)
        return None
    return validator


def parse_union(union: Any, data: Any) -> Any:
    """A value of the union type `union` (the SDK's stream events) made of `data` as the SDK's parser makes it,
    or None where only that parser knows how (`union_parser(union)(data)`).

    For a union the SDK's parser is pydantic: it validates `data` against the whole union (leniently)
    and constructs a variant only when that fails. The same validation with the union tagged gives
    the same object (only the variant the `type` names can fit); a failure is left to the SDK.
    """
    return union_parser(union)(data)


@functools.cache
def union_parser(union: Any) -> Callable[[Any], Any]:
    """`parse_union` for one union, to look up once and call per value: finding the cached validator by the
    union hashes the SDK's event union (a typing object of ~60 variants), ~17k instructions, more than a
    small event's validation."""
    validator = _union_validator(union)
    if validator is None:
        return _left_to_the_sdk
    validate = validator.validate_python

    def parse(data: Any) -> Any:
        if type(data) is not dict:
            return None
        try:
            return validate(data)
        except pydantic.ValidationError:
            return None

    return parse


def _left_to_the_sdk(data: Any) -> None:
    """The parser of a union with no fast validator: every value goes to the SDK's parser."""
    return None


def _union_validator(union: Any) -> SchemaValidator | None:
    """The validator of the union the SDK's parser validates (`Annotated` metadata off, a type alias kept), tagged."""
    target = union
    while typing.get_origin(target) is typing.Annotated:
        target = typing.get_args(target)[0]
    if PYDANTIC_V1 or not _is_union(_unwrap(target)):
        return None
    return _built(lambda: SchemaValidator(tagged_schema(pydantic.TypeAdapter(target).core_schema)))  # type: ignore[arg-type]


def tagged_schema(schema: Any) -> Any:
    """A copy of a core schema in which each union whose variants all require a distinct literal `type`
    (the SDK's discriminated unions) is a tagged union on `type`."""
    definitions = {d["ref"]: d for d in schema.get("definitions", ())} if schema.get("type") == "definitions" else {}
    return _retag(schema, definitions)


def _retag(node: Any, definitions: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_retag(item, definitions) for item in node]
    if isinstance(node, tuple):
        return tuple(_retag(item, definitions) for item in node)
    if not isinstance(node, dict):
        return node
    out = {key: _retag(value, definitions) for key, value in node.items()}
    if out.get("type") == "union":
        tags = _tags(out["choices"], definitions)
        if tags is not None:
            kept = {k: v for k, v in out.items() if k in ("ref", "metadata", "serialization")}
            return {**kept, "type": "tagged-union", "choices": tags, "discriminator": "type"}
    return out


def _tags(choices: list[Any], definitions: dict[str, Any]) -> dict[str, Any] | None:
    """Each `type` value -> the one variant requiring it, or None when the variants are not told apart so."""
    tags: dict[str, Any] = {}
    for choice in choices:
        if isinstance(choice, tuple):  # (schema, label)
            return None
        values = _required_type(choice, definitions)
        if values is None or any(value in tags for value in values):
            return None
        tags.update(dict.fromkeys(values, choice))
    return tags or None


def _required_type(choice: dict[str, Any], definitions: dict[str, Any]) -> list[str] | None:
    """The string values a model variant's required, unaliased `type` field allows; None for anything else."""
    if choice.get("type") == "definition-ref":
        choice = definitions.get(choice.get("schema_ref", ""), {})
    fields = choice.get("schema", {}).get("fields", {}) if choice.get("type") == "model" else {}
    field = fields.get("type")
    if (
        field is None
        or field.get("validation_alias", "type") != "type"
        or choice["schema"].get("type") != "model-fields"
    ):
        return None
    literal = field["schema"]
    expected = literal.get("expected", []) if literal.get("type") == "literal" else []
    return expected if expected and all(type(value) is str for value in expected) else None


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
