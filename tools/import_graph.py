"""Measure the import structure of the vaecast package, from its source alone.

A design note quotes the import structure before and after a redesign: how many units, how
many import edges join them, how many layers they stack into, which units import each other
in a cycle, and how crowded the package root is. The script parses and never imports, so any
checkout gives comparable figures.

A unit is a module (the default) or, with ``--units folders``, a root module or a first- or
second-level folder below the root. An edge A -> B means a file of A imports B or anything
inside B: absolute and relative imports, also inside functions and ``if TYPE_CHECKING:``
blocks (edges seen only there are counted apart too). Cycles are strongly connected
components of more than one unit. With each one condensed to a node, a unit that imports no
other unit is layer 0, any other is one above the highest layer it imports.

Usage: python tools/import_graph.py [--package vaecast] [--json] [--units modules|folders]
"""

from __future__ import annotations

import argparse
import ast
import json
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def find_modules(package: str) -> dict[str, Path]:
    """Dotted module name -> source file, for every .py file under the package."""
    base = ROOT / package
    modules = {}
    for path in sorted(base.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        parts = [package, *path.relative_to(base).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def is_type_checking(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def imports_of(tree: ast.AST, package: str) -> list[tuple[str, bool]]:
    """(imported dotted name, inside TYPE_CHECKING) for every import, however nested.

    ``package`` is the package that relative imports start from. ``from X import n`` yields
    ``X.n`` (the caller falls back to ``X`` when ``X.n`` is not a module).
    """
    found = []
    stack = [(tree, False)]
    while stack:
        node, guarded = stack.pop()
        if isinstance(node, ast.Import):
            found += [(alias.name, guarded) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0]
                source = f"{anchor}.{source}" if source else anchor
            found += [(f"{source}.{alias.name}", guarded) for alias in node.names]
        if isinstance(node, ast.If) and is_type_checking(node.test):
            stack += [(child, True) for child in node.body]
            stack += [(child, guarded) for child in node.orelse]
            stack.append((node.test, guarded))
        else:
            stack += [(child, guarded) for child in ast.iter_child_nodes(node)]
    return found


def longest_module(name: str, modules: dict[str, Path]) -> str | None:
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def unit_of(module: str, modules: dict[str, Path], units: str) -> str:
    if units == "modules":
        return module
    parts = module.split(".")
    folder = parts if modules[module].name == "__init__.py" else parts[:-1]
    return module if len(folder) == 1 else ".".join(folder[:3])


def build_graph(package: str, units: str) -> tuple[set[str], dict[tuple[str, str], bool]]:
    """Units, and edges mapped to whether they are seen only under TYPE_CHECKING."""
    modules = find_modules(package)
    nodes = {unit_of(module, modules, units) for module in modules}
    edges: dict[tuple[str, str], bool] = {}
    for module, path in modules.items():
        anchor = module if path.name == "__init__.py" else module.rpartition(".")[0]
        source = unit_of(module, modules, units)
        for name, guarded in imports_of(ast.parse(path.read_text(), str(path)), anchor):
            target = longest_module(name, modules)
            if target is None:
                continue
            target = unit_of(target, modules, units)
            if target != source:
                edges[source, target] = edges.get((source, target), True) and guarded
    return nodes, edges


def strongly_connected(nodes: set[str], out: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative; components come out sinks first."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    work: list[tuple[str, Iterator[str]]] = []
    components = []

    def push(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        work.append((node, iter(sorted(out[node]))))

    for start in sorted(nodes):
        if start not in index:
            push(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = [stack.pop()]
                    while component[-1] != node:
                        component.append(stack.pop())
                    components.append(sorted(component))
            elif child not in index:
                push(child)
            elif child in stack:
                low[node] = min(low[node], index[child])
    return components


def measure(package: str, units: str) -> dict:
    nodes, edges = build_graph(package, units)
    out: dict[str, set[str]] = defaultdict(set)
    into: dict[str, set[str]] = defaultdict(set)
    for source, target in edges:
        out[source].add(target)
        into[target].add(source)
    components = strongly_connected(nodes, out)
    component_of = {unit: i for i, members in enumerate(components) for unit in members}
    layer_of_component: list[int] = []
    for i, members in enumerate(components):  # sinks first: what they import is known
        below = {component_of[t] for unit in members for t in out[unit]} - {i}
        layer_of_component.append(1 + max((layer_of_component[c] for c in below), default=-1))
    layers: dict[int, list[str]] = defaultdict(list)
    for unit in sorted(nodes):
        layers[layer_of_component[component_of[unit]]].append(unit)
    root = ROOT / package
    return {
        "package": package,
        "unit_kind": units,
        "units": len(nodes),
        "edges": len(edges),
        "type_checking_only_edges": sum(edges.values()),
        "layers": len(layers),
        "units_per_layer": [layers[layer] for layer in sorted(layers)],
        "cycles": sorted(members for members in components if len(members) > 1),
        "root_modules": sum(
            1 for p in root.glob("*.py") if p.name not in ("__init__.py", "__main__.py")
        ),
        "fan": {unit: {"in": len(into[unit]), "out": len(out[unit])} for unit in sorted(nodes)},
        "edge_list": sorted(edges),
    }


def summary(report: dict) -> str:
    lines = [
        f"import graph of {report['package']} ({report['unit_kind']} as units)",
        f"  units:                    {report['units']}",
        f"  edges:                    {report['edges']}",
        f"  TYPE_CHECKING-only edges: {report['type_checking_only_edges']}",
        f"  layers:                   {report['layers']}"
        f"  (units per layer: {[len(units) for units in report['units_per_layer']]})",
        f"  root modules:             {report['root_modules']}",
        f"  cycles:                   {len(report['cycles'])}",
    ]
    lines += [f"    - {', '.join(members)}" for members in report["cycles"]]
    lines.append("  largest fan-out (out / in):")
    fan = report["fan"]
    for unit in sorted(fan, key=lambda u: (-fan[u]["out"], u))[:10]:
        lines.append(f"    {fan[unit]['out']:3d} / {fan[unit]['in']:3d}  {unit}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package", default="vaecast")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--units", choices=("modules", "folders"), default="modules")
    args = parser.parse_args()
    report = measure(args.package, args.units)
    print(json.dumps(report) if args.json else summary(report))


if __name__ == "__main__":
    main()
