"""`GET /metrics` and the per-response log line, read after real turns from the official SDK.

The registry is per process and shared by every server a test session starts, so each test
compares a scrape before with a scrape after.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx2
import openai
import pytest
from openai import AsyncOpenAI
from prometheus_client.parser import text_string_to_metric_families
from support.wire import API_KEY, MODEL, completed_ok, run_turn

from server_shim.logs import JsonFormatter
from server_shim.metrics import STAGES

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
Turn = tuple[Any, ...]
"""`metrics.observe_turn`'s arguments for one turn."""


def scrape(server) -> Samples:
    reply = httpx2.get(server.base_url.removesuffix("/v1") + "/metrics", headers={"Authorization": f"Bearer {API_KEY}"})
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(reply.text)
        for sample in family.samples
    }


def delta(before: Samples, after: Samples, name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)


async def test_turns_stages_tokens_cache_and_errors_are_counted_once_per_turn(make_server):
    server = make_server(api_keys=[API_KEY])
    before = scrape(server)
    async with AsyncOpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0) as sdk:
        async with sdk.responses.connect() as conn:
            first = await run_turn(conn, input="hello", store=True)
            completed_ok(first)
            assert delta(before, scrape(server), "responses_ws_active_connections") == 1
            completed_ok(await run_turn(conn, input="again", previous_response_id=first.id, store=False))
            refused = await run_turn(conn, input="x", previous_response_id="resp_unknown", store=False)
            assert refused.error is not None
        await sdk.responses.create(model=MODEL, input="over http", store=False)
    after = scrape(server)

    assert (
        delta(
            before, after, "responses_ws_turns_total", transport="websocket", deployment="simulated", status="completed"
        )
        == 2
    )
    assert (
        delta(before, after, "responses_ws_turns_total", transport="http", deployment="simulated", status="completed")
        == 1
    )
    for stage in STAGES:
        assert delta(before, after, "responses_ws_turn_stage_seconds_count", stage=stage) == 3, stage
    assert delta(before, after, "responses_ws_shim_overhead_seconds_count") == 3
    assert delta(before, after, "responses_ws_time_to_first_token_seconds_count", deployment="simulated") == 3
    assert delta(before, after, "responses_ws_tokens_total", deployment="simulated", kind="output") > 0
    assert delta(before, after, "responses_ws_tokens_total", deployment="simulated", kind="input") > 0
    assert delta(before, after, "responses_ws_cache_lookups_total", result="hit") == 1
    assert delta(before, after, "responses_ws_cache_lookups_total", result="miss") == 1
    assert delta(before, after, "responses_ws_store_operations_total", operation="save", result="ok") == 1
    assert delta(before, after, "responses_ws_errors_total", code="previous_response_not_found") == 1
    assert delta(before, after, "responses_ws_plugin_seconds_count", kind="validator") == 3
    assert delta(before, after, "responses_ws_active_connections") == 0
    assert delta(before, after, "responses_ws_received_bytes_total", transport="websocket") > 0
    assert after[("responses_ws_deployment_breaker_state", (("deployment", "simulated"),))] == 0


async def test_responses_dropped_from_a_connection_cache_are_counted_by_reason(make_server):
    """Past `cache_max_responses` a connection's oldest goes (capacity); past the budget for all caches, the oldest
    of the least recently used cache (budget)."""
    for settings, reason in (({"cache_max_responses": 2}, "capacity"), ({"cache_budget_bytes": 150_000}, "budget")):
        server = make_server(api_keys=[API_KEY], **settings)
        before = scrape(server)
        async with (
            AsyncOpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0) as sdk,
            sdk.responses.connect() as conn,
        ):
            for _ in range(5):
                completed_ok(await run_turn(conn, input="x" * 30_000, store=False))
            evicted = delta(before, scrape(server), "responses_ws_cache_evictions_total", reason=reason)
        assert evicted == 3 if reason == "capacity" else evicted > 0, reason


