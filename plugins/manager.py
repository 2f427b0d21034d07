"""The plugin manager with every hook, server and client: the server's manager plus the client-side specs."""

from __future__ import annotations

import functools
import types

import pluggy

from server_shim.extensions import create_plugin_manager as create_server_manager
from server_shim.extensions import default_plugin_manager, describe

from . import hookspecs

CLIENT_SPECS = types.ModuleType(__name__ + ".client_specs", "The client-side specs alone (the server adds its own).")
CLIENT_SPECS.__dict__.update({name: getattr(hookspecs, name) for name in hookspecs.CLIENT_HOOKS})

__all__ = ["create_plugin_manager", "describe", "plugin_manager"]


def create_plugin_manager(*, load_entry_points: bool = True) -> pluggy.PluginManager:
    """A fresh manager: every hook spec, the built-in plugins, then third-party entry points."""
    return create_server_manager(load_entry_points=load_entry_points, specs=[CLIENT_SPECS])


@functools.cache
def plugin_manager() -> pluggy.PluginManager:
    """The process-wide manager: the one `create_app()` uses by default, with the client-side specs added.

    Registering a plugin here reaches both the server (apps created afterwards) and `plugins.transport.wrap`.
    """
    manager = default_plugin_manager()
    manager.add_hookspecs(CLIENT_SPECS)
    return manager
