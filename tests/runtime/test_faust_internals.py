"""streams/runtime/faust_internals.py is the one module touching private Faust/aiokafka/mode
attributes, and it was verified against exactly the versions in its `PINNED` (pure: no broker)."""

from __future__ import annotations

import ast
import importlib
import inspect
import logging
import pkgutil
import re
import textwrap
from pathlib import Path

import pytest

import streams
from streams.runtime import faust_internals as fi

from ..conftest import ROOT

ADAPTER = "streams/runtime/faust_internals.py"
#: modules allowed to spell the private methods they override (see the adapter's docstring)
OVERRIDING = {"streams/runtime/rebalance.py": {name for _, name in fi.CONSUMER_OVERRIDES}}
#: private-named methods Faust documents as what a subclass overrides (a custom codec: `_dumps`, `_loads`)
EXTENSION_POINTS = {"_dumps", "_loads"}
LIBRARIES = ("faust", "aiokafka", "mode")


# --- versions ----------------------------------------------------------------------------------


def test_the_installed_versions_are_the_pinned_ones():
    problems = fi.version_mismatches(fi.installed_versions())
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)


def test_a_mismatch_names_the_package_both_versions_and_the_adapter():
    installed = {"faust-streaming": "0.16.0", "aiokafka": fi.PINNED["aiokafka"], "mode-streaming": None}
    problems = fi.version_mismatches(installed)
    assert len(problems) == 2
    faust, mode = problems
    assert faust.startswith("faust-streaming 0.16.0 is installed")
    assert f"faust-streaming {fi.PINNED['faust-streaming']}" in faust
    assert "review streams/runtime/faust_internals.py" in faust and "review streams/runtime/faust_internals.py" in mode
    assert mode.startswith("mode-streaming (not installed)") and fi.PINNED["mode-streaming"] in mode
    assert not any(p.startswith("aiokafka") for p in problems)


def test_the_pinned_versions_themselves_are_no_mismatch():
    assert fi.version_mismatches(dict(fi.PINNED)) == []
    assert set(fi.PINNED) >= {"faust-streaming", "aiokafka"}


def test_the_worker_logs_one_warning_naming_the_mismatch(caplog):
    log = logging.getLogger("memstream.test-faust-internals")
    with caplog.at_level(logging.WARNING, logger=log.name):
        fi.warn_if_unpinned(log, {**fi.PINNED, "aiokafka": "0.15.0"})
        fi.warn_if_unpinned(log, dict(fi.PINNED))  # all pinned: nothing
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "aiokafka 0.15.0" in warnings[0].getMessage() and "faust_internals.py" in warnings[0].getMessage()


# --- the private names still exist where the adapter says -----------------------------------------


def _owner(where: str):
    module, _, cls = where.partition(":")
    obj = importlib.import_module(module)
    return getattr(obj, cls) if cls else obj


def _has(owner, name: str) -> bool:
    """A class attribute or annotation (through the MRO), a module attribute, or an instance
    attribute the class's own code assigns (`self.<name> =`)."""
    if not inspect.isclass(owner):
        return hasattr(owner, name)
    assigned = re.compile(rf"self\.{name}\s*[:=]")
    for cls in owner.__mro__:
        if name in vars(cls) or name in getattr(cls, "__annotations__", {}):
            return True
        if cls.__module__.split(".")[0] in LIBRARIES and assigned.search(inspect.getsource(cls)):
            return True
    return False


@pytest.mark.parametrize("where, name", fi.PRIVATE_API + fi.CONSUMER_OVERRIDES)
def test_every_private_name_exists_in_the_installed_library(where, name):
    assert _has(_owner(where), name), f"{where} has no {name}: review {ADAPTER}"


def test_the_private_name_list_is_what_the_adapter_code_uses():
    # derived from the adapter's code both ways: no listed name it does not use, no use it does not list
    used = _private_names(ast.parse((ROOT / ADAPTER).read_text()), own=_module_names(ADAPTER))
    assert used == {name for _, name in fi.PRIVATE_API}
    assert set(fi.WRAPPED_PRIVATE_NAMES) == {name for _, name in fi.PRIVATE_API + fi.CONSUMER_OVERRIDES}


