"""The project's import structure, read from the source with ``ast`` (imports inside functions
included): no import cycle, no upward import against the layering
benchmarks -> analysis -> pbscale -> pbexact, no private name (leading underscore) taken from
another project module, and no library module in pbexact or pbscale over ``MAX_LINES`` lines.

Each check is a function of an explicit import graph (or source text), so the tests also feed it
a graph with an injected defect (a cycle, an upward edge, a private import) and require that it
is reported.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: Packages from the lowest layer up: a module may import its own package and the ones before it.
LAYERS = ("pbexact", "pbscale", "analysis", "benchmarks")

#: Library packages whose modules must stay under MAX_LINES lines.
LIBRARIES = ("pbexact", "pbscale")
MAX_LINES = 600

#: Modules over MAX_LINES, each with its reason (none).
KNOWN_LONG: dict[str, str] = {}

#: Private names taken across modules (none).
KNOWN_PRIVATE: set[tuple[str, str, str]] = set()


@dataclass
class ModuleInfo:
    """What one source file says about its imports: the project modules it imports (edges),
    the private names it takes from other project modules as (module, name), and its length."""

    name: str
    lines: int
    imports: set[str] = field(default_factory=set)
    private: set[tuple[str, str]] = field(default_factory=set)
    lazy: set[str] = field(default_factory=set)  # first imported inside a function


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def parse_module(source: str, name: str, known: set[str], is_package: bool = False
                 ) -> ModuleInfo:
    """Imports of module ``name`` (source text) among the ``known`` project modules: every
    ``import`` and ``from ... import`` anywhere in the file (also inside functions and
    ``if TYPE_CHECKING:``), resolved to the deepest known module; ``from pkg import sub`` with
    ``pkg.sub`` a known module is an edge to ``pkg.sub``. Private names: ``from m import _x``
    and ``alias._x`` where ``alias`` is bound to a project module by an import."""
    tree = ast.parse(source)
    info = ModuleInfo(name, len(source.splitlines()))
    package = name if is_package else name.rpartition(".")[0]
    aliases: dict[str, str] = {}  # local name -> project module it is bound to

    def resolve(dotted: str) -> str | None:
        while dotted and dotted not in known:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    lazy_nodes = {id(n) for f in ast.walk(tree)
                  if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                  for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))}
    for node in ast.walk(tree):
        before = set(info.imports)
        if isinstance(node, ast.Import):
            for a in node.names:
                target = resolve(a.name)
                if target is None:
                    continue
                info.imports.add(target)
                if a.asname and a.name in known:
                    aliases[a.asname] = a.name
                elif not a.asname and a.name.partition(".")[0] in known:
                    aliases[a.name.partition(".")[0]] = a.name.partition(".")[0]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".") if package else []
                up = up[: len(up) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            if resolve(base) is None:
                continue
            for a in node.names:
                sub = f"{base}.{a.name}"
                if sub in known:
                    info.imports.add(sub)
                    aliases[a.asname or a.name] = sub
                else:
                    info.imports.add(resolve(base))
                    if _is_private(a.name) and resolve(base) != name:
                        info.private.add((resolve(base), a.name))
        if id(node) in lazy_nodes:
            info.lazy |= info.imports - before
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in aliases and _is_private(node.attr)
                and aliases[node.value.id] != name):
            info.private.add((aliases[node.value.id], node.attr))
    info.imports.discard(name)
    return info


def project_modules(packages: tuple[str, ...] = LAYERS, root: Path = ROOT
                    ) -> dict[str, ModuleInfo]:
    files = [p for pkg in packages for p in sorted((root / pkg).rglob("*.py"))]
    known = {module_name(p, root) for p in files}
    return {module_name(p, root): parse_module(p.read_text(), module_name(p, root), known,
                                                p.name == "__init__.py")
            for p in files}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return found


def layer_of(module: str, layers: tuple[str, ...] = LAYERS) -> int:
    return layers.index(module.partition(".")[0])


def upward_edges(graph: dict[str, set[str]], layers: tuple[str, ...] = LAYERS
                 ) -> list[tuple[str, str]]:
    """Imports (importer, imported) of a module in a higher layer than the importer's."""
    return sorted((a, b) for a, targets in graph.items() for b in targets
                  if layer_of(b, layers) > layer_of(a, layers))


def private_imports(infos: dict[str, ModuleInfo]) -> list[tuple[str, str, str]]:
    """(importer, module, private name) for every private name taken across modules."""
    return sorted((m, src, n) for m, info in infos.items() for src, n in info.private)


def long_modules(infos: dict[str, ModuleInfo], libraries: tuple[str, ...] = LIBRARIES,
                 max_lines: int = MAX_LINES) -> dict[str, int]:
    return {m: info.lines for m, info in infos.items()
            if m.partition(".")[0] in libraries and info.lines > max_lines}


def graph_of(infos: dict[str, ModuleInfo]) -> dict[str, set[str]]:
    return {m: set(info.imports) for m, info in infos.items()}


# -- the project ------------------------------------------------------------------------------

INFOS = project_modules()


