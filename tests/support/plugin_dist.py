"""A third-party plugin as its own installed distribution: a module plus a `.dist-info` with entry points.

Written into a folder that a test puts on `sys.path` (or `PYTHONPATH` of a subprocess): exactly what
`pip install` leaves in site-packages, found by `importlib.metadata` like any installed package,
with no network and no build.
"""

from __future__ import annotations

import textwrap
from pathlib import Path


def write_plugin_dist(
    root: Path, module: str, source: str, *, dist: str, version: str = "1.0", entry_point: str | None = None
) -> Path:
    """Install `module` (its `source`) as distribution `dist`, registered in the `responses_ws` group as
    `entry_point` (default: the module's name)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / f"{module}.py").write_text(textwrap.dedent(source))
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[responses_ws]\n{entry_point or module} = {module}\n")
    (info / "RECORD").write_text(f"{module}.py,,\n{info.name}/METADATA,,\n{info.name}/entry_points.txt,,\n")
    return root
