"""The server's plugin manager: built-in plugins and entry points, registered the same way.

The server reaches its hooks through this module only, so it runs without the `plugins`
package (the integrations layer). `plugins.create_plugin_manager()` builds on this one and adds
the client-side hook specs.
"""

from __future__ import annotations

import functools
import importlib
import logging
from collections.abc import Awaitable, Callable, Iterable
from types import ModuleType
from typing import Any, cast

import pluggy

from . import hookspecs
from .backends.base import BackendFactory
from .checks import Check
from .postinference import TurnInfo, call_each
from .safety import Classifier, Validator

log = logging.getLogger(__name__)

BUILTIN_PLUGINS = ("server_shim.backends.kinds", "server_shim.usage_log")
"""Registered before the entry points, in this order, under these names."""


def create_plugin_manager(
    *, load_entry_points: bool = True, specs: Iterable[ModuleType | type] = ()
) -> pluggy.PluginManager:
    """A fresh manager: the server's hook specs plus `specs`, the built-in plugins, then entry points.

    Entry-point plugins come from the `responses_ws` group of every installed distribution.
    """
    manager = pluggy.PluginManager(hookspecs.PROJECT)
    manager.add_hookspecs(hookspecs)
    for extra in specs:
        manager.add_hookspecs(extra)
    for name in BUILTIN_PLUGINS:
        manager.register(importlib.import_module(name), name=name)
    if load_entry_points:
        loaded = manager.load_setuptools_entrypoints(hookspecs.PROJECT)
        if loaded:
            log.info("loaded %d plugin(s) from entry points", loaded)
    return manager


@functools.cache
def default_plugin_manager() -> pluggy.PluginManager:
    """The server's process-wide manager, created on first use (what `create_app()` uses by default)."""
    return create_plugin_manager()


def backend_kinds(manager: pluggy.PluginManager) -> dict[str, BackendFactory]:
    """Every plugin's kinds merged; on a duplicate kind the implementation pluggy calls first wins.

    `get_hookimpls()` lists implementations in reverse call order, so merging in list order
    leaves the first-called one in place: the later-registered plugin, or a `tryfirst` one.
    """
    kinds: dict[str, BackendFactory] = {}
    owners: dict[str, str] = {}
    for impl in manager.hook.responses_ws_backend_kinds.get_hookimpls():
        provided = cast("dict[str, BackendFactory]", impl.function() or {})
        for kind, factory in provided.items():
            if kind in owners:
                log.info("backend kind %r of plugin %s replaces that of %s", kind, impl.plugin_name, owners[kind])
            kinds[kind] = factory
            owners[kind] = impl.plugin_name
    return kinds


def validators(manager: pluggy.PluginManager, settings: Any) -> list[Validator]:
    return _flatten(manager.hook.responses_ws_validators(settings=settings))


def classifiers(manager: pluggy.PluginManager, settings: Any) -> list[Classifier]:
    return _flatten(manager.hook.responses_ws_classifiers(settings=settings))


def checks(manager: pluggy.PluginManager, settings: Any) -> list[Check]:
    return _flatten(manager.hook.responses_ws_checks(settings=settings))


def _flatten(groups: list[list[Any]]) -> list[Any]:
    return [item for group in groups for item in group or ()]


class ResponseSink:
    """Every plugin's `responses_ws_response_finished`, each on its own: one failing sink stops no other.

    Synchronous implementations run at once; from the first that returns an awaitable on, the rest
    run in the awaitable returned, in order (`call_each`), so a turn whose sinks are all
    synchronous (the built-in ones) needs no task. An implementation with a `listening` attribute (a
    function of no arguments) is called only while it returns true: the built-in usage log listens only
    while DEBUG is on, so a turn nothing listens to schedules nothing (`listening()`).
    """

    def __init__(self, manager: pluggy.PluginManager) -> None:
        self.hook = manager.hook.responses_ws_response_finished
        self.known: list[Any] = []
        """The hook's implementations when `named` was made (remade when a plugin comes or goes)."""
        self.named: list[tuple[str, Callable[..., Any], tuple[str, ...], Callable[[], bool] | None]] = []

    def _current(self) -> list[tuple[str, Callable[..., Any], tuple[str, ...], Callable[[], bool] | None]]:
        impls = self.hook.get_hookimpls()
        if impls != self.known:
            self.known[:] = impls
            self.named[:] = [
                (f"of plugin {i.plugin_name}", i.function, tuple(i.argnames), getattr(i.function, "listening", None))
                for i in reversed(impls)
            ]
        return self.named

    def listening(self) -> bool:
        for _, _, _, listens in self._current():  # noqa: SIM110 - not any() over a generator: asked every turn
            if listens is None or listens():
                return True
        return False

    def __call__(self, response: dict[str, Any], info: TurnInfo) -> Awaitable[None] | None:
        args = {"response": response, "transport": info.transport, "info": info}
        calls = [
            (name, functools.partial(function, *(args[n] for n in names)))
            for name, function, names, listens in self._current()
            if listens is None or listens()
        ]
        return call_each(calls, response["id"])


def describe(manager: pluggy.PluginManager) -> list[dict[str, Any]]:
    """What `responses-ws plugins` prints: each plugin, where it comes from, and its hooks."""
    dists = {id(plugin): dist for plugin, dist in manager.list_plugin_distinfo()}
    rows = []
    for name, plugin in manager.list_name_plugin():
        if plugin is None:
            continue
        dist = dists.get(id(plugin))
        hooks = sorted(caller.name for caller in manager.get_hookcallers(plugin) or ())
        rows.append(
            {
                "name": name,
                "source": f"{dist.project_name} {dist.version}" if dist else "builtin",
                "hooks": hooks,
            }
        )
    return rows
