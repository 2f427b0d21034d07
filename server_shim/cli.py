"""The `responses-ws` command: serve, demo, check-config, plugins."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .logs import configure_logging

if TYPE_CHECKING:
    from .config import ShimConfig
    from .loading import Loaded


def _serve(args: argparse.Namespace) -> int:
    if args.own_command_line:
        _run_on_the_c_allocator()
    from .server import serve

    if args.workers < 1:
        print("responses-ws: --workers must be at least 1", file=sys.stderr)
        return 2
    loaded = _load(args.config, _flag_overrides(args))
    if loaded is None:
        return 2
    return serve(loaded, log_level=args.log_level.lower(), workers=args.workers)


def _run_on_the_c_allocator() -> None:
    """Replace this process with the same command on the C allocator, unless `PYTHONMALLOC` is set
    (`allocator.c_allocator_environment` says when): with Python's own allocator part of the RSS of a
    burst of clients stays after they leave; with the C allocator it goes back (README, "Load").
    Called before the server is imported (the package imports it only when asked for a name), so
    the first process costs an interpreter start and little more. Not from a frozen executable (no interpreter to run again); if the `exec` fails, this process
    serves on as it is, saying why."""
    import contextlib
    import logging
    import os

    from .allocator import c_allocator_environment, libc_trim

    environment = c_allocator_environment(
        os.environ,
        ignores_environment=bool(sys.flags.ignore_environment),
        trims=libc_trim() is not None,
        dev_mode=sys.flags.dev_mode,
    )
    if environment is None or not sys.executable or getattr(sys, "frozen", False):
        return
    for stream in (sys.stdout, sys.stderr):  # None where the descriptor was closed at start (`>&-`)
        if stream is not None:
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
    try:
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], environment)
    except OSError as exc:
        logging.getLogger("responses_ws").warning(
            "could not start again on the C allocator (%s: %s); serving on Python's allocator", sys.executable, exc
        )


def _flag_overrides(args: argparse.Namespace) -> dict[str, object]:
    return {
        "host": args.host,
        "port": args.port,
        "backend": args.backend,
        "api_keys": args.api_key or None,
        "api_keys_file": args.api_keys_file,
        "store": args.store,
        "backend_api_key": args.backend_api_key,
        "log_format": args.log_format,
        "otel": args.otel,
    }


def _load(path: str | None, flags: dict[str, object]) -> Loaded | None:
    """The validated config, or None after printing one line per problem to stderr."""
    from .loading import ConfigError, load

    try:
        return load(path, flags)
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"responses-ws: {problem}", file=sys.stderr)
        return None


def _usage(args: argparse.Namespace) -> int:
    """Totals per tenant and model from the ledger the server settings name (flags override them)."""
    from pathlib import Path

    from .ledger_sinks import RedisStreamSink, SqliteSink
    from .usage_report import parse_since, render, totals

    loaded = _load(args.config, {"store": args.store, "usage_path": args.usage_path})
    if loaded is None:
        return 2
    settings = loaded.settings
    try:
        since = parse_since(args.since) if args.since else None
    except ValueError as exc:
        print(f"responses-ws: --since: {exc}", file=sys.stderr)
        return 2
    redis_ledger = settings.usage_ledger == "redis" or (settings.usage_ledger == "auto" and settings.store != "memory")
    if not redis_ledger and not Path(settings.usage_path).exists():
        print(f"no usage ledger at {settings.usage_path} (--usage-path, or --store for the Redis one)", file=sys.stderr)
        return 2
    sink = RedisStreamSink(settings.store) if redis_ledger else SqliteSink(settings.usage_path)
    try:
        print(render(totals(sink.read(since, args.tenant)), args.format))
    finally:
        sink.close()
    return 0


def _demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    run_demo(turns=args.turns, payload_bytes=args.payload_bytes, tokens_per_s=args.tokens_per_s)
    return 0


def _check_config(args: argparse.Namespace) -> int:
    loaded = _load(args.file, {})
    if loaded is None:
        return 2
    config, settings = loaded.config, loaded.settings
    print(
        f"{args.file}: OK, {len(config.deployments)} deployment(s), policy {config.routing.policy}; "
        f"serves on {settings.host}:{settings.port}; {loaded.auth_summary()}\n"
    )
    rows = [("model", "deployment", "backend model", "why"), *config.routing_table()]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        print("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
    _print_checks(config)
    for warning in loaded.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    return 0


def _print_checks(config: ShimConfig) -> None:
    """The built-in checks each model alias gets (`[[checks]]` and its deployments' `[[deployments.checks]]`)."""
    everywhere = [f"{c.key} ({c.kind}, {c.action})" for c in config.checks]
    rows = []
    for deployment in config.deployments:
        own = [f"{c.key} ({c.kind}, {c.action})" for c in deployment.checks]
        for alias in deployment.models:
            rows.append(f"  {alias} via {deployment.name}: {', '.join([*everywhere, *own]) or 'none'}")
    if everywhere or any(d.checks for d in config.deployments):
        print("\nchecks")
        print("\n".join(rows))


def _plugins(args: argparse.Namespace) -> int:
    from .extensions import backend_kinds, default_plugin_manager, describe

    manager = default_plugin_manager()
    for row in describe(manager):
        print(f"{row['name']}  ({row['source']})")
        for hook in row["hooks"]:
            print(f"    {hook}")
    print(f"\nbackend kinds: {', '.join(sorted(backend_kinds(manager)))}")
    return 0


BENCH_SUITES = (
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
"""The suites of `python -m benchmarks` (its own list; tests/test_benchmarks.py keeps the two the same)."""

BENCH_HELP = f"""responses-ws bench runs the benchmarks of a source checkout (they are not part of the installed package):
    git clone <the responses-ws repository> && cd responses-ws
    pip install -e '.[dev]'
    responses-ws bench --quick        # or: python -m benchmarks --quick
Run from the checkout (or from any directory with an editable install); suites: {", ".join(BENCH_SUITES)}"""


def _bench(args: argparse.Namespace) -> int:
    """`python -m benchmarks` with the same arguments, in its own process: the server never imports them."""
    import os
    import subprocess
    from pathlib import Path

    roots = [Path(__file__).resolve().parent.parent, Path.cwd()]
    root = next((r for r in roots if (r / "benchmarks" / "__main__.py").is_file()), None)
    if root is None:
        asked_for_help = bool({"-h", "--help"} & set(args.bench_args))
        print(BENCH_HELP, file=sys.stdout if asked_for_help else sys.stderr)
        return 0 if asked_for_help else 2
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    return subprocess.call([sys.executable, "-m", "benchmarks", *args.bench_args], env=env)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="responses-ws",
        description="Responses API WebSocket mode for agent loops: a sidecar shim in front of any backend.",
    )
    # The same flag before or after the subcommand (`responses-ws --log-level DEBUG serve` or
    # `responses-ws serve --log-level DEBUG`); unset, each command's own default (`log_level`).
    _add_log_level(parser)
    common = argparse.ArgumentParser(add_help=False)
    _add_log_level(common)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser(
        "serve",
        help="run the shim (WebSocket and HTTP on one port)",
        parents=[common],
        epilog="Every other setting (limits, timeouts, tenant limits, allowed_origins, allowed_hosts, metrics_key, "
        "...) is an environment variable RESPONSES_WS_<NAME> or a key of the --config file's [server] table; "
        "flags win over variables, variables over the file. README: Limits, Errors. Check a setup with "
        "`responses-ws check-config FILE`.",
    )
    serve.add_argument("--host", help="interface to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default 8787)")
    serve.add_argument(
        "--backend",
        help="'simulated' (default) or the base URL of an OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1",
    )
    serve.add_argument(
        "--api-key",
        action="extend",
        nargs="+",
        metavar="KEY",
        help="bearer key(s) clients must present (repeatable); visible in the process list: prefer --api-keys-file",
    )
    serve.add_argument(
        "--api-keys-file",
        metavar="PATH",
        help="file of bearer keys, one 'KEY' or 'TENANT KEY' a line (also RESPONSES_WS_API_KEYS_FILE)",
    )
    serve.add_argument("--backend-api-key", help="bearer key the shim sends to the backend")
    serve.add_argument(
        "--store",
        metavar="URL",
        help="where store:true responses live: 'memory' (default, per process) or redis://HOST:PORT/DB, shared by "
        "workers and replicas (also RESPONSES_WS_STORE, [server] store)",
    )
    serve.add_argument(
        "--config", help="TOML file: [server] settings, [[deployments]], [routing]; variables and flags override it"
    )
    serve.add_argument("--log-format", choices=["text", "json"], help="'json': one JSON object per log line")
    serve.add_argument(
        "--otel",
        action="store_true",
        default=None,
        help="OpenTelemetry spans per turn and stage over OTLP/HTTP (OTEL_* variables; the otel extra)",
    )
    serve.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="processes accepting on the one port (default 1); share stored responses with --store redis://",
    )
    serve.set_defaults(func=_serve)

    demo = sub.add_parser(
        "demo",
        help="run one tool-calling loop over HTTP and over WebSocket on the simulated backend and compare",
        parents=[common],
    )
    demo.add_argument("--turns", type=int, default=30, help="turns in the loop (default 30)")
    demo.add_argument("--payload-bytes", type=int, default=4000, help="size of each tool result (default 4000)")
    demo.add_argument("--tokens-per-s", type=float, default=1000.0, help="simulated generation speed (default 1000)")
    # The table, not a log line per response; `demo --log-level INFO` shows them.
    demo.set_defaults(func=_demo, quiet_by_default=True)

    usage = sub.add_parser("usage", help="usage totals per tenant and model from the usage ledger", parents=[common])
    usage.add_argument("--since", help="90m, 24h, 7d or an ISO date/time (default: everything)")
    usage.add_argument("--tenant", help="only this tenant id")
    usage.add_argument("--format", choices=["table", "json", "csv"], default="table")
    usage.add_argument("--store", metavar="URL", help="the server's redis:// store: read its usage stream")
    usage.add_argument("--usage-path", metavar="PATH", help="the SQLite ledger (default: the server's usage_path)")
    usage.add_argument("--config", help="the server's TOML config: its [server] store and usage_path; flags win")
    usage.set_defaults(func=_usage)

    check = sub.add_parser(
        "check-config",
        help="validate a config file and the RESPONSES_WS_* variables as serve would; print the routing table",
        parents=[common],
    )
    check.add_argument("file", help="TOML config file")
    check.set_defaults(func=_check_config)

    plugins = sub.add_parser("plugins", help="list loaded plugins and the hooks they implement", parents=[common])
    plugins.set_defaults(func=_plugins)

    # Every argument goes to `python -m benchmarks` as given ('+' prefix: argparse leaves '--x' alone).
    bench = sub.add_parser(
        "bench",
        help="run the benchmarks of a source checkout: bench [SUITE ...] [--quick] [--out DIR] (bench --help lists them)",
        add_help=False,
        prefix_chars="+",
    )
    bench.add_argument("bench_args", nargs=argparse.REMAINDER)
    bench.set_defaults(func=_bench)
    return parser


def _add_log_level(parser: argparse.ArgumentParser) -> None:
    """The flag, with no default of its own: a shared action's default would be every command's
    (`set_defaults` on one subcommand changes it for all), so `main` fills it in."""
    parser.add_argument(
        "--log-level",
        default=argparse.SUPPRESS,
        type=str.upper,
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="(default INFO; WARNING for demo)",
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line, with the log level filled in where no `--log-level` was given."""
    args = build_parser().parse_args(argv)
    if not hasattr(args, "log_level"):
        args.log_level = "WARNING" if getattr(args, "quiet_by_default", False) else "INFO"
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """The command; `argv` None: this process's own command line (`serve` may then run itself again, see
    `_run_on_the_c_allocator`), a list: a call from code, which never replaces the calling process."""
    args = parse_args(argv)
    args.own_command_line = argv is None
    configure_logging(args.log_level, "text")
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
