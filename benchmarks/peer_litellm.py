"""Suite 4, `litellm`: LiteLLM's proxy as the peer, in front of the same backend, on the same turns.

Setup (benchmarks/litellm_setup.py) installs LiteLLM into its own virtualenv
(benchmarks/.litellm-venv), never into the project. Three child processes on loopback:

- the backend: the simulated backend behind an OpenAI-compatible Chat Completions server
  (benchmarks/chat_server.py), zero latency, one output token a turn;
- the shim: `responses-ws serve --backend http://127.0.0.1:PORT/v1` (its OpenAI-compatible backend);
- LiteLLM's proxy (`litellm --config`), with three deployments of that same backend:
  `openai/` for chat completions, `openai/` + `use_chat_completions_api: true` for
  `/v1/responses` over HTTP, and `custom_openai/` for its WebSocket handler.

The same conversation as the overhead suite (50 turns, ~4 KB new input each) runs through each
variant with the official SDK. The backend logs how many messages each request carried, so each
variant is checked for forwarding the whole history; a variant that drops it is reported and
left out of the comparison. Added latency = a variant's turn time minus the direct call's turn
time (same repeat, same turn). Proxy CPU per turn comes from /proc for the proxy process tree.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
from openai import AsyncOpenAI

from . import loops, plot
from .common import (
    REPO_ROOT,
    Recorder,
    Subprocess,
    clean_floats,
    cpu_seconds,
    free_port,
    machine_info,
    paired_ratios,
    progress,
    rotated,
    shim_command,
    summarize,
    timed_http_client,
    write_json,
)
from .litellm_setup import DEFAULT_SPEC, DEFAULT_VENV, ensure_litellm, litellm_binary
from .report import fmt, format_table
from .turns import MODEL, expected_backend_messages

MASTER_KEY = "sk-bench-master"
LITELLM_ENV = {
    "LITELLM_TELEMETRY_DISABLED": "true",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_LOG": "ERROR",
    "LITELLM_MODE": "PRODUCTION",
    "NO_DOCS": "True",
}
CHAT_MODEL, RESPONSES_MODEL, WS_MODEL = "sim-chat", "sim-responses", "sim-ws"


def litellm_config(backend_url: str) -> dict[str, Any]:
    params = {"api_base": backend_url, "api_key": "sk-sim"}
    return {
        "model_list": [
            {"model_name": CHAT_MODEL, "litellm_params": {"model": f"openai/{MODEL}", **params}},
            {
                "model_name": RESPONSES_MODEL,
                "litellm_params": {"model": f"openai/{MODEL}", "use_chat_completions_api": True, **params},
            },
            {"model_name": WS_MODEL, "litellm_params": {"model": f"custom_openai/{MODEL}", **params}},
        ],
        "general_settings": {"master_key": MASTER_KEY},
        "litellm_settings": {"telemetry": False, "drop_params": True, "set_verbose": False},
    }


@dataclass
class Servers:
    backend: Subprocess
    backend_url: str
    shim: Subprocess
    shim_url: str
    litellm: Subprocess
    litellm_url: str


Loop = Callable[[AsyncOpenAI, Recorder, int], Awaitable[list[dict[str, Any]]]]


@dataclass(frozen=True)
class Variant:
    name: str
    label: str
    server: str  # "backend", "shim" or "litellm": where the client connects and whose CPU counts
    loop: Loop
    comparable: bool = True  # False: a check of what the peer does, not a like-for-like alternative


VARIANTS: tuple[Variant, ...] = (
    Variant("direct_chat", "backend direct: chat completions, full history", "backend", loops.chat_completions),
    Variant("shim_websocket", "shim: WebSocket, previous_response_id", "shim", loops.websocket),
    Variant("shim_http_stateless", "shim: HTTP /v1/responses, full history", "shim", loops.http_responses),
    Variant(
        "litellm_chat",
        "LiteLLM: chat completions, full history",
        "litellm",
        lambda c, r, t: loops.chat_completions(c, r, t, model=CHAT_MODEL),
    ),
    Variant(
        "litellm_responses",
        "LiteLLM: HTTP /v1/responses, full history (use_chat_completions_api)",
        "litellm",
        lambda c, r, t: loops.http_responses(c, r, t, model=RESPONSES_MODEL),
    ),
    Variant(
        "litellm_websocket",
        "LiteLLM: WebSocket /v1/responses, previous_response_id (custom_openai)",
        "litellm",
        lambda c, r, t: loops.websocket(c, r, t, model=WS_MODEL),
    ),
    Variant(
        "litellm_websocket_full",
        "LiteLLM: WebSocket /v1/responses, full history each turn (custom_openai)",
        "litellm",
        lambda c, r, t: loops.websocket(c, r, t, model=WS_MODEL, chained=False),
    ),
    Variant(
        "litellm_http_chained",
        "LiteLLM: HTTP /v1/responses, previous_response_id + store, no database",
        "litellm",
        lambda c, r, t: loops.http_responses(c, r, t, model=RESPONSES_MODEL, chained=True),
        comparable=False,
    ),
)
BASELINE = "direct_chat"
PAIRS = [
    ("shim_websocket", "litellm_websocket"),
    ("shim_websocket", "litellm_websocket_full"),
    ("shim_websocket", "litellm_responses"),
    ("shim_websocket", "litellm_chat"),
    ("shim_http_stateless", "litellm_responses"),
]


def start_servers(out_dir: Path, venv: Path) -> Servers:
    logs = out_dir / "logs"
    backend_port, shim_port, litellm_port = free_port(), free_port(), free_port()
    backend_root = f"http://127.0.0.1:{backend_port}"
    backend = Subprocess(
        [sys.executable, "-m", "benchmarks.chat_server", "--port", str(backend_port)],
        ready_url=backend_root + "/health",
        log_path=logs / "litellm-backend.log",
        cwd=REPO_ROOT,
    ).start()
    shim_root = f"http://127.0.0.1:{shim_port}"
    servers: list[Subprocess] = [backend]
    try:
        shim = Subprocess(
            shim_command(shim_port, backend=backend_root + "/v1"),
            ready_url=shim_root + "/healthz",
            log_path=logs / "litellm-shim.log",
            cwd=REPO_ROOT,
        ).start()
        servers.append(shim)
        config = out_dir / "litellm-config.json"
        config.write_text(json.dumps(litellm_config(backend_root + "/v1"), indent=2))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "LITELLM_", "DATABASE_URL"))}
        env.update(LITELLM_ENV)
        progress("litellm: starting the LiteLLM proxy (readiness takes ~10 s)")
        litellm_root = f"http://127.0.0.1:{litellm_port}"
        proxy = Subprocess(
            [
                str(litellm_binary(venv)),
                "--config",
                str(config),
                "--host",
                "127.0.0.1",
                "--port",
                str(litellm_port),
                "--num_workers",
                "1",
            ],
            ready_url=litellm_root + "/health/liveliness",
            log_path=logs / "litellm-proxy.log",
            env=env,
            ready_timeout_s=180.0,
            cwd=out_dir,
        ).start()
        servers.append(proxy)
    except BaseException:
        for server in reversed(servers):
            server.stop()
        raise
    return Servers(backend, backend_root, shim, shim_root, proxy, litellm_root)


def client_for(variant: Variant, servers: Servers, recorder: Recorder) -> AsyncOpenAI:
    base, key = {
        "backend": (servers.backend_url + "/v1", "sk-sim"),
        "shim": (servers.shim_url + "/v1", "sk-shim"),
        "litellm": (servers.litellm_url + "/v1", MASTER_KEY),
    }[variant.server]
    return AsyncOpenAI(base_url=base, api_key=key, max_retries=0, http_client=timed_http_client(recorder))


async def backend_log(servers: Servers, after: int) -> list[dict[str, int]]:
    async with httpx2.AsyncClient(timeout=10.0) as http:
        stats = (await http.get(servers.backend_url + "/stats")).json()
    return [entry for entry in stats["log"] if entry["n"] > after]


async def backend_count(servers: Servers) -> int:
    async with httpx2.AsyncClient(timeout=10.0) as http:
        return int((await http.get(servers.backend_url + "/stats")).json()["requests"])


async def run_variant(variant: Variant, servers: Servers, turns: int) -> dict[str, Any]:
    """One conversation; never raises: a failure is the variant's result."""
    recorder = Recorder()
    proc = {"backend": servers.backend, "shim": servers.shim, "litellm": servers.litellm}[variant.server]
    before = await backend_count(servers)
    cpu0 = cpu_seconds(proc.pid)
    backend_cpu0 = cpu_seconds(servers.backend.pid)
    client = client_for(variant, servers, recorder)
    try:
        rows = await variant.loop(client, recorder, turns)
    except Exception as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:1000]}"}
    finally:
        await client.close()
    proxy_cpu = cpu_seconds(proc.pid) - cpu0 if variant.server != "backend" else 0.0
    backend_cpu = cpu_seconds(servers.backend.pid) - backend_cpu0
    received = [entry["messages"] for entry in await backend_log(servers, before)]
    expected = [expected_backend_messages(t) for t in range(turns)]
    return {
        "ok": True,
        "turn_ms": [r["total_ms"] for r in rows],
        "client_prepare_ms": [r["client_prepare_ms"] for r in rows],
        "proxy_cpu_ms_per_turn": proxy_cpu * 1000 / turns,
        "backend_cpu_ms_per_turn": backend_cpu * 1000 / turns,
        "backend_messages": received,
        "full_history": received == expected,
    }