def _module_names(rel: str) -> set[str]:
    """The names a module defines or imports at its top level."""
    out = set()
    for node in ast.parse((ROOT / rel).read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out |= {a.asname or a.name for a in node.names}
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            out |= {t.id for t in targets if isinstance(t, ast.Name)}
    return out


def _private_names(tree: ast.AST, own: set[str]) -> set[str]:
    """Private (`_x`, not dunder) names a module's code uses as attributes, method names or
    getattr-style strings, except its own module-level names."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            out.add(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.add(node.name)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in (
                "getattr", "hasattr", "setattr", "delattr") and len(node.args) > 1:
            if isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
                out.add(node.args[1].value)
    return {n for n in out if n.startswith("_") and not n.startswith("__") and n not in own}


# --- no other module uses them ------------------------------------------------------------------


def violations(source: str, rel: str) -> list[str]:
    """Where a module (path relative to the checkout) uses a private name the adapter wraps, or
    assigns an attribute the adapter patches."""
    tree = ast.parse(source)
    allowed = OVERRIDING.get(rel, set())
    out = []
    for node in ast.walk(tree):
        name = None
        if isinstance(node, ast.Attribute):
            name = node.attr
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name = node.name
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in (
                "getattr", "hasattr", "setattr", "delattr") and len(node.args) > 1 and isinstance(
                node.args[1], ast.Constant):
            name = node.args[1].value
        if name in fi.WRAPPED_PRIVATE_NAMES and name not in allowed:
            out.append(f"{rel}:{node.lineno}: {name}")
        targets = (node.targets if isinstance(node, ast.Assign) else [node.target]
                   if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
        for t in targets:
            if isinstance(t, ast.Attribute) and t.attr in fi.PATCHED_ATTRIBUTES:
                out.append(f"{rel}:{t.lineno}: assigns .{t.attr}")
    return out


def _sources():
    for path in sorted((ROOT / "streams").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel != ADAPTER:
            yield rel, path.read_text()


def test_no_other_module_touches_the_wrapped_private_names_or_patches_faust():
    found = [v for rel, source in _sources() for v in violations(source, rel)]
    assert not found, f"use {ADAPTER} instead:\n" + "\n".join(found)


def test_the_scan_finds_what_it_looks_for():
    bad = textwrap.dedent("""
        def f(consumer, table, app, store, tp):
            consumer._committed_offset.get(tp)
            getattr(consumer, "_committed_offset", {})
            table.changelog_topic = table._new_changelog_topic()
            app.transport.Consumer = object
            x = store._dbs
        class C:
            def _reset_state(self):
                pass
    """)
    found = violations(bad, "streams/runtime/example.py")
    assert sorted(v.split(": ", 1)[1] for v in found) == sorted([
        "_committed_offset", "_committed_offset", "assigns .changelog_topic", "_new_changelog_topic",
        "assigns .Consumer", "_dbs", "_reset_state"])
    assert all(v.startswith("streams/runtime/example.py:") for v in found)
    # an override is allowed only in the module that the adapter names for it
    assert violations("class C:\n    def _reset_state(self):\n        super()._reset_state()\n",
                      "streams/runtime/rebalance.py") == []


def _library_bases(cls: type) -> list[type]:
    return [b for b in cls.__mro__[1:] if b.__module__.split(".")[0] in LIBRARIES]


def _library_private(bases: list[type], name: str) -> bool:
    return (name.startswith("_") and not name.startswith("__") and name != "_abc_impl"
            and any(_has(b, name) for b in bases))


def test_a_subclass_of_a_faust_class_overrides_or_uses_only_listed_private_names():
    # a new override of (or a new `self._x` read from) a private Faust/aiokafka/mode member that
    # the static list does not know yet is found here, from the classes themselves
    found = []
    for info in pkgutil.walk_packages(streams.__path__, "streams."):
        if info.name.endswith("__main__") or info.name == "streams.runtime.faust_internals":
            continue
        module = importlib.import_module(info.name)
        rel = Path(module.__file__).relative_to(ROOT).as_posix()
        allowed = OVERRIDING.get(rel, set()) | EXTENSION_POINTS
        for cls in [c for c in vars(module).values() if inspect.isclass(c) and c.__module__ == module.__name__]:
            bases = _library_bases(cls)
            if not bases:
                continue
            names = set(vars(cls))
            for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(cls)))):
                if isinstance(node, ast.Attribute) and (
                        (isinstance(node.value, ast.Name) and node.value.id == "self")
                        or (isinstance(node.value, ast.Call) and getattr(node.value.func, "id", "") == "super")):
                    names.add(node.attr)
            found += [f"{rel}: {cls.__name__}.{n}" for n in sorted(names)
                      if n not in allowed and _library_private(bases, n)]
    assert not found, f"list them in {ADAPTER} (or use it):\n" + "\n".join(found)
