"""The `response.create` / `POST /v1/responses` body, validated at the edge."""

from __future__ import annotations

import functools
import re
from typing import Any, Literal, get_args

from openai.types.responses import Response
from openai.types.responses.response_create_params import ResponseCreateParamsBase
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    StrictBool,
    StrictFloat,
    StrictInt,
    TypeAdapter,
    ValidationError,
    field_validator,
)

from . import request_shapes as shapes
from .errors import APIError, invalid
from .limits import DEFAULT_LIMITS, RequestLimits, check_body

STREAM_ID = re.compile(r"^[A-Za-z0-9_.\-]{1,256}$")
ServiceTier = Literal["auto", "default", "flex", "scale", "priority", "fast", "ultrafast"]
"""The SDK's `ServiceTier` (openai/types/responses/service_tier.py); written out, as older SDKs lack the module."""
REASONING_EFFORTS = frozenset({"none", "minimal", "low", "medium", "high", "xhigh", "max"})
"""The SDK's `ReasoningEffort` literals (openai/types/shared/reasoning_effort.py)."""


class CreateRequest(BaseModel):
    """The fields the shim acts on; unknown fields are accepted and ignored, as the API evolves."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1)
    input: Any = None
    instructions: str | None = None
    previous_response_id: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: StrictBool | None = None
    store: StrictBool | None = None
    stream: StrictBool | None = None
    background: StrictBool | None = None
    generate: StrictBool | None = None
    stream_id: str | None = None
    max_output_tokens: StrictInt | None = Field(default=None, ge=1)
    temperature: StrictFloat | None = Field(default=None, ge=0, le=2)
    top_p: StrictFloat | None = Field(default=None, ge=0, le=1)
    metadata: dict[str, str] | None = None
    text: dict[str, Any] | None = None
    user: str | None = None
    reasoning: dict[str, Any] | None = None
    top_logprobs: StrictInt | None = Field(default=None, ge=0, le=20)
    max_tool_calls: StrictInt | None = Field(default=None, ge=1)
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    service_tier: ServiceTier | None = None
    truncation: Literal["auto", "disabled"] | None = None
    include: list[str] | None = None
    _chat_only: dict[str, Any] = PrivateAttr(default_factory=dict)

    @property
    def chat_only(self) -> dict[str, Any]:
        """Chat Completions fields with no Responses equivalent (`stop`, `seed`, ...), set by the chat
        endpoint (`chat_requests.py`): chat backends get them as they are, other backends never see them."""
        return self._chat_only

    @chat_only.setter
    def chat_only(self, fields: dict[str, Any]) -> None:
        self._chat_only = fields

    @field_validator("input")
    @classmethod
    def _input_shape(cls, value: Any) -> Any:
        if value is not None and not isinstance(value, (str, list)):
            raise ValueError("must be a string or an array of input items")
        return value

    @field_validator("text")
    @classmethod
    def _text_format(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        check_text_format(value)
        return value

    @property
    def stores(self) -> bool:
        return self.store is not False


def _text_checked(value: Any) -> bool:
    if not shapes.optional_object(value):
        return False
    try:
        check_text_format(value)
    except ValueError:
        return False
    return True


plainly_valid = shapes.PlainValidator(
    CreateRequest,
    {
        "model": lambda value: value.__class__ is str and value != "",
        "input": frozenset({str, list, type(None)}),
        "instructions": shapes.OPTIONAL_STR,
        "previous_response_id": shapes.OPTIONAL_STR,
        "tools": shapes.optional_objects,
        "tool_choice": shapes.anything,
        "parallel_tool_calls": shapes.OPTIONAL_BOOL,
        "store": shapes.OPTIONAL_BOOL,
        "stream": shapes.OPTIONAL_BOOL,
        "background": shapes.OPTIONAL_BOOL,
        "generate": shapes.OPTIONAL_BOOL,
        "stream_id": shapes.OPTIONAL_STR,
        "max_output_tokens": shapes.optional_int(1),
        "temperature": shapes.optional_float(0, 2),
        "top_p": shapes.optional_float(0, 1),
        "metadata": shapes.optional_string_map,
        "text": _text_checked,
        "user": shapes.OPTIONAL_STR,
        "reasoning": shapes.optional_object,
        "top_logprobs": shapes.optional_int(0, 20),
        "max_tool_calls": shapes.optional_int(1),
        "prompt_cache_key": shapes.OPTIONAL_STR,
        "safety_identifier": shapes.OPTIONAL_STR,
        "service_tier": shapes.optional_choice(get_args(ServiceTier)),
        "truncation": shapes.optional_choice(("auto", "disabled")),
        "include": shapes.optional_strings,
    },
    private=lambda: {"_chat_only": {}},
).build
"""`CreateRequest.model_validate` for bodies whose every field plainly passes (`request_shapes`), else None."""


def check_text_format(value: dict[str, Any] | None) -> None:
    """`text.format`, as the SDK's types allow it (ValueError: why not)."""
    fmt = (value or {}).get("format")
    if fmt is None:
        return
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind not in ("text", "json_object", "json_schema"):
        raise ValueError("format.type must be 'text', 'json_object' or 'json_schema'")
    if kind == "json_schema" and not (isinstance(fmt.get("name"), str) and isinstance(fmt.get("schema"), dict)):
        raise ValueError("a json_schema format needs a 'name' and a 'schema' object")


