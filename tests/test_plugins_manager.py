"""The plugin manager: defaults registered like third-party plugins, entry points loaded."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.plugin_dist import write_plugin_dist

from plugins import create_plugin_manager, describe, hookimpl


@pytest.fixture
def third_party_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A tiny installed distribution that registers a plugin through the `responses_ws` entry-point group."""
    write_plugin_dist(
        tmp_path,
        "tiny_plugin",
        """
        from plugins import hookimpl

        CALLS = []

        @hookimpl
        def responses_ws_validators(settings):
            def no_shouting(new_items, previous, request):
                CALLS.append(len(new_items))
            return [no_shouting]
        """,
        dist="tiny-plugin",
        entry_point="tiny",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("tiny_plugin", None)


def test_default_plugins_are_registered_like_any_other():
    manager = create_plugin_manager(load_entry_points=False)
    rows = {row["name"]: row for row in describe(manager)}
    assert rows["server_shim.usage_log"]["hooks"] == ["responses_ws_response_finished"]
    assert rows["server_shim.usage_log"]["source"] == "builtin"
    assert rows["server_shim.backends.kinds"]["hooks"] == ["responses_ws_backend_kinds"]


def test_entry_point_plugin_is_loaded_and_its_hook_called(third_party_plugin: Path):
    manager = create_plugin_manager()
    rows = {row["name"]: row for row in describe(manager)}
    assert rows["tiny"]["source"] == "tiny-plugin 1.0"
    validators = [v for group in manager.hook.responses_ws_validators(settings=None) for v in group]
    assert len(validators) == 1
    validators[0]([{"type": "message"}], None, None)
    import tiny_plugin

    assert tiny_plugin.CALLS == [1]


def test_hookimpl_marker_checks_hook_names():
    manager = create_plugin_manager(load_entry_points=False)

    class Wrong:
        @hookimpl
        def responses_ws_not_a_hook(self):
            return None

    manager.register(Wrong())
    with pytest.raises(Exception, match="unknown hook"):
        manager.check_pending()


def test_cli_lists_plugins(third_party_plugin: Path):
    result = subprocess.run(
        [sys.executable, "-m", "server_shim.cli", "plugins"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(third_party_plugin), "PATH": "/usr/bin:/bin"},
        check=True,
    )
    assert "server_shim.usage_log  (builtin)" in result.stdout
    assert "tiny  (tiny-plugin 1.0)" in result.stdout
    assert "responses_ws_validators" in result.stdout
