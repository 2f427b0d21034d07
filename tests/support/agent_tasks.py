"""Tasks for real framework agents against the shim's simulated backend.

The simulator calls a tool when the newest user message has a line `call NAME {json}`, and
answers a tool result with text that contains it (README, "The simulated backend"). So each task
is two model turns: the tool call, then the answer quoting the tool's result. An agent that runs
the tasks one after another on one conversation makes `2 * len(TASKS)` turns; every turn after
the first can continue the previous one.
"""

from __future__ import annotations

import json

RECORDS = (3, 4, 5)
TASKS = [f"Find record {n}.\ncall lookup {json.dumps({'n': n})}" for n in RECORDS]


def lookup(n: int) -> str:
    """Look up a record by number."""
    return f"record {n} is blue"


def answered(outputs: list[str]) -> bool:
    """Each task's final answer quotes its own tool result."""
    if len(outputs) != len(RECORDS):
        return False
    return all(f"record {n} is blue" in out for n, out in zip(RECORDS, outputs, strict=True))