def test_the_walk_sees_the_project():
    """The graph is not vacuous: every layer has modules, and known edges (lazy ones too) are
    found."""
    graph = graph_of(INFOS)
    for pkg in LAYERS:
        assert sum(m.partition(".")[0] == pkg for m in graph) >= 3, pkg
    assert "pbexact.errors" in graph["pbscale.masks"]
    assert "pbexact.estimators" in graph["pbexact.variance"]
    lazy = [m for m, info in INFOS.items() if info.lazy]
    assert lazy, "no module with an import inside a function: the lazy case is not exercised"


def test_no_import_cycles():
    assert cycles(graph_of(INFOS)) == []


def test_no_upward_imports():
    assert upward_edges(graph_of(INFOS)) == []


def test_no_private_names_across_modules():
    assert set(private_imports(INFOS)) <= KNOWN_PRIVATE


def test_library_modules_are_short():
    long = long_modules(INFOS)
    assert set(long) <= set(KNOWN_LONG), {m: n for m, n in long.items() if m not in KNOWN_LONG}


# -- the checker on injected defects ----------------------------------------------------------

def test_cycle_check_reports_an_injected_cycle():
    graph = graph_of(INFOS)
    graph["pbexact.errors"] = graph["pbexact.errors"] | {"pbexact.estimators"}
    found = cycles(graph)
    assert any({"pbexact.errors", "pbexact.estimators"} <= set(c) for c in found)
    assert cycles({"a.x": {"a.y"}, "a.y": {"a.z"}, "a.z": {"a.x"}, "a.w": {"a.x"}}) == [
        ["a.x", "a.y", "a.z"]]
    assert cycles({"a.x": {"a.y"}, "a.y": set()}) == []


def test_layer_check_reports_an_injected_upward_edge():
    graph = graph_of(INFOS)
    graph["pbexact.variance"] = graph["pbexact.variance"] | {"pbscale.masks"}
    graph["pbscale.loop"] = graph["pbscale.loop"] | {"analysis.cli"}
    assert upward_edges(graph) == [("pbexact.variance", "pbscale.masks"),
                                   ("pbscale.loop", "analysis.cli")]
    # downward and same-package edges are fine
    assert upward_edges({"benchmarks.b": {"pbexact.errors", "analysis.cli"},
                         "pbscale.a": {"pbscale.b"}}) == []


def test_private_check_reports_injected_private_imports():
    known = {"pkg", "pkg.a", "pkg.b", "pkg.sub", "pkg.sub.c"}
    src = (
        "from pkg.a import public, _hidden\n"
        "from pkg import b\n"
        "import pkg.sub.c as c\n"
        "def f():\n"
        "    from .a import _lazy\n"
        "    return b._helper() + c._x + b.__name__ + c.ok\n"
    )
    info = parse_module(src, "pkg.d", known)
    assert info.lazy == set()  # pkg.a is imported at the top as well
    assert parse_module("def f():\n    import pkg.b\n", "pkg.d", known).lazy == {"pkg.b"}
    assert info.private == {("pkg.a", "_hidden"), ("pkg.a", "_lazy"), ("pkg.b", "_helper"),
                            ("pkg.sub.c", "_x")}
    assert info.imports == {"pkg.a", "pkg.b", "pkg.sub.c"}
    # a module's own private names are its business
    own = parse_module("from pkg.a import _hidden\n", "pkg.a", known)
    assert own.private == set()
    infos = {"pkg.d": info}
    assert ("pkg.d", "pkg.a", "_hidden") in private_imports(infos)


def test_length_check_reports_an_injected_long_module():
    infos = {"pbscale.x": ModuleInfo("pbscale.x", MAX_LINES + 1),
             "pbscale.y": ModuleInfo("pbscale.y", MAX_LINES),
             "analysis.z": ModuleInfo("analysis.z", 10 * MAX_LINES)}
    assert long_modules(infos) == {"pbscale.x": MAX_LINES + 1}


# -- the sweep package sits on a job interface -------------------------------------------------

#: What the sweep machinery may import from pbscale: its own modules, the job interface, io.
SWEEP_ALLOWED = ("pbscale.sweep", "pbscale.jobs", "pbscale.io")


def sweep_dependencies(graph: dict[str, set[str]]) -> set[str]:
    """The pbscale modules outside :data:`SWEEP_ALLOWED` that the sweep package imports."""
    return {b for a, targets in graph.items() if a.startswith("pbscale.sweep")
            for b in targets if b.startswith("pbscale.")
            and not any(b == m or b.startswith(m + ".") for m in SWEEP_ALLOWED)}


def test_the_sweep_package_depends_on_the_job_interface_only():
    graph = graph_of(INFOS)
    sweep = [m for m in graph if m.startswith("pbscale.sweep")]
    assert {"pbscale.sweep", "pbscale.sweep.cli", "pbscale.sweep.file",
            "pbscale.sweep.records", "pbscale.sweep.engines"} <= set(sweep)
    assert sweep_dependencies(graph) == set()
    assert any("pbscale.jobs" in graph[m] for m in sweep)
    # the job interface itself knows no command
    assert {b for b in graph["pbscale.jobs"] if b.startswith("pbscale.")} == set()
    # and the check sees an injected dependency on regression internals
    graph["pbscale.sweep.file"] = graph["pbscale.sweep.file"] | {"pbscale.batched_seeds"}
    assert sweep_dependencies(graph) == {"pbscale.batched_seeds"}
