"""The benchmarks run end to end in their tiny setting and write well-formed results.

Timing belongs to the benchmark: nothing here asserts a figure, only that each suite ran,
measured what it says it measures, and wrote standard JSON (and a PNG when matplotlib is there).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
STATS_KEYS = {"n", "median", "p90", "p99", "mean", "min", "max"}


def _strict_json(path: Path) -> Any:
    def no_constants(name: str) -> Any:
        raise ValueError(f"{path.name}: non-standard JSON constant {name}")

    return json.loads(path.read_text(), parse_constant=no_constants)


def _is_stats(value: Any) -> bool:
    return isinstance(value, dict) and value.keys() >= STATS_KEYS


def _check_targets(result: dict[str, Any]) -> None:
    assert result["targets"], "each suite evaluates its targets"
    for target in result["targets"]:
        assert {"target", "measured", "threshold", "op", "met"} <= target.keys()
        assert target["met"] in (True, False, None)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    out = tmp_path_factory.mktemp("bench")
    return out, bench_quick(["overhead", "agent", "agent-llama", "relay"], out, timeout=240)


def bench_quick(suites: list[str], out: Path, timeout: float, *more: str) -> subprocess.CompletedProcess[str]:
    """`python -m benchmarks SUITES --quick --out OUT [MORE...]` from the checkout, which must succeed."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", *suites, "--quick", "--out", str(out), *more],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-5000:]}"
    return done


