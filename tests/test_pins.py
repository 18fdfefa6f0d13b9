"""The Faust and aiokafka internals memstream relies on (docs/state-and-failures.md, streams/runtime/checkpoint.py,
streams/runtime/rebalance.py) were read in, and verified against, exactly the pinned versions: another
installed version must fail loudly here, before anything subtler fails elsewhere."""

from __future__ import annotations

import re
from importlib import metadata

import pytest

from .conftest import ROOT

PINNED = dict(re.findall(r'^\s*"([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?==([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M))


@pytest.mark.parametrize("dist", ["faust-streaming", "aiokafka", "rocksdict", "confluent-kafka", "fastavro", "prometheus-client"])
def test_installed_version_is_the_pinned_one(dist):
    assert dist in PINNED, f"{dist} is not pinned with == in pyproject.toml"
    installed = metadata.version(dist)
    assert installed == PINNED[dist], (
        f"{dist} {installed} is installed but memstream was verified against {PINNED[dist]} (pyproject.toml): "
        "its internals (rebalance, commit, changelog and store behaviour) may differ; re-read them before "
        "changing the pin")
