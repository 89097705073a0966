#!/usr/bin/env python
"""The import graph of the product's own modules (``backend/``, ``pipelines/``) and of the
validation campaigns (``validation/``), from source.

Every ``import`` statement counts, at module level or inside a function (a lazy import is
still a dependency: it only moves the cycle to run time). An edge goes to the module the
statement names (``from a.b import c`` is ``a.b.c`` when that is a module, else ``a.b``);
the implicit import of parent packages is not an edge. Prints each import cycle (a strongly
connected component of more than one module, or a module importing itself) and, with
``--layers``, every import that crosses a layer the wrong way:

* ``pipelines`` (the science) -> ``backend`` (:func:`layer_violations`);
* ``backend.services`` -> ``backend.api``, ``fastapi`` or ``starlette``: the services know no
  HTTP (:func:`service_violations`; the third-party names come from
  :func:`external_imports`, the graph holds the product's own modules only);
* a route module (``backend.api.routes.X``) or a page module (``backend.api.pages.*``) ->
  another route module: what they share lives in ``backend.api.presenters``,
  ``backend.api.params`` or ``backend.api.deps`` (:func:`route_violations`);
* ``backend.auth`` -> ``backend.api`` (:func:`auth_violations`).
* the science (``pipelines``, the simulator aside) -> the simulator or the validation
  campaigns, and ``backend`` -> ``validation`` or the simulator (except
  :data:`SIMULATOR_IMPORTERS`) (:func:`science_violations`).

Usage::

    python scripts/import_graph.py            # cycles; exit 1 if any
    python scripts/import_graph.py --layers   # also the imports that cross a layer the wrong way
    python scripts/import_graph.py --edges    # the whole graph, one edge a line
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("backend", "pipelines", "validation")

#: The simulator: it may import the science, the science never imports it.
SIMULATOR = "pipelines.simulation"

#: The validation campaigns (``validation/``): not part of the product, imported by nothing in it.
VALIDATION = "validation"

#: The ``backend`` modules allowed to import the simulator, and why.
SIMULATOR_IMPORTERS = {
    "backend.cli": "`lstdp demo` and `lstdp simulate` make the simulated world they ingest",
}

__all__ = ["modules", "import_graph", "external_imports", "cycles", "layer_violations", "service_violations",
           "route_violations", "auth_violations", "science_violations", "HTTP_PACKAGES"]

#: The web framework's packages: ``backend.services`` imports none of them.
HTTP_PACKAGES = ("fastapi", "starlette")


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` under the product's packages."""
    out: dict[str, Path] = {}
    for pkg in PACKAGES:
        for f in sorted((root / pkg).rglob("*.py")):
            parts = list(f.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = f
    return out


def _targets(node: ast.AST, module: str, is_package: bool, known: set[str]) -> list[str]:
    """The product modules one import statement names."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
        return [_nearest(n, known) for n in names if _nearest(n, known)]
    assert isinstance(node, ast.ImportFrom)
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        stem = ".".join(base + ([node.module] if node.module else []))
    else:
        stem = node.module or ""
    out = []
    for alias in node.names:
        sub = f"{stem}.{alias.name}"
        hit = sub if sub in known else _nearest(stem, known)
        if hit:
            out.append(hit)
    return out


def _nearest(name: str, known: set[str]) -> str | None:
    """``name`` or its closest enclosing module that is one of ours (``a.b.c`` -> ``a.b``)."""
    parts = name.split(".")
    while parts:
        cand = ".".join(parts)
        if cand in known:
            return cand
        parts.pop()
    return None


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the product modules it imports (anywhere in its source)."""
    mods = modules(root)
    known = set(mods)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for t in _targets(node, name, is_pkg, known):
                    if t != name or isinstance(node, ast.Import):
                        graph[name].add(t)
    return graph


def external_imports(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the top-level names of the packages outside the product it imports, anywhere
    in its source (``from fastapi.responses import X`` inside a function: ``fastapi``).
    Relative imports and the product's own packages are left out."""
    mods = modules(root)
    out: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                tops = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                tops = [node.module.split(".")[0]]
            else:
                continue
            out[name].update(t for t in tops if t not in PACKAGES)
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module, or with a self-import
    (Tarjan's algorithm, iterative), each sorted, the list sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1 or v in graph[v]:
                        out.append(sorted(comp))
    return sorted(out)


def layer_violations(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Imports from a ``pipelines`` module of a ``backend`` module (the science stays pure)."""
    return sorted((a, b) for a, deps in graph.items() if a.split(".")[0] == "pipelines"
                  for b in deps if b.split(".")[0] == "backend")


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def service_violations(graph: dict[str, set[str]], external: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Imports of the API (``backend.api``) or of the web framework (:data:`HTTP_PACKAGES`)
    by a ``backend.services`` module: a service raises its own errors, the API maps them to
    HTTP answers. ``external`` is :func:`external_imports`."""
    bad = {(a, b) for a, deps in graph.items() if _within(a, "backend.services")
           for b in deps if _within(b, "backend.api")}
    bad |= {(a, b) for a, names in external.items() if _within(a, "backend.services")
            for b in names if b in HTTP_PACKAGES}
    return sorted(bad)


def route_violations(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Imports of a route module (``backend.api.routes.X``) by another route module or by a
    page (``backend.api.pages``): one router per resource, what they share lives in
    ``backend.api.presenters``, ``backend.api.params`` or ``backend.api.deps``."""
    return sorted((a, b) for a, deps in graph.items()
                  if _within(a, "backend.api.routes") or _within(a, "backend.api.pages")
                  for b in deps if b.startswith("backend.api.routes.") and b != a)


def auth_violations(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Imports of the API (``backend.api``) by ``backend.auth``: tokens and sessions sit below
    the API, whose dependencies (``backend.api.deps``) read them."""
    return sorted((a, b) for a, deps in graph.items() if _within(a, "backend.auth")
                  for b in deps if _within(b, "backend.api"))


def science_violations(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Imports that break "the simulator may import the science, never the reverse":

    * a ``pipelines`` module outside :data:`SIMULATOR` importing the simulator or
      :data:`VALIDATION` (the science and the products it makes must not change when a
      simulated world or a campaign does);
    * a ``backend`` module importing :data:`VALIDATION`, or importing the simulator without
      being one of :data:`SIMULATOR_IMPORTERS`.

    Returns ``(importer, imported)`` pairs, sorted; lazy imports count (the graph has them).
    """
    bad = []
    for a, deps in graph.items():
        top = a.split(".")[0]
        for b in deps:
            to_sim, to_val = _within(b, SIMULATOR), _within(b, VALIDATION)
            if top == "pipelines" and not _within(a, SIMULATOR) and (to_sim or to_val):
                bad.append((a, b))
            elif top == "backend" and (to_val or (to_sim and a not in SIMULATOR_IMPORTERS)):
                bad.append((a, b))
    return sorted(bad)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", action="store_true", help="also list the imports that cross a layer the wrong way")
    ap.add_argument("--edges", action="store_true", help="print every edge")
    args = ap.parse_args(argv)
    graph = import_graph()
    if args.edges:
        for a in sorted(graph):
            for b in sorted(graph[a]):
                print(f"{a} -> {b}")
    found = cycles(graph)
    for comp in found:
        print("cycle: " + " <-> ".join(comp))
    bad = []
    if args.layers:
        bad = [*layer_violations(graph), *service_violations(graph, external_imports()), *route_violations(graph),
               *auth_violations(graph)]
    for a, b in bad:
        print(f"layer: {a} imports {b}")
    wrong_way = science_violations(graph) if args.layers else []
    for a, b in wrong_way:
        print(f"layer: {a} imports {b} (the simulator and validation/ may import the science, not the reverse)")
    print(f"{len(graph)} modules, {sum(map(len, graph.values()))} imports, {len(found)} cycle(s)"
          + (f", {len(bad)} import(s) across a layer the wrong way, {len(wrong_way)} science->simulator/validation"
             " import(s)" if args.layers else ""))
    return 1 if found or bad or wrong_way else 0


if __name__ == "__main__":
    sys.exit(main())