@pytest.mark.timeout(300)
def test_quick_run_writes_summary_and_reports_progress(
    quick_run: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    out, done = quick_run
    summary = _strict_json(out / "summary.json")
    assert set(summary["suites"]) == {"overhead", "agent", "agent-llama", "relay"}
    assert summary["failed"] == {}
    assert summary["quick"] is True
    assert "[bench" in done.stderr, "progress goes to stderr"
    assert "targets" in done.stdout and (out / "summary.txt").read_text().strip()


@pytest.mark.timeout(300)
def test_overhead_results_are_well_formed(quick_run: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    out, _ = quick_run
    result = _strict_json(out / "overhead.json")
    turns = result["config"]["turns"]
    assert result["config"]["quick"] is True
    assert set(result["alternatives"]) == {
        "websocket",
        "http_chained",
        "http_stateless",
        "http_raw",
        "websocket_raw",
        "backend_http",
        "backend_inprocess",
    }
    for name, alt in result["alternatives"].items():
        assert len(alt["per_turn"]) == turns
        assert [p["turn"] for p in alt["per_turn"]] == list(range(1, turns + 1))
        assert _is_stats(alt["per_turn"][-1]["overhead_ms"])
        assert _is_stats(alt["all_turns"]["overhead_ms"])
        assert alt["all_turns"]["overhead_ms"]["n"] == turns * result["config"]["repeats"]
        assert alt["backend_got_full_history"] is True, name
        assert len(alt["samples_overhead_ms"]) == result["config"]["repeats"]
    # the client/wire/server split is measured for every alternative that goes through a server
    for name in ("websocket", "http_chained", "http_stateless", "backend_http"):
        parts = result["alternatives"][name]["last_window"]
        for part in ("client_prepare_ms", "request_wire_ms", "server_ms", "response_wire_ms", "client_parse_ms"):
            assert parts[part]["n"] > 0, (name, part)
    assert result["ratios"] and all(_is_stats(r["paired"]) and r["paired"]["n"] > 0 for r in result["ratios"])
    assert _is_stats(result["added_latency_ms"]["websocket_minus_backend_inprocess"])
    _check_targets(result)
    if importlib.util.find_spec("matplotlib") is not None:
        assert (out / "overhead.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(300)
def test_agent_results_are_well_formed(quick_run: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    out, _ = quick_run
    result = _strict_json(out / "agent.json")
    assert {"http", "websocket"} <= set(result["variants"])
    for variant in result["variants"].values():
        assert _is_stats(variant["total_s"]) and variant["total_s"]["n"] == result["config"]["repeats"]
        assert len(variant["per_turn"]) == result["config"]["turns"]
        assert variant["same_outputs_as_baseline"] is True
        assert variant["bytes_sent"]["median"] > 0
    pairs = {(c["numerator"], c["denominator"]) for c in result["comparisons"]}
    assert ("websocket", "http") in pairs
    _check_targets(result)


def test_agent_llama_results_are_well_formed(quick_run: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    out, _ = quick_run
    result = _strict_json(out / "agent-llama.json")
    if importlib.util.find_spec("llama_cpp") is None:
        assert result["status"] == "unavailable"
        return
    assert result["status"] == "ok"
    for variant in result["variants"].values():
        assert _is_stats(variant["total_s"]) and _is_stats(variant["turn_ms"])
        assert _is_stats(variant["in_shim_ms"]) and _is_stats(variant["outside_ms"])
        assert variant["in_shim_ms"]["n"] == variant["turn_ms"]["n"], "one shim log line per turn"
        assert 0 < variant["in_shim_ms"]["median"] < variant["turn_ms"]["max"]
        assert variant["same_outputs_every_repeat"] is True
    assert result["same_outputs_http_websocket"] is True
    assert result["ratio_websocket_http_total"]["median"] > 0
    assert result["config"]["llama_threads"] == 1
    assert set(result["variants"]) == {"http", "raw_http", "websocket"}
    assert result["same_outputs_raw_http"] is True


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="needs the llama extra")
@pytest.mark.timeout(120)
def test_llama_stall_reports_each_thread_count() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.llama_stall", "--threads", "1,2", "--requests", "2"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("threads=")]
    assert [line.split(":")[0] for line in lines] == ["threads=1", "threads=2"], done.stdout
    assert all("server CPU" in line and "max" in line for line in lines)


@pytest.mark.timeout(120)
def test_loop_stall_measures_each_frame_kind_in_each_mode_with_a_second_connection(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.loop_stall", "--rounds", "1", "--out", str(tmp_path)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = _strict_json(tmp_path / "loop-stall.json")
    assert result["second"]["alone"]["turns"] > 0
    for kind in ("text_3mb", "items_60k", "items_5k"):
        for mode in ("yields_off", "orjson", "sliced"):
            for stall in (result["stall"][kind][mode], result["stall_cpu"][kind][mode]):
                assert stall["n"] == 1 and stall["max_ms"] >= stall["median_ms"] >= stall["min_ms"] > 0
            second = result["second"][kind][mode]
            assert second["turns"] > 0 and second["max_ms"] >= second["p99_ms"] >= second["p50_ms"] > 0
        parse = result["parse"][kind]
        assert parse["orjson_cpu_ms"] > 0 and parse["sliced_cpu_ms"] > 0 and parse["steps"] > 0


@pytest.mark.timeout(300)
def test_relay_results_are_well_formed(quick_run: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    out, _ = quick_run
    result = _strict_json(out / "relay.json")
    for kind in ("websocket", "http_sse"):
        through = result["throughput"][kind]
        assert through["complete"] is True, "every delta sent arrived"
        assert _is_stats(through["deltas_per_s"])
    idle = result["idle"]
    assert idle["connections_held"] == result["config"]["idle_connections"]
    assert idle["server_reported_connections"] == idle["connections_held"]
    assert idle["rss_held_bytes"] > 0 and idle["rss_baseline_bytes"] > 0
    _check_targets(result)


def test_cli_bench_passes_arguments_through() -> None:
    from server_shim.cli import build_parser

    args = build_parser().parse_args(["bench", "overhead", "--quick", "--out", "/tmp/x"])
    assert args.bench_args == ["overhead", "--quick", "--out", "/tmp/x"]


def test_the_suites_the_command_and_the_readme_name_are_the_benchmarks_own() -> None:
    """`responses-ws bench --help` works without the checkout, so it keeps its own list: it must not go stale."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.cli import SUITES
    from server_shim.cli import BENCH_SUITES

    assert BENCH_SUITES == SUITES
    layout = next(line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("benchmarks/ "))
    assert tuple(layout.split("python -m benchmarks: ")[1].split(";")[0].split(", ")) == SUITES, layout
    documented = (ROOT / "benchmarks" / "README.md").read_text()
    assert [s for s in SUITES if f"| `{s}` |" not in documented] == [], "suites missing from benchmarks/README.md"


def test_unknown_suite_is_refused() -> None:
    sys.path.insert(0, str(ROOT))
    from benchmarks.cli import main

    assert main(["no-such-suite"]) == 2


def test_statistics_helpers() -> None:
    sys.path.insert(0, str(ROOT))
    from benchmarks.common import paired_ratios, percentile, summarize

    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    stats = summarize([3.0, None, 1.0, 2.0])
    assert stats["n"] == 3 and stats["median"] == 2.0 and stats["max"] == 3.0
    assert summarize([])["median"] is None
    assert paired_ratios([2.0, None, 3.0], [1.0, 1.0, 0.0]) == [2.0]


@pytest.mark.timeout(120)
def test_checks_suite_measures_both_paths_and_all_three_ttft_modes(tmp_path: Path) -> None:
    bench_quick(["checks"], tmp_path, timeout=100)
    result = _strict_json(tmp_path / "checks.json")
    for point in result["cost"]:
        assert _is_stats(point["incremental_ms"]) and _is_stats(point["full_history_ms"])
        assert point["guard_calls"] == {"incremental": 1, "full_history": point["turn"]}
    assert set(result["ttft_ms"]) == {"no_check", "sequential", "overlapped"}
    assert all(stats["n"] > 0 for stats in result["ttft_ms"].values())


@pytest.mark.timeout(300)
def test_a_quick_run_is_judged_against_quick_run_targets(
    quick_run: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    """A few turns cannot show what 50 turns show: the scale-bound targets are replaced, and say so."""
    out, done = quick_run
    for suite in ("overhead", "agent"):
        names = [t["target"] for t in _strict_json(out / f"{suite}.json")["targets"]]
        assert any(name.startswith("quick run:") for name in names), names
        assert not any("1/5 of stateless HTTP" in name or ">= 40% faster" in name for name in names), names
    assert "quick run:" in done.stdout


def test_replicas_results_are_well_formed(tmp_path: Path) -> None:
    bench_quick(["replicas"], tmp_path, timeout=180)
    result = _strict_json(tmp_path / "replicas.json")
    _check_targets(result)
    rounds = {(r["workers"], r["store"]): r for r in result["rounds"]}
    assert set(rounds) == {(1, "memory"), (2, "memory"), (1, "redis"), (2, "redis")}
    for r in rounds.values():
        for load in r["load"]:
            assert load["turns"] == load["clients"] * load["turns_per_client"]
            assert _is_stats(load["latency_ms"]) and load["latency_ms"]["n"] == load["turns"]
    for store in ("memory", "redis"):
        cost = rounds[(1, store)]["store_cost"]
        assert _is_stats(cost["stored"]) and _is_stats(cost["not_stored"])
        assert cost["stored"]["n"] == cost["not_stored"]["n"] == result["config"]["sequential_turns"]


@pytest.mark.timeout(120)
def test_load_suite_runs_every_level_without_errors_and_reports_rss_and_the_big_frame_cost(tmp_path: Path) -> None:
    bench_quick(["load"], tmp_path, timeout=100)
    result = _strict_json(tmp_path / "load.json")
    assert [lvl["clients"] for lvl in result["levels"]] == [5, 20]
    for lvl in result["levels"]:
        assert lvl["errors"] == 0 and lvl["turns"] == lvl["clients"] * lvl["turns_per_client"]
        assert lvl["turns_per_s"] > 0 and lvl["latency_p99_ms"] >= lvl["latency_p50_ms"] > 0
        assert lvl["rss_peak_bytes"] >= lvl["rss_idle_bytes"] > 0 and lvl["rss_after_bytes"] > 0
        assert lvl["allocator"] == "default" and lvl["server_cpu_ms_per_turn"] > 0 and lvl["client_cpu_ms_per_turn"] > 0
        assert (
            lvl["first_turn_p99_ms"] >= lvl["first_turn_p50_ms"] > 0
            and lvl["steady_p99_ms"] >= lvl["steady_p50_ms"] > 0
        )
        assert lvl["checkout"] is None and "side_by_side" not in result
    big = result["big_frame"]
    assert big["frame_bytes"]["text_3mb"] > 3_000_000 and big["frame_bytes"]["items_60k"] > 2_000_000
    for key in ("alone", "beside_text_3mb", "beside_items_60k", "beside_items_5k"):
        assert big[key]["turns"] > 0 and big[key]["p99_ms"] >= big[key]["p50_ms"]


@pytest.mark.timeout(120)
def test_load_suite_serves_each_checkout_side_by_side_in_alternating_order(tmp_path: Path) -> None:
    other = tmp_path / "other"
    shutil.copytree(ROOT / "server_shim", other / "server_shim", ignore=shutil.ignore_patterns("__pycache__"))
    more = ["--clients", "3", "--turns", "4", "--repeats", "2", "--checkouts", f"{ROOT},{other}"]
    bench_quick(["load"], tmp_path / "out", 100, *more)
    result = _strict_json(tmp_path / "out" / "load.json")
    here = next(lvl["checkout"] for lvl in result["levels"])
    assert here.startswith(f"{ROOT.name}@") and result["config"]["checkouts"] == [here, "other"]
    assert [(lvl["checkout"], lvl["repeat"]) for lvl in result["levels"]] == [
        (here, 0),
        ("other", 0),
        ("other", 1),
        (here, 1),
    ]
    assert all(lvl["errors"] == 0 and lvl["turns"] == 12 for lvl in result["levels"])
    groups = {g["checkout"]: g for g in result["side_by_side"]}
    assert set(groups) == {here, "other"} and all(g["runs"] == 2 for g in groups.values())
    for name, group in groups.items():
        runs = [lvl for lvl in result["levels"] if lvl["checkout"] == name]
        for key in ("latency_p99_ms", "first_turn_p99_ms", "steady_p50_ms", "client_cpu_ms_per_turn"):
            assert group[key] == pytest.approx(sum(run[key] for run in runs) / 2)  # the median of two
    assert "side by side" in (tmp_path / "out" / "summary.txt").read_text()


def test_a_checkout_that_would_not_be_served_is_refused(tmp_path: Path) -> None:
    from benchmarks.load import check_checkout

    check_checkout(ROOT)
    with pytest.raises(RuntimeError, match="would import server_shim from"):
        check_checkout(tmp_path)  # no server_shim/ there: the installed one would be served


@pytest.mark.timeout(120)
def test_floor_suite_measures_the_shim_and_the_floor_server_on_the_same_turns(tmp_path: Path) -> None:
    bench_quick(["floor"], tmp_path, timeout=100)
    result = _strict_json(tmp_path / "floor.json")
    _check_targets(result)
    assert result["events_per_turn"]["1"] >= 3 and result["events_per_turn"]["64"] > result["events_per_turn"]["1"]
    replayed = json.loads((tmp_path / "floor-events.json").read_text())
    assert replayed["1"][-1].startswith('{"type":"response.completed"')
    assert set(result["workloads"]) == {"sequential", "concurrent", "long"}
    for workload in result["workloads"].values():
        for server in ("floor", "shim"):
            for key in ("server_cpu_ms_per_turn", "turns_per_s", "client_cpu_ms_per_turn"):
                assert _is_stats(workload[server][key]) and workload[server][key]["median"] > 0
        assert workload["cpu_ratio"]["median"] > 0 and workload["throughput_ratio"]["median"] > 0
    assert result["per_delta_us"]["shim"] is not None


@pytest.mark.timeout(120)
def test_client_suite_measures_each_client_against_the_floor_client_on_the_same_replies(tmp_path: Path) -> None:
    bench_quick(["client"], tmp_path, timeout=100)
    result = _strict_json(tmp_path / "client.json")
    _check_targets(result)
    replayed = json.loads((tmp_path / "client-events.json").read_text())["1"]
    assert replayed[-1].startswith('{"type":"response.completed"') and '"function_call"' in replayed[-1]
    assert result["events_per_turn"] == len(replayed)
    assert set(result["clients"]) == {"floor", "floor_typed", "wrap", "wrap_async", "wrap_stream", "connect", "http"}
    for by_mark in result["clients"].values():
        assert _is_stats(by_mark["10"]) and by_mark["10"]["median"] > 0 and by_mark["10"]["x_floor"] > 0
    assert result["clients"]["floor"]["10"]["x_floor"] == 1.0


@pytest.mark.timeout(120)
def test_memory_suite_reports_each_held_conversation_by_tracemalloc_rss_and_what_holds_it(tmp_path: Path) -> None:
    bench_quick(["memory"], tmp_path, timeout=100)
    result = _strict_json(tmp_path / "memory.json")
    _check_targets(result)
    assert [run["store"] for run in result["runs"]] == [False, True]
    for run in result["runs"]:
        held = run["in_process"]
        assert (
            held["json_bytes_per_conversation"]
            > (result["config"]["turns"] - 1) * result["config"]["tool_output_bytes"]
        )
        assert held["tracemalloc_bytes_per_conversation"] > held["json_bytes_per_conversation"]
        parts = held["walk_bytes_per_conversation"]
        assert parts["items"] > 0 and parts["fragments"] > 0 and parts["response_objects"] > 0
        assert parts["total"] == pytest.approx(sum(v for k, v in parts.items() if k != "total"))
        assert held["states"] == 2 * result["config"]["turns"]
        assert run["child_process"]["rss_after_bytes"] > 0
    assert "held by" in (tmp_path / "summary.txt").read_text()


@pytest.mark.timeout(150)
def test_frameworks_suite_runs_each_frameworks_agent_over_http_and_websocket(tmp_path: Path) -> None:
    bench_quick(["frameworks"], tmp_path, timeout=140)
    result = _strict_json(tmp_path / "frameworks.json")
    turns = result["config"]["turns"]
    assert set(result["frameworks"]) == {
        "langchain-responses",
        "langchain-chat",
        "autogen",
        "pydantic-ai-chat",
        "pydantic-ai-responses",
        "smolagents",
    }
    for name, row in result["frameworks"].items():
        http, websocket = row["http"], row["websocket"]
        assert http["turns"] == websocket["turns"] == turns, name
        assert http["turns_chained"]["median"] == 0 and websocket["turns_chained"]["median"] == turns - 1, name
        assert websocket["bytes_sent"]["median"] < http["bytes_sent"]["median"], name
        for figures in (http, websocket):
            assert figures["server_s"]["median"] > 0 and figures["client_s"]["median"] > 0, name
            assert figures["client_s"]["median"] + figures["server_s"]["median"] == pytest.approx(
                figures["total_s"]["median"], rel=0.01
            )
            assert _is_stats(figures["turn_ms"]) and figures["turn_ms"]["n"] == turns * result["config"]["repeats"]


@pytest.mark.parametrize("mode", ["router", "simulated", "null", "driver"])
def test_the_backend_instructions_child_runs_its_chained_turns(mode: str) -> None:
    """What `benchmarks.backend_instructions` counts under callgrind, run here without it (no valgrind needed)."""
    from benchmarks.backend_instructions import main

    assert main(["--child", mode, "--turns", "3", "--no-wait"]) == 0


def test_the_backend_instructions_chat_child_streams_its_turns_from_a_chat_server(chat_server: Any) -> None:
    """Mode `chat`: the router over an `openai_compatible` deployment, each chained turn a request upstream."""
    from benchmarks.backend_instructions import main

    received = len(chat_server.received)
    assert main(["--child", "chat", "--turns", "3", "--no-wait", "--upstream", chat_server.base_url]) == 0
    assert len(chat_server.received) - received == 20 + 3, "the warm-up turns, then the counted ones"
    assert len(chat_server.bodies[-1]["messages"]) == 2 * 23 - 1, "the whole chained history each turn"


async def test_the_counted_clients_mark_each_phase_with_every_turn_answered(server: Any) -> None:
    """What `benchmarks.instructions` counts under callgrind, run here without it: connections opened first, then
    phases of chained turns (`--first`: a herd's first turns, then its second; a wrong chain fails a turn, and the
    run with it), each mark once every turn before it is answered."""
    from benchmarks.floor import Frames
    from benchmarks.instructions import drive
    from tests.support.wire import ws_url

    turns_at: list[tuple[int, int]] = []
    await drive(ws_url(server), Frames(1), 5, [1, 1], lambda phase: turns_at.append((phase, server.shim.stats.turns)))
    assert turns_at == [(0, 0), (1, 5), (2, 10)]
    turns_at.clear()
    await drive(ws_url(server), Frames(1), 2, [7], lambda phase: turns_at.append((phase, server.shim.stats.turns)))
    assert turns_at == [(0, 10), (1, 24)]
