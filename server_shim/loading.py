"""From a config file, `RESPONSES_WS_*` variables and flags to validated settings, or one line per problem.

Precedence: flags over environment variables over the file's `[server]` table over defaults. Each
source is validated on its own, so that every problem names where it came from (the file and key,
the variable, or the flag) and what was expected; every problem is reported, not just the first.
"""

from __future__ import annotations

import difflib
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_origin

from pydantic import BaseModel, ValidationError

from . import redis_store, tracing
from .admission import tenant_connection_cap, tenant_reserved_connections
from .browsers import is_loopback
from .config import DeploymentConfig, Quirks, RoutingConfig, ServerSection, ShimConfig
from .settings import Settings, split_list
from .tenants import ApiKey, load_keys

ENV_PREFIX = "RESPONSES_WS_"
CLIENT_VARIABLES = frozenset({"RESPONSES_WS_TRANSPORT"})
"""Variables the client side reads (`ws_transport`, `plugins`); not server settings, never warned about."""

FLAG_NAMES = {"api_keys": "--api-key"}
"""Settings whose flag is not `--` plus the field name with dashes."""

_KNOWN_KEYS = sorted(
    {
        name
        for model in (ShimConfig, ServerSection, DeploymentConfig, RoutingConfig, Quirks)
        for name in model.model_fields
    }
)


@dataclass(frozen=True)
class Problem:
    """One thing wrong: where (file, `environment` or `flag`), which key, and what was expected."""

    where: str
    key: str | None
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.key}: {self.message}" if self.key else f"{self.where}: {self.message}"


class ConfigError(Exception):
    """Every problem found; `str()` is one line per problem."""

    def __init__(self, problems: list[Problem]) -> None:
        super().__init__("\n".join(map(str, problems)))
        self.problems = problems


@dataclass
class Loaded:
    """What `serve` runs with: the settings, the deployments, and what deserves a warning."""

    settings: Settings
    config: ShimConfig
    path: str | None = None
    keys: list[ApiKey] = field(default_factory=list)
    from_file: bool = False
    """Whether the deployments come from the file (else from `--backend` / `RESPONSES_WS_BACKEND`)."""
    warnings: list[str] = field(default_factory=list)

    def auth_summary(self) -> str:
        """Keys, tenants and the per-tenant connection cap in force: what `serve` and `check-config` say once
        (the cap's default depends on the number of tenants, so it is shown, not left to a first 503)."""
        if not self.keys:
            return "auth off: no api key is required"
        tenants = len({key.tenant for key in self.keys})
        settings = self.settings
        cap = tenant_connection_cap(settings.max_connections, settings.tenant_max_connections, tenants)
        reserved = tenant_reserved_connections(settings.max_connections, cap, tenants)
        share = f"each at most {cap} WebSocket connections" if cap else "no per-tenant connection cap"
        if reserved:
            share += f", {reserved} kept free for each"
        return f"auth on: {len(self.keys)} api key(s), {tenants} tenant(s), {share}"


