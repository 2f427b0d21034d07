"""The frames of the hostile review's finding 1 (`loop_stall --suite attack`): legal-sized requests holding
many JSON values, and the server's behaviour before `max_json_values` (a mode the server switches to).

Each frame is under `max_frame_bytes` (4 MiB). Over the bound (100,000 values): 33,000 lists 61 deep in an
unknown field (4 MB, 2.0 M values), 128 tools of 300 described properties (2.4 MB, 116 k values), 5,000
input items of 20 parts (3.3 MB, 315 k values: `conversation_too_large` before, after every pass over it).
Under the bound, accepted: 1,600 lists 61 deep (195 KB, 98 k values), one forced tool whose schema has
40,000 properties, 20,000 of them required (638 KB, 60 k values), 128 tools of 200 properties (636 KB, 52 k).
"""

from __future__ import annotations

from typing import Any

import orjson

from .load import MODEL

ATTACK_MODES = ("before", "after")
ATTACK_KINDS = (
    "lists61_33k",
    "tools128x300",
    "items5000x20",
    "lists61_1600",
    "forced_tool_40k",
    "tools128x200",
)

SERVER_MODES = """
import server_shim.json_slices as json_slices, server_shim.requests as requests_module
import server_shim.turn_settings as turn_settings, server_shim.request_fields as request_fields
from server_shim.json_shape import Shape
from server_shim.limits import DEFAULT_LIMITS
DEFAULT_VALUES = DEFAULT_LIMITS.max_json_values
measured_load, checked_body, forwarded = json_slices.load_measured, requests_module.check_body, turn_settings.responses_fields
async def unmeasured_load(data, nbytes, threshold, max_values, max_depth):
    return await json_slices.load(data, nbytes, threshold), Shape(0, max_depth + 1)
def walked_body(body, limits, depth=None):
    return checked_body(body, limits, None)
def dumped_fields(request):
    return request.model_dump(exclude=set(request_fields.SHIM_FIELDS), exclude_none=True)
async def default_bound_load(data, nbytes, threshold, max_values, max_depth):
    return await measured_load(data, nbytes, threshold, DEFAULT_VALUES, max_depth)
def walks(mode):
    before = mode == "before"
    json_slices.load_measured = {"before": unmeasured_load, "after": default_bound_load}.get(mode, measured_load)
    requests_module.check_body = walked_body if before else checked_body
    turn_settings.responses_fields = dumped_fields if before else forwarded
"""
"""Run in the server process: `walks("before")` puts back what a request cost before `max_json_values` (no
count, the depth walks always, `model_dump` of every forwarded field); `walks("after")` is the shipped code at
the default bound (the large-frame suite raises the server's `max_json_values` so that its 60,000 items are
parsed: any other mode keeps that)."""


def _nested(levels: int) -> Any:
    value: Any = 0
    for _ in range(levels - 1):
        value = [value]
    return value


def _tools(count: int, properties: int, described: bool) -> list[dict[str, Any]]:
    schema = {"type": "string", "description": "d" * 20} if described else {"type": "string"}
    props = {f"p{j}": schema for j in range(properties)}
    return [
        {"type": "function", "name": f"f{t}", "parameters": {"type": "object", "properties": props}}
        for t in range(count)
    ]


def attack_frames() -> dict[str, bytes]:
    def frame(**fields: Any) -> bytes:
        body = {"type": "response.create", "model": MODEL, "store": False, "max_output_tokens": 1, **fields}
        return orjson.dumps({"input": "x", **body})

    forced: dict[str, Any] = {f"p{j}": {} for j in range(40_000)}
    return {
        "lists61_33k": frame(zzz=[_nested(61)] * 33_000),
        "tools128x300": frame(tools=_tools(128, 300, described=True)),
        "items5000x20": frame(
            input=[{"role": "user", "content": [{"type": "input_text", "text": ""}] * 20} for _ in range(5_000)]
        ),
        "lists61_1600": frame(zzz=[_nested(61)] * 1_600),
        "forced_tool_40k": frame(
            tools=[
                {
                    "type": "function",
                    "name": "f",
                    "parameters": {"type": "object", "properties": forced, "required": list(forced)[:20_000]},
                }
            ],
            tool_choice={"type": "function", "name": "f"},
        ),
        "tools128x200": frame(tools=_tools(128, 200, described=False)),
    }
