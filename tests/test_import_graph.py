"""scripts/import_graph.py: the measurement of issue 16's module layout (cycles, arrows)."""

from __future__ import annotations

import importlib.util

from .conftest import ROOT

spec = importlib.util.spec_from_file_location("import_graph", ROOT / "scripts" / "import_graph.py")
import_graph = importlib.util.module_from_spec(spec)
spec.loader.exec_module(import_graph)


def test_cycles_are_the_strongly_connected_components_of_more_than_one_module():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": {"d"}, "f": {"a"}, "g": {"g"}}
    assert sorted(import_graph.cycles(graph)) == [["a", "b", "c"], ["d", "e"]]
    assert import_graph.cycles({"a": {"b"}, "b": set()}) == []


def test_the_package_graph_resolves_relative_imports_to_modules_of_the_package():
    known = import_graph.modules()
    runtime, _ = import_graph.imports(known)
    assert "streams.core.process" in known and "streams.runtime.app" in known
    assert all(b in known for targets in runtime.values() for b in targets)
    assert "streams.settings" in runtime["streams.runtime.app"]  # `from .settings import Settings`
    core = {a: b for a, b in runtime.items() if a.startswith("streams.core")}
    assert core and all(t.startswith("streams.core") for targets in core.values() for t in targets)  # a pure centre


def test_the_package_has_no_import_cycle_and_runtime_knows_no_agent_or_analytics():
    known = import_graph.modules()
    runtime, _ = import_graph.imports(known)
    assert import_graph.cycles(runtime) == []
    runtime_wing = {t for a, targets in runtime.items() if a.startswith("streams.runtime") for t in targets}
    assert not {t for t in runtime_wing if t.startswith(("streams.agents", "streams.analytics"))} - {"streams.agents"}
    # the pure centre knows no wing
    for a, targets in runtime.items():
        if a.startswith(("streams.core", "streams.sessions", "streams.graphs", "streams.analytics")):
            assert not [t for t in targets if t.startswith(("streams.runtime", "streams.agents", "streams.api",
                                                              "streams.tools"))], a


def test_packages_form_layers_that_only_point_down():
    """No circle between packages; the runtime knows neither the HTTP API nor the agents, and the
    agents do not know the API (streams/composition.py wires the three)."""
    known = import_graph.modules()
    runtime, _ = import_graph.imports(known)
    assert import_graph.package_cycles(runtime, known) == []
    arrows = import_graph.package_arrows(runtime, known)
    assert not {"streams.api", "streams.agents", "streams.composition"} & set(arrows["streams.runtime"]), \
        dict(arrows["streams.runtime"])
    assert "streams.api" not in arrows["streams.agents"], arrows["streams.agents"]["streams.api"]


def test_package_circles_are_found_and_fail_the_check(capsys):
    known = {"streams.a": ROOT / "a" / "__init__.py", "streams.a.x": ROOT / "a" / "x.py",
             "streams.b": ROOT / "b" / "__init__.py", "streams.b.y": ROOT / "b" / "y.py",
             "streams.settings": ROOT / "settings.py"}
    runtime = {"streams.a.x": {"streams.b.y", "streams.settings"}, "streams.b.y": {"streams.a"}}
    assert import_graph.package_of("streams.a.x", known) == "streams.a"
    assert import_graph.package_of("streams.settings", known) == "streams.settings"
    assert import_graph.package_cycles(runtime, known) == [["streams.a", "streams.b"]]
    assert import_graph.check(runtime, known) == 1
    err = capsys.readouterr().err
    assert "import circle between packages: streams.a <-> streams.b" in err
    assert "streams.a.x -> streams.b.y" in err and "streams.b.y -> streams.a" in err
    assert import_graph.check({"streams.a.x": {"streams.settings"}}, known) == 0
