"""examples/framework_agents.py for the frameworks of this venv (openai 2.x), run as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(150)


@pytest.mark.parametrize(("framework", "chained"), [("llama-index", "5 of 6"), ("crewai", "3 of 6")])
def test_framework_agent_example_chains(framework: str, chained: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "examples/framework_agents.py", framework],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "record 5 is blue" in done.stdout
    assert f"{framework}: {chained} turns chained, 0 over HTTP" in done.stdout
