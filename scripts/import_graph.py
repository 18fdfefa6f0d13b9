"""The package's import graph, measured: modules, import arrows, cycles (issue 16's "before/after").

    python scripts/import_graph.py            # summary: counts, flat modules per package, cycles
    python scripts/import_graph.py --edges    # every arrow "a -> b", one per line
    python scripts/import_graph.py --dot      # Graphviz
    python scripts/import_graph.py --check    # exit 1 on any circle, between modules or packages (`make lint`)

Reads the source with `ast` (nothing is imported or run). An arrow a -> b means module a imports
module b of the package (any `import`/`from ... import`, at module level or inside a function:
both couple the modules; `if TYPE_CHECKING:` imports are counted separately, they do not run).
A cycle is a strongly connected component of more than one module over the runtime arrows. The
same is measured between packages (`streams.runtime`, `streams.api`, `streams.agents`, …; a module
directly under `streams` is its own node): an arrow between two packages is any arrow between
their modules, so a package circle is a layer that points up.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "streams"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted((ROOT / PACKAGE).rglob("*.py"))}


def _resolve(current: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = current.split(".") if is_package else current.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def imports(known: dict[str, Path]) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(runtime arrows, TYPE_CHECKING-only arrows) between the package's modules."""
    runtime: dict[str, set[str]] = defaultdict(set)
    typing_only: dict[str, set[str]] = defaultdict(set)

    def target(name: str) -> str | None:
        while name and name not in known:  # `from pkg.mod import func` -> pkg.mod
            name = name.rpartition(".")[0]
        return name or None

    for mod, path in known.items():
        tree = ast.parse(path.read_text(), str(path))
        guarded = _type_checking_lines(tree)
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(mod, path.name == "__init__.py", node)
                names = [f"{base}.{a.name}" for a in node.names] + [base]
            found = {t for n in names if n.startswith(PACKAGE) and (t := target(n)) and t != mod}
            # `from . import x` names both the package and x: keep the most specific
            found = {t for t in found if not any(o != t and o.startswith(t + ".") for o in found)}
            (typing_only if node_line(node) in guarded else runtime)[mod].update(found)
    return runtime, typing_only


def node_line(node: ast.AST) -> int:
    return getattr(node, "lineno", -1)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        out.append(sorted(component))
    return out


def package_of(module: str, known: dict[str, Path]) -> str:
    """`streams.runtime.app` -> `streams.runtime`; a module directly under the package
    (`streams.settings`) is its own node."""
    parts = module.split(".")
    if len(parts) > 2 or (len(parts) == 2 and known.get(module, Path()).name == "__init__.py"):
        return ".".join(parts[:2])
    return module


def package_arrows(runtime: dict[str, set[str]], known: dict[str, Path]) -> dict[str, dict[str, list[str]]]:
    """{package a: {package b: ["module -> module", ...]}} for every arrow between two packages."""
    out: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for a, targets in runtime.items():
        for b in targets:
            pa, pb = package_of(a, known), package_of(b, known)
            if pa != pb:
                out[pa][pb].append(f"{a} -> {b}")
    return out


def package_cycles(runtime: dict[str, set[str]], known: dict[str, Path]) -> list[list[str]]:
    arrows = package_arrows(runtime, known)
    return cycles({a: set(bs) for a, bs in arrows.items()})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--edges", action="store_true", help="print every runtime arrow")
    ap.add_argument("--dot", action="store_true", help="print the graph in Graphviz format")
    ap.add_argument("--check", action="store_true", help="exit 1 (naming the arrows) on any module or package circle")
    args = ap.parse_args(argv)
    known = modules()
    runtime, typing_only = imports(known)
    if args.check:
        return check(runtime, known)
    if args.edges:
        for a in sorted(runtime):
            for b in sorted(runtime[a]):
                print(f"{a} -> {b}")
        return 0
    if args.dot:
        print("digraph streams {")
        for a in sorted(runtime):
            for b in sorted(runtime[a]):
                print(f'  "{a}" -> "{b}";')
        print("}")
        return 0
    per_package: dict[str, int] = defaultdict(int)
    for m, path in known.items():
        if path.name != "__init__.py":
            per_package[m.rpartition(".")[0]] += 1
    found = cycles(runtime)
    print(f"modules: {len(known)} (package {PACKAGE})")
    for pkg in sorted(per_package):
        print(f"  {pkg}: {per_package[pkg]} modules")
    print(f"import arrows: {sum(map(len, runtime.values()))} "
          f"(plus {sum(map(len, typing_only.values()))} under TYPE_CHECKING only)")
    print(f"cycles: {len(found)}")
    for c in found:
        print("  " + " <-> ".join(c))
    between = package_cycles(runtime, known)
    print(f"package cycles: {len(between)}")
    for c in between:
        print("  " + " <-> ".join(c))
    return 0


def check(runtime: dict[str, set[str]], known: dict[str, Path]) -> int:
    """0 when no circle exists; else 1, each circle on stderr with the arrows that close it."""
    problems = [f"import circle between modules: {' <-> '.join(c)}" for c in cycles(runtime)]
    arrows = package_arrows(runtime, known)
    for circle in package_cycles(runtime, known):
        members = set(circle)
        inside = [f"    {arrow}" for a in circle for b in sorted(arrows[a]) if b in members for arrow in sorted(arrows[a][b])]
        problems.append(f"import circle between packages: {' <-> '.join(circle)}; the arrows:\n" + "\n".join(inside))
    for p in problems:
        print(f"import_graph: {p}", file=sys.stderr)
    if problems:
        print("import_graph: layers must point down (streams/composition.py wires them)", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