def metrics_status(server, key: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx2.get(server.base_url.removesuffix("/v1") + "/metrics", headers=headers).status_code


async def test_metrics_need_a_key_when_keys_are_configured_and_show_no_secret(make_server):
    """/metrics names deployments (which /readyz hides from callers without a key): any API key or the
    scraper's metrics key opens it; the metrics key opens nothing else."""
    server = make_server(api_keys=["sk-secret-123"], metrics_key="sk-scraper")
    assert metrics_status(server) == 401
    assert metrics_status(server, "sk-wrong") == 401
    assert metrics_status(server, "sk-scraper") == 200
    reply = httpx2.get(
        server.base_url.removesuffix("/v1") + "/metrics", headers={"Authorization": "Bearer sk-secret-123"}
    )
    assert reply.status_code == 200
    assert "sk-secret-123" not in reply.text and "sk-scraper" not in reply.text
    async with AsyncOpenAI(base_url=server.base_url, api_key="sk-scraper", max_retries=0) as sdk:
        with pytest.raises(openai.AuthenticationError):
            await sdk.responses.create(model=MODEL, input="hi", store=False)


async def test_metrics_open_for_a_private_scraper_and_without_keys(make_server):
    assert metrics_status(make_server(api_keys=["sk-secret-123"], metrics_open=True)) == 200
    assert metrics_status(make_server()) == 200  # auth off: as every route
    only_metrics = make_server(metrics_key="sk-scraper")  # no API keys: the API stays open, /metrics does not
    assert metrics_status(only_metrics) == 401
    assert metrics_status(only_metrics, "sk-scraper") == 200
    async with AsyncOpenAI(base_url=only_metrics.base_url, api_key="anything", max_retries=0) as sdk:
        assert (await sdk.responses.create(model=MODEL, input="hi", store=False)).status == "completed"


async def test_one_info_line_per_finished_response_with_its_facts_and_no_key(make_server, caplog):
    server = make_server(api_keys=["alice sk-alice-1"])
    caplog.set_level(logging.INFO, logger="responses_ws.responses")
    async with (
        AsyncOpenAI(base_url=server.base_url, api_key="sk-alice-1", max_retries=0) as sdk,
        sdk.responses.connect() as conn,
    ):
        turn = await run_turn(conn, input="hello", store=False)
        completed_ok(turn)
    records = [r for r in caplog.records if r.name == "responses_ws.responses"]
    assert len(records) == 1
    fields = records[0].fields
    assert fields["tenant"] == "alice" and fields["response"] == turn.id
    assert fields["connection"].startswith("conn_") and fields["deployment"] == "simulated"
    assert fields["transport"] == "websocket" and fields["status"] == "completed"
    assert fields["output_tokens"] == turn.response["usage"]["output_tokens"]
    assert fields["ttft_ms"] is not None and fields["duration_ms"] >= fields["ttft_ms"]
    line = JsonFormatter().format(records[0])
    parsed = json.loads(line)
    assert parsed["level"] == "INFO" and parsed["response"] == turn.id and parsed["tenant"] == "alice"
    assert "sk-alice-1" not in line


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_serve_logs_in_the_format_asked(fmt, serve_process):
    from support.chat_server import closed_port
    from support.serve import stop_cleanly, wait_healthy

    port = closed_port()
    process = serve_process("--port", str(port), "--log-format", fmt, "--log-level", "INFO")
    wait_healthy(port, process)
    reply = httpx2.post(f"http://127.0.0.1:{port}/v1/responses", json={"model": MODEL, "input": "hi", "store": False})
    assert reply.status_code == 200
    output = stop_cleanly(process)
    lines = [line for line in output.splitlines() if "responses_ws.responses" in line]
    assert len(lines) == 1, output
    if fmt == "json":
        record = json.loads(lines[0])
        assert record["response"] == reply.json()["id"] and record["transport"] == "http"
    else:
        assert f"response={reply.json()['id']}" in lines[0] and "transport=http" in lines[0]


def test_with_workers_every_scrape_sums_all_of_them(serve_process):
    from support.chat_server import closed_port
    from support.serve import stop_cleanly, wait_healthy

    port = closed_port()
    process = serve_process("--port", str(port), "--workers", "2")
    wait_healthy(port, process)
    base = f"http://127.0.0.1:{port}"
    for _ in range(6):  # new connections each time: the kernel spreads them over both workers
        with httpx2.Client() as http:
            assert http.post(base + "/v1/responses", json={"model": MODEL, "input": "hi", "store": False}).is_success
    for _ in range(3):
        with httpx2.Client() as http:
            families = {f.name: f for f in text_string_to_metric_families(http.get(base + "/metrics").text)}
        turns = sum(s.value for s in families["responses_ws_turns"].samples if s.name == "responses_ws_turns_total")
        assert turns == 6
    stop_cleanly(process)


def test_the_example_dashboard_uses_only_metrics_the_shim_exports(make_server):
    import re
    from pathlib import Path

    server = make_server()
    families = text_string_to_metric_families(httpx2.get(server.base_url.removesuffix("/v1") + "/metrics").text)
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}
    exported = {f.name + suffix for f in families for suffix in suffixes.get(f.type, ("",))}
    dashboard = json.loads((Path(__file__).parent.parent / "examples" / "grafana-dashboard.json").read_text())
    used = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"\bresponses_ws_[a-z_]+", target["expr"])
    }
    assert len(used) >= 12
    assert used <= exported, used - exported