def parse_create(
    body: dict[str, Any], *, websocket: bool, limits: RequestLimits = DEFAULT_LIMITS, depth: int | None = None
) -> CreateRequest:
    """Validate a request body against the limits and the schema; errors carry the offending parameter.

    `depth`: the document's nesting depth (or a bound on it) when its text was measured (`json_shape`),
    sparing the walks. A body of the common shapes is validated by plain checks (`request_shapes`), anything
    else (and every refusal) by the model.
    """
    metadata = body.get("metadata")
    if metadata is not None:
        check_metadata(metadata)
    check_body(body, limits, depth)
    request = plainly_valid(body, skip="type" if websocket else None)
    if request is None:
        fields = {k: v for k, v in body.items() if k != "type"} if websocket else body
        try:
            request = CreateRequest.model_validate(fields)
        except ValidationError as exc:
            raise validation_error(exc) from None
    if websocket and request.background:
        raise invalid(
            "unsupported_parameter",
            "'background: true' is not supported over WebSocket; use HTTP for background responses.",
            "background",
        )
    extra = request.__pydantic_extra__  # what `model_extra` returns, without a property call
    if extra and extra.get("conversation") is not None:
        raise invalid(
            "unsupported_parameter",
            "'conversation' is not supported by this server; chain with 'previous_response_id'.",
            "conversation",
        )
    if extra:
        check_echoed_extras(extra)
    effort = request.reasoning.get("effort") if request.reasoning else None
    if effort is not None and effort not in REASONING_EFFORTS:
        raise invalid(
            "invalid_value",
            f"Invalid value for 'reasoning.effort': expected one of {sorted(REASONING_EFFORTS)}, got {effort!r}.",
            "reasoning.effort",
        )
    if request.stream_id is not None and not websocket:
        raise invalid("unsupported_parameter", "'stream_id' is only valid over WebSocket.", "stream_id")
    return request


METADATA_MAX_PAIRS = 16
METADATA_MAX_KEY = 64
METADATA_MAX_VALUE = 512


def check_metadata(metadata: Any) -> None:
    """OpenAI's limits on `metadata` (16 pairs, keys up to 64 characters, values up to 512), checked before
    anything walks it: each response echoes it (stored, cached, sent), so 150,000 keys were held three times."""
    if not isinstance(metadata, dict):
        return  # None, or a wrong type that validation names
    if len(metadata) > METADATA_MAX_PAIRS:
        raise invalid(
            "invalid_value",
            f"Invalid 'metadata': too many properties. Expected an object with at most {METADATA_MAX_PAIRS} "
            f"properties, but got an object with {len(metadata)} properties instead.",
            "metadata",
        )
    for key, value in metadata.items():
        if len(key) > METADATA_MAX_KEY:
            raise invalid(
                "invalid_value",
                f"Invalid 'metadata': key {key[:METADATA_MAX_KEY]!r}... is {len(key)} characters long; "
                f"keys may have at most {METADATA_MAX_KEY}.",
                "metadata",
            )
        if isinstance(value, str) and len(value) > METADATA_MAX_VALUE:
            raise invalid(
                "invalid_value",
                f"Invalid 'metadata.{key}': string too long. Expected a string with maximum length "
                f"{METADATA_MAX_VALUE}, but got a string with length {len(value)} instead.",
                f"metadata.{key}",
            )


def check_stream_id(value: Any) -> str | None:
    """Lane ids are checked before anything else so the error can be sent on the right lane."""
    if value is None:
        return None
    if not isinstance(value, str) or not STREAM_ID.match(value):
        raise invalid(
            "invalid_stream_id",
            "Invalid 'stream_id': expected 1-256 characters of [A-Za-z0-9_.-].",
            "stream_id",
        )
    return value


@functools.cache
def _echoed_extras() -> dict[str, TypeAdapter[Any]]:
    """Fields the shim does not declare but the Response object echoes (`prompt`, `image`, `moderation`...: the
    installed SDK's, whatever its version), each with the type the Response gives it."""
    names = (frozenset(Response.model_fields) & frozenset(ResponseCreateParamsBase.__annotations__)) - frozenset(
        CreateRequest.model_fields
    )
    return {name: TypeAdapter(Response.model_fields[name].annotation or Any) for name in sorted(names)}


def check_echoed_extras(extra: dict[str, Any]) -> None:
    """An undeclared field the Response object echoes must be what the SDK's `Response` takes there: echoed
    as sent, `{"prompt": "x"}` made every response event fail the SDK's typed parser (and `response.prompt.id`
    an `AttributeError` for the caller). Only requests with unknown fields pay for this."""
    for name, adapter in _echoed_extras().items():
        if name in extra:
            try:
                adapter.validate_python(extra[name])
            except ValidationError as exc:
                raise validation_error(exc, name) from None


def validation_error(exc: ValidationError, field: str | None = None) -> APIError:
    """The first error as a 400 naming its parameter (`field`: the field validated on its own, as its root)."""
    error = exc.errors()[0]
    loc = (field, *error["loc"]) if field else error["loc"]
    param = ".".join(str(part) for part in loc) if loc else None
    if error["type"] == "missing":
        return invalid("missing_required_parameter", f"Missing required parameter: '{param}'.", param)
    message = str(error["msg"]).removeprefix("Value error, ")  # pydantic's prefix for a validator's ValueError
    return invalid("invalid_value", f"Invalid value for '{param}': {message}.", param)