async def measure(servers: Servers, turns: int, repeats: int, warmup: int) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {v.name: [] for v in VARIANTS}
    failures: dict[str, str] = {}
    for rep in range(-warmup, repeats):
        kind = "warm-up" if rep < 0 else f"repeat {rep + 1}/{repeats}"
        for variant in rotated(VARIANTS, rep):
            if variant.name in failures:
                continue
            n = 3 if not variant.comparable else turns
            progress(f"litellm: {kind}: {variant.name}, {n} turns")
            result = await run_variant(variant, servers, n)
            if not result["ok"]:
                failures[variant.name] = result["error"]
                progress(f"litellm: {variant.name} failed: {result['error'][:200]}")
                continue
            if rep >= 0:
                runs[variant.name].append(result)
    return {"runs": runs, "failures": failures}


def analyse(measured: dict[str, Any], turns: int) -> dict[str, Any]:
    runs, failures = measured["runs"], measured["failures"]
    variants: dict[str, Any] = {}
    usable: set[str] = set()
    for variant in VARIANTS:
        rs = runs[variant.name]
        entry: dict[str, Any] = {"label": variant.label, "server": variant.server}
        if variant.name in failures:
            entry.update(status="failed", error=failures[variant.name])
        elif not rs:
            entry.update(status="not run")
        else:
            full = all(r["full_history"] for r in rs)
            entry["backend_got_full_history"] = full
            entry["backend_messages_first_run"] = rs[0]["backend_messages"]
            if not full:
                entry["status"] = "not equivalent: the backend did not receive the whole history"
            elif not variant.comparable:
                entry["status"] = "checked"
            else:
                entry["status"] = "ok"
                usable.add(variant.name)
            n = len(rs[0]["turn_ms"])
            entry.update(
                turn_ms=summarize(x for r in rs for x in r["turn_ms"]),
                client_prepare_ms=summarize(x for r in rs for x in r["client_prepare_ms"]),
                proxy_cpu_ms_per_turn=summarize(r["proxy_cpu_ms_per_turn"] for r in rs),
                backend_cpu_ms_per_turn=summarize(r["backend_cpu_ms_per_turn"] for r in rs),
                per_turn=[{"turn": t + 1, "turn_ms": summarize(r["turn_ms"][t] for r in rs)} for t in range(n)],
                samples_turn_ms=[r["turn_ms"] for r in rs],
            )
        variants[variant.name] = entry

    def paired(name: str, other: str, turn_indexes: list[int]) -> tuple[list[float], list[float]]:
        a = [r["turn_ms"][t] for r in runs[name] for t in turn_indexes]
        b = [r["turn_ms"][t] for r in runs[other] for t in turn_indexes]
        return a, b

    all_turns = list(range(turns))
    first, last = all_turns[: min(5, turns)], all_turns[-min(5, turns) :]
    if BASELINE in usable:
        for name in sorted(usable - {BASELINE}):
            added = {}
            for label, idx in (("all_turns", all_turns), ("first_turns", first), ("last_turns", last)):
                a, b = paired(name, BASELINE, idx)
                added[label] = summarize(x - y for x, y in zip(a, b, strict=True))
            variants[name]["added_ms_over_direct"] = added
            variants[name]["per_turn_added"] = [
                {"turn": t + 1, "added_ms": summarize(x - y for x, y in zip(*paired(name, BASELINE, [t]), strict=True))}
                for t in all_turns
            ]
    comparisons: list[dict[str, Any]] = []
    for num, den in PAIRS:
        if num in usable and den in usable:
            a, b = paired(num, den, all_turns)
            comparisons.append(
                {
                    "name": f"{num} / {den} turn time",
                    "numerator": num,
                    "denominator": den,
                    "paired_ratio": summarize(paired_ratios(a, b)),
                }
            )
    targets = []
    shim_ws = variants.get("shim_websocket", {})
    if "added_ms_over_direct" in shim_ws:
        # On the first turns, where the direct client's O(history) request preparation is still small;
        # over all turns the direct call is slower than the shim and the difference is negative.
        measured_added = shim_ws["added_ms_over_direct"]["first_turns"]["median"]
        targets.append(
            {
                "target": f"shim (WebSocket) added latency over calling the backend directly over HTTP, first {len(first)} turns: p50 < 1 ms per turn",
                "measured": measured_added,
                "threshold": 1.0,
                "op": "<",
                "met": None if measured_added is None else measured_added < 1.0,
            }
        )
    peers = [c for c in comparisons if c["numerator"] == "shim_websocket" and c["denominator"].startswith("litellm")]
    if peers:
        worst = max(c["paired_ratio"]["median"] for c in peers if c["paired_ratio"]["median"] is not None)
        targets.append(
            {
                "target": "shim (WebSocket) ahead of every working LiteLLM variant (largest paired turn-time ratio shim/LiteLLM, median)",
                "measured": worst,
                "threshold": 1.0,
                "op": "<",
                "met": worst < 1.0,
            }
        )
    return {"variants": variants, "comparisons": comparisons, "targets": targets}