def test_held_observations_land_as_observing_one_by_one_would():
    from hypothesis import given, settings
    from hypothesis import strategies as st
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    from server_shim.metrics import _FAST, _observe_all

    def samples(registry: CollectorRegistry) -> list[str]:
        return [line for line in generate_latest(registry).decode().splitlines() if "_created" not in line]

    values = st.lists(st.floats(min_value=0, max_value=200, allow_nan=False) | st.sampled_from(_FAST), max_size=60)

    @settings(max_examples=100, deadline=None)
    @given(st.lists(values, max_size=4))
    def check(batches: list[list[float]]) -> None:
        one_by_one, held = CollectorRegistry(), CollectorRegistry()
        plain = Histogram("x_seconds", "x", buckets=_FAST, registry=one_by_one)
        batched = Histogram("x_seconds", "x", buckets=_FAST, registry=held)
        for batch in batches:
            for value in batch:
                plain.observe(value)
            _observe_all(batched, batch)
        assert samples(held) == samples(one_by_one)  # buckets, count and the float sum, bit for bit

    check()


def test_held_counter_and_gauge_updates_reach_the_metric_at_the_next_flush():
    """`add` and `set_later` hold a request's updates as numbers; a flush (every 100 turns, every scrape)
    applies them: each increment once, the last value set."""
    from prometheus_client import CollectorRegistry, Counter, Gauge

    from server_shim import metrics

    registry = CollectorRegistry()
    counter = Counter("held_test", "a counter", registry=registry)
    gauge = Gauge("held_test_gauge", "a gauge", registry=registry)
    metrics.flush_turns()
    for _ in range(3):
        metrics.add(counter, 5)
        metrics.add(gauge, 1)
        metrics.add(gauge, -1)
    metrics.set_later(gauge, 7)
    metrics.set_later(gauge, 9)
    if not metrics.SHARED_VALUES:
        assert registry.get_sample_value("held_test_total") == 0 and registry.get_sample_value("held_test_gauge") == 0
    metrics.flush_turns()
    assert registry.get_sample_value("held_test_total") == 15
    assert registry.get_sample_value("held_test_gauge") == 9
    metrics.flush_turns()  # applied once
    assert registry.get_sample_value("held_test_total") == 15