def load(path: str | None, flags: Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> Loaded:
    """Validate everything `serve` would use; raises `ConfigError` listing every problem."""
    problems: list[Problem] = []
    config = _load_file(path, problems) if path is not None else None
    env_values = _env_values(environ, problems)
    flag_values = {name: value for name, value in flags.items() if value is not None}
    if path is not None and config is not None and config.deployments and "backend" in flag_values:
        problems.append(Problem(path, None, "--backend and a config with [[deployments]] both name backends: use one"))
    if problems:
        raise ConfigError(problems)
    file_values = config.server.model_dump(exclude_unset=True) if config is not None else {}
    try:
        settings = Settings(**{**file_values, **env_values, **flag_values})
    except ValidationError as exc:
        raise ConfigError([Problem("flag", FLAG_NAMES.get(n, f"--{n}"), m) for n, m in _errors(exc)]) from None
    try:
        keys = load_keys(settings.api_keys, settings.api_keys_file)
    except OSError as exc:
        problem = Problem("API keys", str(settings.api_keys_file), f"cannot read the file: {exc.strerror}")
        raise ConfigError([problem]) from None
    except ValueError as exc:
        raise ConfigError([Problem("API keys", None, str(exc))]) from None
    if settings.otel and not tracing.available():
        raise ConfigError([Problem("otel", None, f"OpenTelemetry is not installed: {tracing.EXTRA}")])
    if settings.store != "memory" and not redis_store.available():
        raise ConfigError([Problem("store", None, f"a redis:// store needs the redis package: {redis_store.EXTRA}")])
    from_file = config is not None and bool(config.deployments)
    if config is None or not config.deployments:
        routing = config.routing if config is not None else None
        config = ShimConfig.from_settings(settings)
        if routing is not None:
            config.routing = routing
    loaded = Loaded(settings, config, path, keys, from_file)
    loaded.warnings = _warnings(loaded, environ)
    return loaded


def _load_file(path: str, problems: list[Problem]) -> ShimConfig | None:
    try:
        raw = tomllib.loads(Path(path).read_text())
    except OSError as exc:
        problems.append(Problem(path, None, f"cannot read the file: {exc.strerror or exc}"))
        return None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        problems.append(Problem(path, None, f"not valid TOML: {exc}"))
        return None
    try:
        config = ShimConfig.model_validate(raw)
    except ValidationError as exc:
        problems.extend(Problem(path, key, message) for key, message in _errors(exc, raw))
        return None
    problems.extend(_kind_problems(config, path))
    return config


def _kind_problems(config: ShimConfig, path: str) -> list[Problem]:
    """Deployments that cannot be built: a kind no loaded plugin provides, or options its factory refuses."""
    from .deployments import factory_for
    from .extensions import backend_kinds, default_plugin_manager

    kinds = backend_kinds(default_plugin_manager())
    problems = []
    for index, spec in enumerate(config.deployments):
        try:
            factory_for(spec, kinds)
        except ValueError as exc:
            problems.append(Problem(path, f"deployments[{index}] ({spec.name!r})", str(exc)))
    return problems


def _env_values(environ: Mapping[str, str], problems: list[Problem]) -> dict[str, Any]:
    """The `RESPONSES_WS_<NAME>` variables that are set, validated alone (names are case-insensitive)."""
    values: dict[str, Any] = {}
    for name, value in environ.items():
        upper = name.upper()
        if not upper.startswith(ENV_PREFIX):
            continue
        key = upper.removeprefix(ENV_PREFIX).lower()
        field_info = Settings.model_fields.get(key)
        if field_info is not None:
            values[key] = split_list(value) if get_origin(field_info.annotation) is list else value
    try:
        return ServerSection.model_validate(values).model_dump(exclude_unset=True)
    except ValidationError as exc:
        problems.extend(Problem("environment", ENV_PREFIX + key.upper(), message) for key, message in _errors(exc))
        return {}


def _errors(exc: ValidationError, raw: Mapping[str, Any] | None = None) -> list[tuple[str, str]]:
    """(key, message) per pydantic error, worded for a person editing a file."""
    return [(_key(error["loc"], raw), _message(error)) for error in exc.errors(include_url=False)]


def _key(loc: tuple[int | str, ...], raw: Mapping[str, Any] | None) -> str:
    """`server.port`, `deployments[1] ('llama').base_url`: the key as it reads in the file."""
    key = ""
    node: Any = raw
    for part in loc:
        if isinstance(part, int):
            key += f"[{part}]"
            node = node[part] if isinstance(node, list) and part < len(node) else None
            if isinstance(node, dict) and isinstance(node.get("name"), str):
                key += f" ({node['name']!r})"
        else:
            key += f".{part}" if key else str(part)
            node = node.get(part) if isinstance(node, dict) else None
    return key or "(top level)"


def _message(error: Mapping[str, Any]) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        name = str(error["loc"][-1])
        close = difflib.get_close_matches(name, _KNOWN_KEYS, n=1)
        return "unknown key" + (f" (did you mean {close[0]!r}?)" if close else "")
    if kind == "missing":
        return "required, but not set"
    message = str(error["msg"]).removeprefix("Value error, ")
    if message.startswith("Input should be "):
        message = "expected " + message.removeprefix("Input should be ")
    value = error.get("input")
    if isinstance(value, str | int | float | bool) and not isinstance(value, BaseModel):
        message += f", got {value!r}"
    return message


def _warnings(loaded: Loaded, environ: Mapping[str, str]) -> list[str]:
    """Things that work but are probably not what the operator meant."""
    settings = loaded.settings
    found = []
    if not loaded.keys and not is_loopback(settings.host):
        found.append(
            f"listening on {settings.host} with no api key: anyone who can reach port {settings.port} can use "
            "the backends (set --api-key or RESPONSES_WS_API_KEYS)"
        )
    if not loaded.keys and "*" in settings.allowed_origins:
        found.append(
            "allowed_origins '*' with no api key: any web page opened in a browser that reaches this server "
            "can use the backends (list the origins you mean, or set an api key)"
        )
    for deployment in loaded.config.deployments:
        if deployment.api_key_env and not environ.get(deployment.api_key_env):
            found.append(
                f"deployment {deployment.name!r}: api_key_env {deployment.api_key_env} is not set; "
                "its requests go without a key"
            )
    for name in environ:
        upper = name.upper()
        key = upper.removeprefix(ENV_PREFIX).lower()
        if upper.startswith(ENV_PREFIX) and upper not in CLIENT_VARIABLES and key not in Settings.model_fields:
            close = difflib.get_close_matches(key, list(Settings.model_fields), n=1)
            hint = f" (did you mean {ENV_PREFIX}{close[0].upper()}?)" if close else ""
            found.append(f"environment: {name} is not a server setting and is ignored{hint}")
    return found