def table(result: dict[str, Any]) -> str:
    if result.get("status") != "ok":
        return f"litellm: {result.get('status')}: {result.get('reason', '')}"
    rows = [
        [
            "variant",
            "status",
            "turn ms p50",
            "p90",
            "p99",
            "added vs direct p50",
            "first turns",
            "last turns",
            "proxy CPU ms/turn",
            "client prep",
        ]
    ]
    for name, v in result["variants"].items():
        added = v.get("added_ms_over_direct", {})
        rows.append(
            [
                name,
                v["status"][:40],
                fmt(v.get("turn_ms", {}).get("median")),
                fmt(v.get("turn_ms", {}).get("p90")),
                fmt(v.get("turn_ms", {}).get("p99")),
                fmt(added.get("all_turns", {}).get("median")),
                fmt(added.get("first_turns", {}).get("median")),
                fmt(added.get("last_turns", {}).get("median")),
                fmt(v.get("proxy_cpu_ms_per_turn", {}).get("median")),
                fmt(v.get("client_prepare_ms", {}).get("median")),
            ]
        )
    cfg = result["config"]
    lines = [
        f"litellm (LiteLLM {result['setup'].get('version')} vs the shim, same backend, {cfg['turns']} turns)",
        format_table(rows),
    ]
    for c in result["comparisons"]:
        lines.append(f"  ratio {c['name']}: median {fmt(c['paired_ratio']['median'], 3)} (n={c['paired_ratio']['n']})")
    for name, v in result["variants"].items():
        if v["status"] not in ("ok",):
            detail = v.get("error") or f"backend messages per turn {v.get('backend_messages_first_run')}"
            lines.append(f"  {name}: {v['status']}: {str(detail)[:300]}")
    return "\n".join(lines)


