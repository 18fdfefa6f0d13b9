"""Issue 16: tests/ mirrors the package, and the suite does not depend on the working folder."""

from __future__ import annotations

import subprocess
import sys

from .conftest import ROOT


def _packages(folder):
    return {p.name for p in folder.iterdir() if (p / "__init__.py").is_file()}


def test_every_package_of_streams_has_its_test_folder_and_only_system_and_example_tests_stand_apart():
    packages, folders = _packages(ROOT / "streams"), _packages(ROOT / "tests")
    assert packages - folders == set(), f"streams/ packages without a tests/ folder: {sorted(packages - folders)}"
    # end to end, across the wings; and the client examples in examples/, run against the stack
    assert folders - packages == {"system", "examples"}


def test_the_whole_suite_is_collected_from_another_working_folder(tmp_path):
    # collecting imports every test module (and conftest.py): the files they read at import and
    # the helpers they import must be found through the checkout, not through the current folder
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           str(ROOT / "tests")], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    collected = [line for line in proc.stdout.splitlines() if "::" in line]
    assert any(line.startswith("tests/core/") for line in collected)
    assert any(line.startswith("tests/system/") for line in collected)
