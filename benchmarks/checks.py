"""Suite `checks`: what stateful incremental checks save, and what running them beside inference saves.

- per-turn cost: the built-in checks (a 200-word content policy, secrets with redaction, and the
  model guard against an in-process simulated guard deployment) on turn N of a conversation, N in
  10, 50, 200: incremental (the new items from the previous response's state, as a chained turn
  does) vs full history (every run from the initial state, as a stateless HTTP turn does). The
  time is the checks' fold alone (`server_shim.checks.fold`), median of the repeats; the guard
  calls per turn are counted (with a real guard model each call is an inference);
- time to first token: a real shim on loopback (the SDK over WebSocket, chained turns), the
  simulated backend with a 30 ms time to first token, and a 20 ms blocking check: no check,
  the check before inference (`checks_overlap = false`), and the check beside inference.
  The three run turn by turn in rotation, so they see the same machine load.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from pathlib import Path
from typing import Any

from openai import AsyncOpenAI

from server_shim import BackgroundServer, Settings, create_app
from server_shim.backends import SimulatedBackend
from server_shim.backends.base import BackendRequest
from server_shim.checks import Check, Finding, fold
from server_shim.items import Item
from server_shim.policies import ContentPolicy, Guard, Secrets

from .common import clean_floats, machine_info, perf, progress, rotated, summarize, write_json
from .plot import _pyplot
from .report import fmt, format_table

MODEL = "simulated-1"
TURN_POINTS = (10, 50, 200)
CHECK_S = 0.020
BACKEND_TTFT_S = 0.030
WORDS = [f"bannedword{i}" for i in range(200)]
FILLER = "the agent reads the file, runs the tests and reports what it found in the module "


class CountingGuard(SimulatedBackend):
    """The simulator in guard mode, counting the requests the guard check sends it."""

    def __init__(self) -> None:
        super().__init__(guard={"S1": ["attack"]})
        self.calls = 0
        self.chars = 0

    async def stream(self, request: BackendRequest) -> Any:
        self.calls += 1
        self.chars += sum(len(str(item.get("content", ""))) for item in request.history.items)
        async for delta in super().stream(request):
            yield delta


def _conversation(turns: int, seed: int = 7) -> list[tuple[list[Item], list[Item]]]:
    """(new input, model output) per turn: a user message (sometimes with an email), a tool-sized reply."""
    rng = random.Random(seed)
    pairs = []
    for turn in range(turns):
        text = FILLER * 3 + (f" mail dev{turn}@example.com" if rng.random() < 0.2 else "")
        said = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": FILLER * 2}]}
        pairs.append(([{"type": "message", "role": "user", "content": text}], [said]))
    return pairs


def _checks(guard: CountingGuard) -> list[Check]:
    return [
        Secrets(action="redact"),
        ContentPolicy(words=WORDS, action="block"),
        Guard(backend=guard, model="guard", action="block"),
    ]


async def _cost_at(turn: int, repeats: int) -> dict[str, Any]:
    pairs = _conversation(turn)
    guard = CountingGuard()
    checks = _checks(guard)
    states: dict[str, Any] = {}
    prior: list[Item] = []
    for new, output in pairs[:-1]:  # the chain up to the previous response, as a chained turn finds it
        outcome = await fold(checks, states, prior, new)
        states, prior = {**states, **outcome.states}, output
    history = [item for new, output in pairs[:-1] for item in (*new, *output)] + pairs[-1][0]
    samples: dict[str, list[float]] = {"incremental": [], "full_history": []}
    calls: dict[str, int] = {}
    for repeat in range(repeats):
        for mode in rotated(list(samples), repeat):
            guard.calls = guard.chars = 0
            t0 = perf()
            if mode == "incremental":
                await fold(checks, states, prior, pairs[-1][0])
            else:
                await fold(checks, {}, [], history)
            samples[mode].append((perf() - t0) * 1000)
            calls[mode], calls[f"{mode}_chars"] = guard.calls, guard.chars
    return {
        "turn": turn,
        "incremental_ms": summarize(samples["incremental"]),
        "full_history_ms": summarize(samples["full_history"]),
        "guard_calls": {"incremental": calls["incremental"], "full_history": calls["full_history"]},
        "guard_chars": {"incremental": calls["incremental_chars"], "full_history": calls["full_history_chars"]},
    }


class SleepCheck:
    """A blocking check that takes CHECK_S (a remote policy service, say) and passes."""

    name = "sleep20"
    mutates = False
    blocking = True

    def initial(self) -> int:
        return 0

    def observe(self, state: int, items: list[Item]) -> int:
        return state

    async def inspect(self, state: int, items: list[Item]) -> tuple[int, Finding]:
        await asyncio.sleep(CHECK_S)
        return state + 1, Finding()


async def _ttft_turn(conn: Any, previous: str | None) -> tuple[str, float]:
    t0 = perf()
    await conn.response.create(model=MODEL, input="next step", previous_response_id=previous, store=False)
    first = None
    async for event in conn:
        if event.type == "response.output_text.delta" and first is None:
            first = perf() - t0
        if event.type == "response.completed":
            assert first is not None
            return event.response.id, first * 1000
        if event.type in ("response.failed", "error"):
            raise RuntimeError(f"turn failed: {event}")
    raise RuntimeError("no terminal event")


async def _ttft(turns: int) -> dict[str, Any]:
    modes = {"no_check": (False, []), "sequential": (False, [SleepCheck()]), "overlapped": (True, [SleepCheck()])}
    servers = {}
    for mode, (overlap, checks) in modes.items():
        settings = Settings(checks_overlap=overlap, usage_ledger="off")
        backend = SimulatedBackend(ttft_s=BACKEND_TTFT_S, tokens_per_s=2000)
        servers[mode] = BackgroundServer(create_app(settings, backend=backend, checks=checks), settings).start()
    samples: dict[str, list[float]] = {mode: [] for mode in modes}
    try:
        async with contextlib.AsyncExitStack() as stack:
            conns = {}
            for mode, server in servers.items():
                client = await stack.enter_async_context(AsyncOpenAI(base_url=server.base_url, api_key="x"))
                conns[mode] = await stack.enter_async_context(client.responses.connect())
            previous: dict[str, str | None] = dict.fromkeys(modes)
            for turn in range(turns):
                for mode in rotated(list(modes), turn):
                    previous[mode], took = await _ttft_turn(conns[mode], previous[mode])
                    if turn >= 2:  # warm-up
                        samples[mode].append(took)
    finally:
        for server in servers.values():
            await asyncio.to_thread(server.stop)
    return {mode: summarize(values) for mode, values in samples.items()}


def run(out: Path, *, quick: bool = False, repeats: int = 15, turns: int = 40) -> dict[str, Any]:
    if quick:
        repeats, turns = 2, 5
    points = (10, 20) if quick else TURN_POINTS
    cost = []
    for turn in points:
        progress(f"checks: per-turn cost at turn {turn}")
        cost.append(asyncio.run(_cost_at(turn, repeats)))
    progress(f"checks: time to first token, {turns} chained turns per mode")
    ttft = asyncio.run(_ttft(turns))
    result = clean_floats(
        {
            "suite": "checks",
            "config": {
                "quick": quick,
                "repeats": repeats,
                "ttft_turns": turns,
                "check_ms": CHECK_S * 1000,
                "backend_ttft_ms": BACKEND_TTFT_S * 1000,
                "checks": "secrets(redact), content_policy(200 words, block), guard(simulated, block)",
            },
            "machine": machine_info(),
            "cost": cost,
            "ttft_ms": ttft,
        }
    )
    write_json(out, "checks", result)
    _plot(result, out / "checks.png")
    return result


def table(result: dict[str, Any]) -> str:
    rows = [["turn", "incremental ms", "full history ms", "ratio", "guard calls (incr / full)"]]
    for point in result["cost"]:
        incr, full = point["incremental_ms"]["median"], point["full_history_ms"]["median"]
        calls = point["guard_calls"]
        ratio = full / incr if incr and full else None
        rows.append(
            [
                str(point["turn"]),
                fmt(incr, 3),
                fmt(full, 3),
                fmt(ratio, 1) + "x",
                f"{calls['incremental']} / {calls['full_history']}",
            ]
        )
    ttft = [["time to first token", "p50 ms", "p90 ms"]]
    for mode, stats in result["ttft_ms"].items():
        ttft.append([mode, fmt(stats["median"], 1), fmt(stats["p90"], 1)])
    cfg = result["config"]
    title = f"checks (per-turn cost: {cfg['checks']}; TTFT: {cfg['check_ms']:g} ms check, backend TTFT {cfg['backend_ttft_ms']:g} ms)"
    return "\n".join([title, format_table(rows), "", format_table(ttft)])


def _plot(result: dict[str, Any], path: Path) -> Path | None:
    plt = _pyplot()
    if plt is None:
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    turns = [p["turn"] for p in result["cost"]]
    for key, label, colour in (
        ("incremental_ms", "incremental", "tab:green"),
        ("full_history_ms", "full history", "tab:red"),
    ):
        left.plot(turns, [p[key]["median"] for p in result["cost"]], marker="o", label=label, color=colour)
    left.set_yscale("log")
    left.set_xlabel("turn")
    left.set_ylabel("checks per turn, ms (median)")
    left.set_title("per-turn cost of the checks")
    left.grid(True, which="both", alpha=0.3)
    left.legend()
    modes = list(result["ttft_ms"])
    right.bar(modes, [result["ttft_ms"][m]["median"] for m in modes], color=["tab:gray", "tab:red", "tab:green"])
    right.set_ylabel("time to first token, ms (median)")
    right.set_title(f"{result['config']['check_ms']:g} ms check: sequential vs overlapped")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