def run(
    out_dir: Path,
    *,
    quick: bool = False,
    turns: int | None = None,
    repeats: int | None = None,
    install: bool = True,
    venv: Path = DEFAULT_VENV,
    spec: str = DEFAULT_SPEC,
) -> dict[str, Any]:
    turns = turns or (3 if quick else 50)
    repeats = repeats or (1 if quick else 3)
    warmup = 1
    base: dict[str, Any] = {"suite": "litellm", "machine": machine_info(), "targets": []}
    progress("litellm: setup (a separate virtualenv; installs on first use)")
    setup = ensure_litellm(venv, spec, install=install and not quick)
    base["setup"] = setup.as_dict()
    if not setup.ok:
        base.update(status="unavailable", reason=f"LiteLLM setup failed at '{setup.failed_step}': {setup.error}")
        progress(f"litellm: {base['reason'][:300]}")
        write_json(out_dir, "litellm", base)
        return base
    try:
        servers = start_servers(out_dir, venv)
    except Exception as exc:
        base.update(status="unavailable", reason=f"servers did not start: {exc}")
        write_json(out_dir, "litellm", base)
        return base
    try:
        base["litellm_ready_s"] = servers.litellm.ready_s
        measured = asyncio.run(measure(servers, turns, repeats, warmup))
    finally:
        for server in (servers.litellm, servers.shim, servers.backend):
            server.stop()
    result = {
        **base,
        "status": "ok",
        "config": {
            "turns": turns,
            "repeats": repeats,
            "warmup_runs": warmup,
            "quick": quick,
            "backend": "benchmarks/chat_server.py: the simulated backend (zero latency, 1 output token) as an "
            "OpenAI-compatible Chat Completions server in a child process",
            "shim": "responses-ws serve --backend <that server> in a child process",
            "litellm_config": litellm_config("http://127.0.0.1:PORT/v1"),
        },
        "notes": [
            "added latency = variant turn time - direct chat completions turn time, same repeat and turn",
            "a variant whose backend requests did not carry the whole history is reported, not compared",
            "litellm_http_chained runs 3 turns only: it checks whether previous_response_id keeps the history without a database",
            "proxy CPU per turn = CPU time of the proxy's process tree during the run / turns",
        ],
    }
    result.update(analyse(measured, turns))
    result = clean_floats(result)
    write_json(out_dir, "litellm", result)
    series = {n: v["per_turn_added"] for n, v in result["variants"].items() if "per_turn_added" in v}
    if series:
        plot.per_turn_plot(
            series,
            "added_ms",
            out_dir / "litellm.png",
            f"Added latency over calling the backend directly, per turn ({turns} turns, same backend)",
            "variant turn - direct turn, ms (median, band min..p90)",
            log=False,
        )
    return result
