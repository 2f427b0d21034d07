"""A request body of the common shapes validated by plain checks, without a pydantic model build.

`CreateRequest.model_validate` costs ~40,000 instructions even for a chained turn's five fields (the model
has 28, two Python validators and a private attribute), about 2% of such a turn. Most bodies hold values
of one obvious type per field: a string, a boolean, a small integer, a list of objects. Each field here has
a check that accepts only values the model accepts *and keeps as they are* (exact types: a JSON decoder
gives nothing else); a body whose every field passes is built as `model_construct` builds one (its four
slots set), with the same values, fields set and extras. Anything else (a missing `model`, an integer
temperature, a string subclass, any value the model would refuse or convert) returns None, and the
caller validates with the model, so a refusal always carries the model's own error.
`tests/test_request_shapes.py` compares both on generated bodies: same instance, or the model's error.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

Check = Callable[[Any], bool] | frozenset[type]
"""A predicate, or the exact classes a value may have (checked inline, without a call: ~700 instructions less)."""
M = TypeVar("M", bound=BaseModel)
_INT_MAX = 2**63 - 1
_new = object.__new__


OPTIONAL_STR: Check = frozenset({str, type(None)})
OPTIONAL_BOOL: Check = frozenset({bool, type(None)})


def optional_int(low: int, high: int = _INT_MAX) -> Check:
    return lambda value: value is None or (value.__class__ is int and low <= value <= high)


def optional_float(low: float, high: float) -> Check:
    return lambda value: value is None or (value.__class__ is float and low <= value <= high)


def optional_object(value: Any) -> bool:
    """A `dict[str, Any]`: the model keeps an exact dict of string keys as it is (its copy is equal)."""
    return value is None or (value.__class__ is dict and all(key.__class__ is str for key in value))


def optional_strings(value: Any) -> bool:
    return value is None or (value.__class__ is list and all(item.__class__ is str for item in value))


def optional_objects(value: Any) -> bool:
    return value is None or (
        value.__class__ is list and all(optional_object(item) and item is not None for item in value)
    )


def optional_string_map(value: Any) -> bool:
    return value is None or (
        value.__class__ is dict and all(k.__class__ is str and v.__class__ is str for k, v in value.items())
    )


def optional_choice(choices: Iterable[str]) -> Check:
    allowed = frozenset(choices)
    return lambda value: value is None or (value.__class__ is str and value in allowed)


def anything(value: Any) -> bool:
    return True


class PlainValidator(Generic[M]):
    """`model.model_validate(fields)` for the bodies whose every field passes its check; None for the rest.

    `checks` names every field of `model`; each optional field's default must be None (what a body leaves
    out is None, nothing to copy); a body without a required field is the model's to refuse. `extra="allow"`
    models only: any other key is kept as an extra, as the model keeps it. `private` makes the private
    attributes' defaults, as the model's own `model_post_init` would (the only one it may have).
    """

    def __init__(self, model: type[M], checks: dict[str, Check], private: Callable[[], dict[str, Any]]) -> None:
        fields = model.model_fields
        if set(checks) != set(fields) or model.model_config.get("extra") != "allow":
            raise TypeError(f"{model.__name__}: a check for each field, of a model that allows extras")
        optional = [info for info in fields.values() if not info.is_required()]
        if any(info.default is not None or info.default_factory is not None for info in optional):
            raise TypeError(f"{model.__name__}: every optional field defaults to None")
        if set(private()) != set(model.__private_attributes__):
            raise TypeError(f"{model.__name__}: `private` makes each private attribute")
        self.model, self.private = model, private
        self.classes = {name: check for name, check in checks.items() if isinstance(check, frozenset)}
        """The fields whose check is the classes a value may have, apart: tested inline, without a call."""
        self.predicates = {name: check for name, check in checks.items() if not isinstance(check, frozenset)}
        self.required = [name for name, info in fields.items() if info.is_required()]
        self.defaults = dict.fromkeys(fields)
        self.slots = _slot_setters(model)

    def build(self, body: dict[str, Any], skip: str | None = None) -> M | None:
        """The model built from `body` (less its `skip` key) when plain checks settle it, else None.

        Attributes of the model class and instance are not looked up here: pydantic's `__getattr__` hooks
        make each such lookup cost ~700 instructions.
        """
        classes, predicates, values, extra = self.classes, self.predicates, self.defaults.copy(), {}
        for key, value in body.items():
            allowed = classes.get(key)
            if allowed is None:
                check = predicates.get(key)
                if check is None:
                    if key != skip:
                        extra[key] = value
                    continue
                if not check(value):
                    return None
            elif value.__class__ not in allowed:
                return None
            values[key] = value
        for name in self.required:
            if name not in body:
                return None
        given = set(body)
        if skip is not None:
            given.discard(skip)
        instance = _new(self.model)
        set_dict, set_extra, set_fields_set, set_private = self.slots
        set_dict(instance, values)
        set_extra(instance, extra)
        set_fields_set(instance, given)
        set_private(instance, self.private() or None)
        return instance


_SLOTS = ("__dict__", "__pydantic_extra__", "__pydantic_fields_set__", "__pydantic_private__")
"""What `model_construct` sets on an instance it makes (`BaseModel`'s slots), in `PlainValidator.slots`' order."""


def _slot_setters(model: type[BaseModel]) -> tuple[Callable[[Any, Any], None], ...]:
    """The `__set__` of each of `_SLOTS`' descriptors, as `object.__setattr__` finds them on `model` (the first class
    of its MRO defining the name): called directly, each spares `object.__setattr__`'s argument tuple and the
    descriptor's lookup (~450 instructions a slot)."""
    owners = (next(vars(klass)[name] for klass in model.__mro__ if name in vars(klass)) for name in _SLOTS)
    return tuple(descriptor.__set__ for descriptor in owners)
