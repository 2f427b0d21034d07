"""The responses-ws integrations: every hook spec (server and client), the plugin manager, framework integrations."""

from __future__ import annotations

from .hookspecs import hookimpl, hookspec
from .manager import create_plugin_manager, describe, plugin_manager

__all__ = ["create_plugin_manager", "describe", "hookimpl", "hookspec", "plugin_manager"]
