"""The Grafana dashboard (deploy/grafana/memstream-dashboard.json) queries only series a worker
exports, so it cannot drift from the code: the exported names are read from the registry of a
runtime built like a worker's (every agent and view registered, the scrape-time collector of
streams/api/health.py included), not from a list kept here. No broker."""

from __future__ import annotations

import json
import re

import pytest

from streams.composition import create_runtime
from streams.runtime.metrics import sample_names
from streams.settings import Settings
from tests.conftest import ROOT

DASHBOARD = ROOT / "deploy" / "grafana" / "memstream-dashboard.json"
NAME = re.compile(r"\bmemstream_[a-zA-Z0-9_:]*")
# PromQL words that are not series: functions, aggregations, keywords
_IDENT = re.compile(r"(?<![\w$\"{.])([a-zA-Z_:][a-zA-Z0-9_:]*)\b(?!\s*[(=!~])")
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool", "and", "or",
                "unless", "inf", "nan"}


@pytest.fixture(scope="module")
def exported() -> set[str]:
    rt = create_runtime(Settings(registry_url="", partitions=3, app_id="test-grafana-names"))
    return sample_names(rt.metrics.registry.collect())


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def panels(dash: dict) -> list[dict]:
    out = []
    for p in dash["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))  # a collapsed row holds its panels
    return out


def queries(dash: dict) -> list[str]:
    exprs = [t["expr"] for p in panels(dash) for t in p.get("targets", [])]
    for v in dash["templating"]["list"]:
        if v["type"] == "query":  # Grafana's label_values(<series selector>, <label>)
            m = re.fullmatch(r"label_values\((.+),\s*\w+\)", v["definition"])
            assert m, f"variable {v['name']}: not a label_values() query"
            exprs.append(m[1])
    return exprs


def series_names(expr: str) -> set[str]:
    """Every identifier of `expr` that PromQL reads as a series name (outside label matchers,
    `by (...)` lists and strings; not a function, keyword or duration)."""
    bare = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)          # strings
    bare = re.sub(r"\{[^}]*\}", "{}", bare)                  # label matchers
    bare = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", bare)
    bare = re.sub(r"\[[^\]]*\]", "[]", bare)                 # range durations
    bare = re.sub(r"\$\w+", " ", bare)                        # Grafana variables
    return {m for m in _IDENT.findall(bare) if m.lower() not in PROMQL_WORDS}


def test_the_worker_exports_the_families_the_dashboard_needs(exported):
    assert {"memstream_in_total", "memstream_out_total", "memstream_dlq_total", "memstream_consumer_lag",
            "memstream_processing_seconds_bucket", "memstream_ready", "memstream_table_keys",
            "memstream_health_problem"} <= exported


def test_every_series_the_dashboard_queries_is_exported(dashboard, exported):
    exprs = queries(dashboard)
    assert exprs, "the dashboard has no queries"
    for expr in exprs:
        used = series_names(expr)
        assert used, f"no series in {expr!r}"
        assert used <= exported, f"{expr!r} queries {sorted(used - exported)}, which no worker exports"
        assert set(NAME.findall(expr)) <= exported  # names inside matchers too (e.g. {__name__=...})


def test_series_names_reads_promql():
    expr = ('histogram_quantile(0.95, sum by (le, topic) (rate(memstream_processing_seconds_bucket'
            '{job=~"$job", instance=~"a|b"}[$__rate_interval]))) > 0 or on (instance) up offset 5m')
    assert series_names(expr) == {"memstream_processing_seconds_bucket", "up"}
    assert series_names('sum without (partition) (memstream_consumer_lag{topic="x.y"})') == {"memstream_consumer_lag"}


def test_dashboard_covers_what_operators_watch(dashboard):
    used = set().union(*(series_names(e) for e in queries(dashboard)))
    for name in ("memstream_in_total", "memstream_out_total", "memstream_dlq_total", "memstream_consumer_lag",
                 "memstream_processing_seconds_bucket", "memstream_recovery_in_progress", "memstream_ready",
                 "memstream_rebalancing", "memstream_table_keys", "memstream_health_problem"):
        assert name in used, f"no panel shows {name}"


def test_dashboard_is_a_grafana_10_dashboard_on_a_prometheus_variable(dashboard):
    assert dashboard["schemaVersion"] >= 38 and dashboard["uid"] and dashboard["title"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in panels(dashboard)]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    for p in panels(dashboard):
        assert {"h", "w", "x", "y"} <= set(p["gridPos"]) and p["gridPos"]["x"] + p["gridPos"]["w"] <= 24
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"] and all(t["datasource"] == p["datasource"] for t in p["targets"]), p["title"]
        for t in p["targets"]:
            assert t["expr"].count("(") == t["expr"].count(")") and t["expr"].count("{") == t["expr"].count("}")
