"""`python -m benchmarks [suite ...] [--quick] [--out DIR]` (also `responses-ws bench ...`)."""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .common import RESULTS_DIR, clean_floats, machine_info, progress, write_json
from .report import targets_table

SUITES = (
    "overhead",
    "agent",
    "agent-llama",
    "relay",
    "litellm",
    "replicas",
    "checks",
    "load",
    "floor",
    "client",
    "memory",
    "frameworks",
)


def _suite(name: str) -> tuple[Callable[..., dict[str, Any]], Callable[[dict[str, Any]], str]]:
    if name == "overhead":
        from . import overhead

        return overhead.run, overhead.table
    if name == "agent":
        from . import agent

        return agent.run, agent.table
    if name == "agent-llama":
        from . import agent_llama

        return agent_llama.run, agent_llama.table
    if name == "relay":
        from . import relay

        return relay.run, relay.table
    if name == "replicas":
        from . import replicas

        return replicas.run, replicas.table
    if name == "checks":
        from . import checks

        return checks.run, checks.table
    if name == "load":
        from . import load

        return load.run, load.table
    if name == "floor":
        from . import floor

        return floor.run, floor.table
    if name == "client":
        from . import client_cpu

        return client_cpu.run, client_cpu.table
    if name == "memory":
        from . import memory

        return memory.run, memory.table
    if name == "frameworks":
        from . import frameworks

        return frameworks.run, frameworks.table
    if name == "litellm":
        from . import peer_litellm

        return peer_litellm.run, peer_litellm.table
    raise ValueError(name)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="responses-ws benchmarks: per-turn overhead, agent loop, relay, and LiteLLM as the peer. "
        "Loopback only. Progress goes to stderr, tables to stdout, JSON and PNG files to --out.",
    )
    parser.add_argument("suites", nargs="*", metavar="suite", help=f"any of {', '.join(SUITES)} (default: all)")
    parser.add_argument("--quick", action="store_true", help="a tiny setting that runs in seconds (for tests)")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help=f"results folder (default {RESULTS_DIR})")
    parser.add_argument("--repeats", type=int, help="override each suite's repeat count")
    parser.add_argument("--turns", type=int, help="override the turn count of the overhead, agent and litellm suites")
    parser.add_argument(
        "--clients",
        type=lambda text: [int(n) for n in text.split(",")],
        help="load: the concurrent client counts to run, e.g. 50,200 (default 50,200,500,1000)",
    )
    parser.add_argument(
        "--allocators",
        type=lambda text: text.split(","),
        help="load: run each level once per CPython allocator: default (no PYTHONMALLOC: what serve picks), pymalloc, "
        "malloc; e.g. pymalloc,default (default: default)",
    )
    parser.add_argument(
        "--checkouts",
        type=lambda text: [Path(path) for path in text.split(",")],
        help="load: serve each level from each of these checkouts (directories holding server_shim/), side by side, "
        "their order alternating between --repeats, e.g. /tmp/base,. (default: this one)",
    )
    parser.add_argument(
        "--llama-threads",
        type=int,
        help="agent-llama: llama.cpp threads (default 1; as many as the cores stalls under CPU contention)",
    )
    parser.add_argument(
        "--no-install",
        action="store_true",
        help="litellm: do not install LiteLLM into its own venv if it is missing (report it instead)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    unknown = [s for s in args.suites if s not in SUITES]
    if unknown:
        print(f"unknown suite(s): {', '.join(unknown)}; choose from {', '.join(SUITES)}", file=sys.stderr)
        return 2
    suites = list(dict.fromkeys(args.suites)) or list(SUITES)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    progress(f"suites {', '.join(suites)}{' (quick)' if args.quick else ''}; results in {out}")
    results: dict[str, dict[str, Any]] = {}
    failures: dict[str, str] = {}
    tables: list[str] = []
    for name in suites:
        run, table = _suite(name)
        kwargs: dict[str, Any] = {"quick": args.quick}
        if args.repeats:
            kwargs["repeats"] = args.repeats
        if args.turns and name in ("overhead", "agent", "agent-llama", "litellm", "load", "memory", "frameworks"):
            kwargs["turns"] = args.turns
        if name == "litellm":
            kwargs["install"] = not args.no_install
        if name == "agent-llama" and args.llama_threads:
            kwargs["llama_threads"] = args.llama_threads
        if name == "load" and args.clients:
            kwargs["clients"] = args.clients
        if name == "load" and args.allocators:
            kwargs["allocators"] = args.allocators
        if name == "load" and args.checkouts:
            kwargs["checkouts"] = args.checkouts
        start = time.perf_counter()
        progress(f"=== {name} ===")
        try:
            result = run(out, **kwargs)
        except Exception as exc:  # one suite failing must not stop the others
            failures[name] = f"{type(exc).__name__}: {exc}"
            progress(f"{name} FAILED: {failures[name]}")
            write_json(
                out,
                name,
                {"suite": name, "status": "failed", "error": failures[name], "traceback": traceback.format_exc()},
            )
            continue
        result["seconds"] = time.perf_counter() - start
        write_json(out, name, result)
        results[name] = result
        tables.append(table(result))
        progress(f"{name} done in {result['seconds']:.1f} s")
    summary = clean_floats(
        {
            "machine": machine_info(),
            "quick": args.quick,
            "suites": {
                n: {"status": r.get("status", "ok"), "file": f"{n}.json", "targets": r.get("targets", [])}
                for n, r in results.items()
            },
            "failed": failures,
        }
    )
    write_json(out, "summary", summary)
    text = "\n\n".join([*tables, "targets\n" + targets_table(results)])
    (out / "summary.txt").write_text(text + "\n")
    print(text)
    if failures:
        print("\nfailed suites: " + json.dumps(failures, indent=2), file=sys.stderr)
    return 1 if failures else 0
