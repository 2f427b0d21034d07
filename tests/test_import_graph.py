"""Dependencies run one way: `plugins` may import `server_shim` and `ws_transport`; those two import
neither `plugins`, `benchmarks` nor the tests, at import time or at run time.

Two checks: every `import` statement in the two packages (including those inside functions),
read from the source; and real processes that import every module, build the server with its
default plugin manager and serve a turn while an import hook refuses the forbidden packages.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = {
    "server_shim": {"plugins", "benchmarks", "tests", "support", "ws_transport"},
    "ws_transport": {"plugins", "benchmarks", "tests", "support", "server_shim"},
    "plugins": {"benchmarks", "tests", "support"},
    "benchmarks": {"tests", "support"},
    "chat_mapping": {"plugins", "benchmarks", "tests", "support", "server_shim", "ws_transport"},
}


def imported_roots(path: Path) -> set[str]:
    """Top-level names of every module `path` imports (relative imports stay in the package)."""
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_module_of_a_package_imports_what_it_must_not(package: str) -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(imported_roots(path) & FORBIDDEN[package])
        for path in sorted((ROOT / package).rglob("*.py"))
    }
    assert {path: names for path, names in offenders.items() if names} == {}


BLOCKER = """
import importlib.abc, sys

class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ImportError(f"forbidden import of {{name}}")
        return None

sys.meta_path.insert(0, Refuse())
"""


def run_blocked(code: str, blocked: set[str], *, extra_path: Path | None = None) -> subprocess.CompletedProcess[str]:
    script = BLOCKER.format(blocked=sorted(blocked)) + textwrap.dedent(code)
    path = [str(extra_path)] if extra_path else []
    return subprocess.run(
        [sys.executable, "-c", f"import sys; sys.path[:0] = {path!r}\n" + script],
        capture_output=True,
        text=True,
        timeout=90,
        cwd=ROOT,
    )


@pytest.mark.parametrize("package", ["server_shim", "ws_transport"])
def test_every_module_imports_with_the_forbidden_packages_refused(package: str) -> None:
    result = run_blocked(
        f"""
        import importlib, pkgutil
        import {package}
        for module in pkgutil.walk_packages({package}.__path__, "{package}."):
            importlib.import_module(module.name)
        print("ok")
        """,
        FORBIDDEN[package],
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


SERVE_ONE_TURN = """
from openai import OpenAI
from server_shim import BackgroundServer, Settings, create_app

settings = Settings(drain_timeout_s=1.0)
with BackgroundServer(create_app(settings), settings) as server:
    client = OpenAI(base_url=server.base_url, api_key="sk-test", max_retries=0)
    response = client.responses.create(model="simulated-1", input="hello", max_output_tokens=3)
    print(response.status)
"""


def test_the_server_serves_a_turn_with_the_integrations_refused() -> None:
    result = run_blocked(SERVE_ONE_TURN, FORBIDDEN["server_shim"])
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "completed"


def test_a_users_own_plugins_folder_does_not_break_the_server(tmp_path: Path) -> None:
    """A project with its own `plugins/` package on sys.path: the server never looks there."""
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "__init__.py").write_text("NAME = 'a project of its own'\n")
    result = run_blocked(
        "import plugins\nassert plugins.NAME\n" + SERVE_ONE_TURN, {"benchmarks", "tests"}, extra_path=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "completed"


def test_cli_plugins_and_check_config_run_with_the_integrations_refused(tmp_path: Path) -> None:
    config = tmp_path / "sidecar.toml"
    config.write_text('[[deployments]]\nname = "sim"\nkind = "simulated"\nmodels = { "m" = "m" }\n')
    result = run_blocked(
        f"""
        from server_shim.cli import main
        assert main(["plugins"]) == 0
        assert main(["check-config", {str(config)!r}]) == 0
        """,
        FORBIDDEN["server_shim"],
    )
    assert result.returncode == 0, result.stderr
    assert "server_shim.backends.kinds  (builtin)" in result.stdout
    assert "backend kinds: cerebras, openai_compatible, responses, simulated" in result.stdout
