"""A non-editable install works: the wheel carries every file the runtime reads.

Builds memstream's wheel offline (setuptools from the test extras, no build isolation) from a copy
of the sources, installs it with `pip install --no-deps --target`, and runs the installed package
in a subprocess whose working folder is outside the repo, with only the target (and the venv's
dependencies) on the path: `streams` must come from the target, every schema (current and
released) must load from the package data, the compatibility gate (`memstream schemas check`,
the console script) and the AsyncAPI document (`memstream catalog --format asyncapi`) must run,
and the dashboard page must be there. Takes ~15-30 s (a wheel build, an install and three
interpreter starts): marked `slow`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from streams.contracts import schemas

from .conftest import ROOT

pytestmark = pytest.mark.slow

PROBE = r"""
import json, sys
from pathlib import Path

import streams
from streams.contracts import schemas
from streams.api import dashboard

target = Path(sys.argv[1]).resolve()
d = schemas.schemas_dir().resolve()
loaded = schemas.SchemaSet.load(d)
print(json.dumps({
    "streams": str(Path(streams.__file__).resolve()),
    "schemas_dir": str(d),
    "files": sorted(str(p.relative_to(d)) for p in d.rglob("*.avsc")),
    "loaded": sorted([f"{stem}/current" for stem in loaded.current]
                     + [f"{v.stem}/{v.version}" for vs in loaded.released.values() for v in vs]),
    "page": str(dashboard.PAGE.resolve()),
    "page_bytes": len(dashboard.PAGE.read_bytes()),
}))
"""


def repo_schema_files() -> list[str]:
    d = schemas.schemas_dir().resolve()
    return sorted(str(p.relative_to(d)) for p in d.rglob("*.avsc"))


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """memstream's wheel, built from a copy of the sources and installed into a target folder."""
    base = tmp_path_factory.mktemp("wheel")
    src, dist, target = base / "src", base / "dist", base / "target"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "streams", src / "streams", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    build = subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(dist), "."],
                           cwd=src, capture_output=True, text=True, timeout=120)
    assert build.returncode == 0, build.stdout + build.stderr
    (wheel,) = dist.glob("memstream-*.whl")
    inst = subprocess.run([*pip, "install", "--no-deps", "--no-index", "--target", str(target), str(wheel)],
                          cwd=base, capture_output=True, text=True, timeout=120)
    assert inst.returncode == 0, inst.stdout + inst.stderr
    return target


def run_installed(target: Path, *argv: str) -> subprocess.CompletedProcess:
    """Run with the working folder outside the repo and only the target added to the path."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("MEMSTREAM_")}
    env["PYTHONPATH"] = str(target)
    return subprocess.run(argv, cwd=target.parent, env=env, capture_output=True, text=True, timeout=120)


def test_the_installed_package_is_the_wheel_and_loads_every_schema_from_its_package_data(installed):
    r = run_installed(installed, sys.executable, "-c", PROBE, str(installed))
    assert r.returncode == 0, r.stderr
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    root = installed.resolve()
    assert Path(seen["streams"]).is_relative_to(root), seen["streams"]
    assert not Path(seen["streams"]).is_relative_to(ROOT), seen["streams"]
    assert Path(seen["schemas_dir"]).is_relative_to(root), seen["schemas_dir"]
    assert seen["files"] == repo_schema_files()
    # every file loaded: each current schema, and each released vN of its stem
    expected = sorted(f"{f.removesuffix('.avsc')}/current" if "/" not in f else
                      f"{f.split('/')[1]}/{f.split('/')[2].removesuffix('.avsc')}" for f in seen["files"])
    assert seen["loaded"] == expected
    assert Path(seen["page"]).is_relative_to(root) and seen["page_bytes"] > 0


def test_the_installed_console_script_runs_the_compatibility_gate(installed):
    script = installed / "bin" / "memstream"
    r = run_installed(installed, sys.executable, str(script), "schemas", "check")
    assert r.returncode == 0, r.stdout + r.stderr
    files = repo_schema_files()
    current, released = sum("/" not in f for f in files), sum("/" in f for f in files)
    assert r.stdout.splitlines()[-1].startswith(f"{current} schemas, {released} released versions: compatible")


def test_the_installed_package_writes_the_asyncapi_document_from_its_schemas(installed):
    r = run_installed(installed, sys.executable, str(installed / "bin" / "memstream"), "catalog", "--format", "asyncapi")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == json.loads((ROOT / "contracts" / "asyncapi.json").read_text())
