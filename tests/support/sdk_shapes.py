"""Random JSON of any shape an `openai` model accepts, and a comparison of SDK objects that misses nothing.

Used to prove that `ws_transport`'s fast parsing gives the caller exactly what the SDK's own
parser gives: `shape(Response, rng)` walks the installed SDK's type annotations (so every
output item, tool, content part and union variant of the installed release comes up), and
`difference(a, b)` compares two parsed objects class by class, field by field, including the
fields a model records as set (`model_dump(exclude_unset=True)` reads them) and its extra fields.
"""

from __future__ import annotations

import datetime
import enum
import inspect
import random
import types
import typing
from typing import Any

import pydantic

WORDS = ("", "x", "hello", "function_call", "message", "auto", "1", "{}", "é\u2028")
MAX_DEPTH = 7


def shape(tp: Any, rng: random.Random, depth: int = 0) -> Any:
    """A JSON value valid for the annotation `tp` (optional fields present or not, union variants at random)."""
    tp = _unwrap(tp)
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        options = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(options) < len(typing.get_args(tp)) and (depth > MAX_DEPTH or rng.random() < 0.2):
            return None
        return shape(rng.choice(options), rng, depth + 1)
    if origin is typing.Literal:
        return rng.choice(typing.get_args(tp))
    if origin in (list, typing.List):  # noqa: UP006
        (item,) = typing.get_args(tp) or (Any,)
        return [shape(item, rng, depth + 1) for _ in range(0 if depth > MAX_DEPTH else rng.randint(0, 2))]
    if origin in (dict, typing.Dict):  # noqa: UP006
        args = typing.get_args(tp)
        value = args[1] if len(args) == 2 else Any
        return {rng.choice(WORDS[1:]): shape(value, rng, depth + 1) for _ in range(rng.randint(0, 2))}
    if inspect.isclass(tp) and issubclass(tp, pydantic.BaseModel):
        return _model(tp, rng, depth)
    return _leaf(tp, rng)


def _model(cls: type[pydantic.BaseModel], rng: random.Random, depth: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, field in cls.model_fields.items():
        if field.is_required() or (depth <= MAX_DEPTH and rng.random() < 0.6):
            out[field.alias or name] = shape(field.annotation, rng, depth + 1)
    return out


def _leaf(tp: Any, rng: random.Random) -> Any:
    if tp is bool:
        return rng.random() < 0.5
    if tp is int:
        return rng.choice((0, 1, 7, 2**40))
    if tp is float:
        return rng.choice((0, 1, 0.5, 1.5e9, 2))  # ints too: JSON numbers the SDK turns into floats
    if tp is str:
        return rng.choice(WORDS)
    if inspect.isclass(tp) and issubclass(tp, enum.Enum):
        return rng.choice(list(tp)).value
    if tp is datetime.datetime:
        return "2026-12-01T18:00:00Z"
    return rng.choice((None, 1, "x", [1, "y"], {"k": [True, None]}))  # object / Any: any JSON


def _unwrap(tp: Any) -> Any:
    """The annotation without `Annotated[...]` metadata or a `TypeAliasType` name."""
    while True:
        if hasattr(tp, "__value__") and not inspect.isclass(tp):  # typing(_extensions).TypeAliasType
            tp = tp.__value__
        elif typing.get_origin(tp) is typing.Annotated:
            tp = typing.get_args(tp)[0]
        else:
            return tp


def difference(a: Any, b: Any, path: str = "$") -> str | None:
    """Where `a` and `b` differ (class, field values, fields set, extra fields), or None when they do not."""
    if type(a) is not type(b):
        return f"{path}: {type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, pydantic.BaseModel):
        for attr in ("__pydantic_fields_set__", "__pydantic_private__"):
            if getattr(a, attr) != getattr(b, attr):
                return f"{path}: {attr} {getattr(a, attr)} vs {getattr(b, attr)}"
        return difference(a.__pydantic_extra__, b.__pydantic_extra__, path + "<extra>") or difference(
            a.__dict__, b.__dict__, path
        )
    if isinstance(a, dict):
        if list(a) != list(b):
            return f"{path}: keys {list(a)} vs {list(b)}"
        return next((d for k in a if (d := difference(a[k], b[k], f"{path}.{k}")) is not None), None)
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return f"{path}: {len(a)} items vs {len(b)}"
        return next(
            (
                d
                for i, (x, y) in enumerate(zip(a, b, strict=True))
                if (d := difference(x, y, f"{path}[{i}]")) is not None
            ),
            None,
        )
    if a != b or (isinstance(a, float) and repr(a) != repr(b)):
        return f"{path}: {a!r} vs {b!r}"
    return None
