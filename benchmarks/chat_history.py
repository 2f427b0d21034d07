"""The client's CPU per `chat.completions.create` through `ws_transport.wrap()` as the history grows.

A Chat Completions tool loop (every reply a tool call, every turn a ~1 KB tool result) against
the shim in a child process (simulated backend, no delay): what the wrapped client spends per call
(process CPU, `time.process_time()`, every thread: the sync client's loop thread included) at
turns 10, 50 and 100. Two ways a caller keeps its history:

- `appended`: one list, the SDK's `ChatCompletionMessage` appended as it came (identity holds);
- `rebuilt`: every call gets freshly built dicts, as LangChain, AutoGen or LlamaIndex convert their
  own message objects each turn (identity never holds; only the values are the same).

If the prefix match or the translation of the answered messages were redone per call, `rebuilt`
would grow with the turn; chaining should keep both flat.

    python -m benchmarks.chat_history [--turns 100] [--repeats 2] [--out benchmarks/results/chat_history.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
from openai import OpenAI

import ws_transport
from ws_transport.chat_wrap import prepare_chat

from .common import Subprocess, free_port, machine_info, progress, shim_command

MODEL = "simulated-1"
MARKS = (10, 50, 100)
WINDOW = 5
PAYLOAD = 1000
REPS = 20
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Fetch a record.",
            "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
        },
    }
]


def user(turn: int) -> dict[str, Any]:
    return {"role": "user", "content": f"Step {turn}: fetch the next record.\ncall lookup {json.dumps({'n': turn})}"}


def rebuilt(messages: list[Any]) -> list[dict[str, Any]]:
    """Fresh dicts saying the same thing, as a framework converting its own messages each call."""
    out = []
    for message in messages:
        data = message if isinstance(message, dict) else message.model_dump(exclude_none=True)
        out.append(json.loads(json.dumps(data)))
    return out


def loop(base_url: str, turns: int, *, rebuild: bool) -> tuple[list[float], dict[int, float]]:
    """Per-call client CPU (s) of a tool loop of `turns` calls through `wrap()`, and at each mark the
    CPU of preparing the call alone (translation and prefix match, `prepare_chat`; mean of REPS)."""
    samples: list[float] = []
    prepare: dict[int, float] = {}
    with ws_transport.wrap(OpenAI(base_url=base_url, api_key="bench", max_retries=0)) as client:
        session = ws_transport.session_of(client)
        messages: list[Any] = [{"role": "system", "content": "You fetch records."}, user(0)]
        for turn in range(turns):
            sent = rebuilt(messages) if rebuild else messages
            if turn + 1 in MARKS:
                prepare[turn + 1] = _prepare_cpu(session, sent)
            start = time.process_time()
            completion = client.chat.completions.create(model=MODEL, messages=sent, tools=TOOLS)  # type: ignore[arg-type]
            samples.append(time.process_time() - start)
            message = completion.choices[0].message
            messages.append(message)
            for call in message.tool_calls or ():
                messages.append(
                    {"role": "tool", "tool_call_id": call.id, "content": f"record {turn}: " + "x" * PAYLOAD}
                )
            if not message.tool_calls:
                messages.append(user(turn + 1))
        if session.stats.turns_chained != turns - 1:
            raise RuntimeError(f"expected {turns - 1} chained calls, got {session.stats.turns_chained}")
    return samples, prepare


def _prepare_cpu(session: Any, messages: list[Any]) -> float:
    """CPU seconds of `prepare_chat` for this call (what grows with the history if anything does)."""
    start = time.process_time()
    for _ in range(REPS):
        prepare_chat(session, {"model": MODEL, "messages": messages, "tools": TOOLS})
    return (time.process_time() - start) / REPS


def at_marks(runs: list[list[float]]) -> dict[int, float]:
    """Median ms over the WINDOW calls ending at each mark, over the runs."""
    return {
        mark: round(statistics.median(s * 1000 for run in runs for s in run[max(0, mark - WINDOW) : mark]), 3)
        for mark in MARKS
        if all(len(run) >= mark for run in runs)
    }


def measure(turns: int, repeats: int) -> dict[str, dict[str, dict[int, float]]]:
    port = free_port()
    log_path = Path(tempfile.gettempdir()) / f"chat-history-shim-{port}.log"
    with Subprocess(shim_command(port), ready_url=f"http://127.0.0.1:{port}/healthz", log_path=log_path):
        base_url = f"http://127.0.0.1:{port}/v1"
        loop(base_url, 3, rebuild=True)  # warm-up: imports, first connection
        result = {}
        for name, rebuild in (("appended", False), ("rebuilt", True)):
            runs = [loop(base_url, turns, rebuild=rebuild) for _ in range(repeats)]
            prepared = {mark: round(statistics.median(r[1][mark] for r in runs) * 1000, 3) for mark in runs[0][1]}
            result[name] = {"call_ms": at_marks([r[0] for r in runs]), "prepare_ms": prepared}
            progress(f"chat_history: {name} done")
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/chat_history.json"))
    args = parser.parse_args(argv)
    result = measure(args.turns, args.repeats)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(
        orjson.dumps(
            {"machine": machine_info(), "turns": args.turns, "results": result}, option=orjson.OPT_NON_STR_KEYS
        )
    )
    print("client CPU per chat.completions.create through wrap(), ms: the whole call (median of the 5 calls")
    print("ending at turn N) and its preparation alone (translation + prefix match, prepare_chat)")
    for name, figures in result.items():
        for what, marks in figures.items():
            print(f"  {name:9s} {what:10s} " + "  ".join(f"turn {mark}: {ms:.3f}" for mark, ms in marks.items()))


if __name__ == "__main__":
    main()