def test_a_fixed_sequence_of_turns_scrapes_as_observing_each_turn_one_by_one_would(monkeypatch):
    """`observe_turn` holds a turn as the numbers it has (stage intervals, token counts) and `flush_turns` applies
    them in batches; a scrape must show what observing each turn at once, from its seconds per stage, shows:
    the same series, labels, counts, buckets and float sums, bit for bit. Covers a stage marked twice (one
    observation, the sum), turns without a first token or plugin time, token kinds at zero, two deployments."""
    from hypothesis import example, given, settings
    from hypothesis import strategies as st
    from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

    from server_shim import metrics
    from server_shim.metric_values import Labelled, in_place

    def family(registry: CollectorRegistry) -> dict[str, Any]:
        """The turn metrics as `metrics` declares them, in a registry of their own."""
        return {
            name: wrap(
                kind(old.metric._name if isinstance(old, Labelled) else old._name, "x", **options, registry=registry)
            )
            for name, kind, wrap, old, options in (
                ("TURNS", Counter, Labelled, metrics.TURNS, {"labelnames": ["transport", "deployment", "status"]}),
                (
                    "STAGE_SECONDS",
                    Histogram,
                    Labelled,
                    metrics.STAGE_SECONDS,
                    {"labelnames": ["stage"], "buckets": sorted({*metrics._FAST, *metrics._SLOW})},
                ),
                (
                    "SHIM_OVERHEAD_SECONDS",
                    Histogram,
                    in_place,
                    metrics.SHIM_OVERHEAD_SECONDS,
                    {"buckets": metrics._FAST},
                ),
                (
                    "TTFT_SECONDS",
                    Histogram,
                    Labelled,
                    metrics.TTFT_SECONDS,
                    {"labelnames": ["deployment"], "buckets": metrics._SLOW},
                ),
                (
                    "TURN_SECONDS",
                    Histogram,
                    Labelled,
                    metrics.TURN_SECONDS,
                    {"labelnames": ["deployment"], "buckets": metrics._SLOW},
                ),
                ("TOKENS", Counter, Labelled, metrics.TOKENS, {"labelnames": ["deployment", "kind"]}),
                (
                    "PLUGIN_SECONDS",
                    Histogram,
                    Labelled,
                    metrics.PLUGIN_SECONDS,
                    {"labelnames": ["kind"], "buckets": metrics._FAST},
                ),
            )
        }

    def one_by_one(turns: list[Turn], into: dict[str, Any]) -> None:
        """What each turn showed when it was observed at once from its seconds per stage (`StageClock.seconds`)."""
        for transport, deployment, status, intervals, tokens, ttft_s, duration_s, plugin_s in turns:
            seconds: dict[str, float] = {}
            for stage, start, end in intervals:
                seconds[stage] = seconds.get(stage, 0.0) + (end - start)
            into["TURNS"].labels(transport, deployment, status).inc()
            for stage, value in seconds.items():
                into["STAGE_SECONDS"].labels(stage).observe(value)
            into["SHIM_OVERHEAD_SECONDS"].observe(sum(seconds.get(stage, 0.0) for stage in metrics.SHIM_STAGES))
            if ttft_s is not None:
                into["TTFT_SECONDS"].labels(deployment).observe(ttft_s)
            into["TURN_SECONDS"].labels(deployment).observe(duration_s)
            for kind, count in zip(metrics.TOKEN_KINDS, tokens, strict=True):
                if count:
                    into["TOKENS"].labels(deployment, kind).inc(count)
            for kind, value in (plugin_s or {}).items():
                into["PLUGIN_SECONDS"].labels(kind).observe(value)

    def samples(registry: CollectorRegistry) -> list[str]:
        """Each sample line, sorted: a family lists its children in the order they were first used."""
        return sorted(line for line in generate_latest(registry).decode().splitlines() if "_created" not in line)

    seconds = (
        st.floats(min_value=0, max_value=3, allow_nan=False)
        | st.sampled_from(metrics._FAST)
        | st.sampled_from([0.1, 0.2, 0.3, 0.7, 1e-9])  # sums that depend on the order of the additions
    )
    repeated = st.sampled_from([(), ("render",), ("finalize", "resolve")])  # stages marked again, after the rest

    @st.composite
    def turns(draw: st.DrawFn) -> Turn:
        stages = [*metrics.STAGES, *draw(repeated)]
        lengths = draw(st.lists(seconds, min_size=len(stages), max_size=len(stages)))
        intervals, now = [], 100.0
        for stage, length in zip(stages, lengths, strict=True):
            intervals.append((stage, now, now + length))
            now += length + draw(st.sampled_from([0.0, 0.5]))  # a restart's gap belongs to no stage
        plugins = draw(st.sampled_from([None, {}, {"validator": 0.0001, "classifier": 0.002}]))
        return (
            draw(st.sampled_from(metrics.TRANSPORTS)),
            draw(st.sampled_from(["fixed-a", "fixed-b"])),
            draw(st.sampled_from(metrics.STATUSES)),
            intervals,
            tuple(draw(st.lists(st.integers(0, 5_000), min_size=3, max_size=3))),
            draw(st.none() | seconds),
            draw(seconds),
            plugins,
        )

    marked_again = [
        (stage, 0.0, length) for stage, length in zip(metrics.STAGES, (0.1,) * 4 + (1.0, 1.0, 0.1), strict=True)
    ]
    marked_again += [("finalize", 0.0, 0.2), ("resolve", 0.0, 0.1)]  # added in the order marked: 0.7999999999999999

    @settings(max_examples=40, deadline=None)
    @given(st.lists(turns(), min_size=1, max_size=2 * metrics.FLUSH_TURNS + 3))
    @example([("websocket", "fixed-a", "completed", marked_again, (1, 0, 1), 0.5, 2.0, None)])
    def check(sequence: list[Turn]) -> None:
        metrics.flush_turns()  # what earlier tests held goes to the real metrics
        held, reference = CollectorRegistry(), CollectorRegistry()
        with pytest.MonkeyPatch.context() as patch:
            for name, metric in family(held).items():
                patch.setattr(metrics, name, metric)
            for turn in sequence:
                metrics.observe_turn(*turn)
            metrics.flush_turns()
        one_by_one(sequence, family(reference))
        assert samples(held) == samples(reference)

    check()
