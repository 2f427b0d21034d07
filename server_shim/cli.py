"""The `responses-ws` command: serve, demo, check-config, plugins."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .settings import Settings

if TYPE_CHECKING:
    from .config import ShimConfig


def _serve(args: argparse.Namespace) -> int:
    from .server import serve

    loaded = _serve_settings(args)
    if isinstance(loaded, str):
        print(loaded, file=sys.stderr)
        return 2
    settings, config = loaded
    if args.workers < 1:
        print("--workers must be at least 1", file=sys.stderr)
        return 2
    where = f"{len(config.deployments)} deployment(s) from {args.config}" if config else settings.backend
    logging.getLogger(__name__).info("serving on %s:%s, backend %s", settings.host, settings.port, where)
    serve(settings, config=config, log_level=args.log_level.lower(), workers=args.workers)
    return 0


def _serve_settings(args: argparse.Namespace) -> tuple[Settings, ShimConfig | None] | str:
    """Settings from the config file, the environment and the flags (flags win), or why they are invalid."""
    from pydantic import ValidationError

    from .config import ShimConfig
    from .tenants import load_keys

    overrides = {
        "host": args.host,
        "port": args.port,
        "backend": args.backend,
        "api_keys": args.api_key or None,
        "api_keys_file": args.api_keys_file,
        "store": args.store,
        "backend_api_key": args.backend_api_key,
    }
    config = None
    try:
        if args.config:
            try:
                config = ShimConfig.load(args.config)
            except (OSError, ValueError, ValidationError) as exc:
                return f"{args.config}: invalid config\n{exc}"
            if config.deployments and args.backend:
                return "--backend and a config with [[deployments]] both name backends: use one"
            kind_error = _kind_error(config)
            if kind_error:
                return f"{args.config}: invalid config\n{kind_error}"
            settings = config.settings(**overrides)
        else:
            settings = Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        return f"invalid settings\n{exc}"
    try:
        load_keys(settings.api_keys, settings.api_keys_file)
    except (OSError, ValueError) as exc:
        return f"API keys: {exc}"
    return settings, config if config and config.deployments else None


def _usage(args: argparse.Namespace) -> int:
    """Totals per tenant and model from the ledger the server settings name (flags override them)."""
    from pathlib import Path

    from pydantic import ValidationError

    from .ledger_sinks import RedisStreamSink, SqliteSink
    from .usage_report import parse_since, render, totals

    try:
        overrides = {"store": args.store, "usage_path": args.usage_path}
        settings = Settings(**{k: v for k, v in overrides.items() if v is not None})
        since = parse_since(args.since) if args.since else None
    except (ValidationError, ValueError) as exc:
        print(exc, file=sys.stderr)
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
    from pydantic import ValidationError

    from .config import ShimConfig

    try:
        config = ShimConfig.load(args.file)
    except (OSError, ValueError, ValidationError) as exc:
        print(f"{args.file}: invalid config\n{exc}", file=sys.stderr)
        return 2
    kind_error = _kind_error(config)
    if kind_error:
        print(f"{args.file}: invalid config\n{kind_error}", file=sys.stderr)
        return 2
    print(f"{args.file}: OK, {len(config.deployments)} deployment(s), policy {config.routing.policy}\n")
    rows = [("model", "deployment", "backend model", "why"), *config.routing_table()]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        print("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
    return 0


def _kind_error(config: ShimConfig) -> str | None:
    """Why a deployment cannot be built: its kind no loaded plugin provides, or options its factory refuses."""
    from .extensions import backend_kinds, default_plugin_manager
    from .router import factory_for

    kinds = backend_kinds(default_plugin_manager())
    for spec in config.deployments:
        try:
            factory_for(spec, kinds)
        except ValueError as exc:
            return str(exc)
    return None


def _plugins(args: argparse.Namespace) -> int:
    from .extensions import backend_kinds, default_plugin_manager, describe

    manager = default_plugin_manager()
    for row in describe(manager):
        print(f"{row['name']}  ({row['source']})")
        for hook in row["hooks"]:
            print(f"    {hook}")
    print(f"\nbackend kinds: {', '.join(sorted(backend_kinds(manager)))}")
    return 0


BENCH_HELP = """responses-ws bench runs the benchmarks of a source checkout (they are not part of the installed package):
    git clone <the responses-ws repository> && cd responses-ws
    pip install -e '.[dev]'
    responses-ws bench --quick        # or: python -m benchmarks --quick"""


def _bench(args: argparse.Namespace) -> int:
    """`python -m benchmarks` with the same arguments, in its own process: the server never imports them."""
    import os
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    if not (root / "benchmarks" / "__main__.py").is_file():
        print(BENCH_HELP, file=sys.stderr)
        return 2
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    return subprocess.call([sys.executable, "-m", "benchmarks", *args.bench_args], env=env)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="responses-ws",
        description="Responses API WebSocket mode for agent loops: a sidecar shim in front of any backend.",
    )
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", help="run the shim (WebSocket and HTTP on one port)")
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
    serve.add_argument("--config", help="TOML file with a [server] table; flags override it")
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
    )
    demo.add_argument("--turns", type=int, default=30, help="turns in the loop (default 30)")
    demo.add_argument("--payload-bytes", type=int, default=4000, help="size of each tool result (default 4000)")
    demo.add_argument("--tokens-per-s", type=float, default=1000.0, help="simulated generation speed (default 1000)")
    demo.set_defaults(func=_demo)

    usage = sub.add_parser("usage", help="usage totals per tenant and model from the usage ledger")
    usage.add_argument("--since", help="90m, 24h, 7d or an ISO date/time (default: everything)")
    usage.add_argument("--tenant", help="only this tenant id")
    usage.add_argument("--format", choices=["table", "json", "csv"], default="table")
    usage.add_argument("--store", metavar="URL", help="the server's redis:// store: read its usage stream")
    usage.add_argument("--usage-path", metavar="PATH", help="the SQLite ledger (default: the server's usage_path)")
    usage.set_defaults(func=_usage)

    check = sub.add_parser("check-config", help="validate a config file and print its routing table")
    check.add_argument("file", help="TOML config file")
    check.set_defaults(func=_check_config)

    plugins = sub.add_parser("plugins", help="list loaded plugins and the hooks they implement")
    plugins.set_defaults(func=_plugins)

    # Every argument goes to `python -m benchmarks` as given ('+' prefix: argparse leaves '--x' alone).
    bench = sub.add_parser(
        "bench",
        help="run the benchmarks: bench [overhead|agent|relay|litellm ...] [--quick] [--out DIR] (bench --help)",
        add_help=False,
        prefix_chars="+",
    )
    bench.add_argument("bench_args", nargs=argparse.REMAINDER)
    bench.set_defaults(func=_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.log_level != "DEBUG":
        logging.getLogger("httpx2").setLevel(logging.WARNING)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
