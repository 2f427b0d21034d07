"""The plugin manager: first-party plugins and entry points, registered the same way."""

from __future__ import annotations

import functools
import importlib
import logging
from typing import Any

import pluggy

from . import hookspecs

log = logging.getLogger(__name__)

DEFAULT_PLUGINS = ("plugins.builtin.backends", "plugins.builtin.usage_log")


def create_plugin_manager(*, load_entry_points: bool = True) -> pluggy.PluginManager:
    """A fresh manager: the hook specs, the default plugins, then third-party entry points."""
    manager = pluggy.PluginManager(hookspecs.PROJECT)
    manager.add_hookspecs(hookspecs)
    for name in DEFAULT_PLUGINS:
        manager.register(importlib.import_module(name), name=name)
    if load_entry_points:
        loaded = manager.load_setuptools_entrypoints(hookspecs.PROJECT)
        if loaded:
            log.info("loaded %d plugin(s) from entry points", loaded)
    return manager


@functools.cache
def plugin_manager() -> pluggy.PluginManager:
    """The process-wide manager, created on first use."""
    return create_plugin_manager()


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
