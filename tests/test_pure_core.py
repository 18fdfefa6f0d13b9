"""The functional core stays pure: the rule packages import nothing from Kafka or Faust."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "streams"
PURE_PACKAGES = ("core", "sessions", "graphs", "analytics")
FORBIDDEN = ("kafka", "faust", "confluent_kafka", "aiokafka", "mode")


@pytest.mark.parametrize("package", PURE_PACKAGES)
def test_rule_package_imports_no_kafka_or_faust(package):
    files = sorted((ROOT / package).glob("*.py"))
    assert files
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            for n in names:
                assert n.split(".")[0] not in FORBIDDEN, f"{package}/{path.name} imports {n}"
