"""The project's structure, read from the source with ``ast`` (imports inside functions
included), and the rules it keeps:

* imports: no cycle, no upward import against the layering benchmarks -> analysis -> pbscale ->
  pbexact, no private name (leading underscore) taken from another project module, and no
  library module in pbexact or pbscale over ``MAX_LINES`` lines;
* layout (:data:`LAYOUTS`): the top level of pbscale and analysis holds the commands (the
  modules ``python -m`` names) and sub-packages named for what they hold, in layers: a module of
  a sub-package imports its own package and those of lower layers, never a command; the sweep
  package sits on the job interface and the files of a run;
* commands on top of libraries: no command imports another command of its package (analysis,
  pbscale: :data:`LAYOUTS`; benchmarks: every top-level script); what two commands share lives
  in a library module;
* the method contract: a family's capabilities are one frozen :class:`Capabilities` and its
  hooks take explicit arguments (no trainer state);
* single definitions: the mask schedules and top-k rules, the MLP plan and its interpreter, and
  the words "batched" (k masks in one call) and "group" (G runs in one process) each have one
  home and one meaning.

Each check is a function of an explicit import graph (or source text), so the tests also feed it
a graph with an injected defect (a cycle, an upward edge, a private import, a sub-package that
imports upward or a command, a command that imports a command) and require that it is reported.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

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
    assert "pbexact.errors" in graph["pbscale.forward.masks"]
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
    graph["pbexact.variance"] = graph["pbexact.variance"] | {"pbscale.forward.masks"}
    graph["pbscale.runs.loop"] = graph["pbscale.runs.loop"] | {"analysis.cli"}
    assert upward_edges(graph) == [("pbexact.variance", "pbscale.forward.masks"),
                                   ("pbscale.runs.loop", "analysis.cli")]
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

#: What the sweep machinery may import from pbscale: its own modules, the job interface (its
#: types in pbscale.runs.jobs, shared with the commands' jobs modules), io.
SWEEP_ALLOWED = ("pbscale.sweep", "pbscale.sweep.jobs", "pbscale.runs.jobs", "pbscale.runs.io")


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
    assert any("pbscale.sweep.jobs" in graph[m] for m in sweep)
    # the job interface itself knows no command: only its types, in the lowest layer
    assert {b for b in graph["pbscale.sweep.jobs"] if b.startswith("pbscale.")} \
        == {"pbscale.runs.jobs"}
    # each command's jobs module is a library module that imports no command
    from pbscale.sweep.jobs import COMMANDS
    for command in COMMANDS.values():
        assert command.jobs in graph and LAYOUTS["pbscale"].layer(command.jobs) is not None
        assert not {b for b in graph[command.jobs] if LAYOUTS["pbscale"].command(b)}
    # and the check sees an injected dependency on regression internals
    graph["pbscale.sweep.file"] = graph["pbscale.sweep.file"] | {"pbscale.regression.group"}
    assert sweep_dependencies(graph) == {"pbscale.regression.group"}


# -- the layout: commands at the top, sub-packages in layers -----------------------------------

@dataclass(frozen=True)
class Layout:
    """The rule of one package's top level: ``commands`` (the modules and command packages
    ``python -m`` names; a command may import anything below its package's layering, but no
    other command of its package),
    ``plumbing`` (top-level modules that are neither: shared helpers of the commands) and
    ``layers`` (the sub-packages, lowest first: a module of one imports modules of its own
    sub-package and of lower layers only, never a command nor a sibling of its layer)."""

    package: str
    commands: tuple[str, ...]
    plumbing: tuple[str, ...]
    layers: tuple[tuple[str, ...], ...]

    def layer(self, module: str) -> int | None:
        """The layer of a module of this package (None: a command, plumbing, the package)."""
        parts = module.split(".")
        if len(parts) < 2 or parts[0] != self.package or self.command(module):
            return None
        for i, names in enumerate(self.layers):
            if parts[1] in names:
                return i
        return None

    def command(self, module: str) -> bool:
        """Whether a module is a command: a top-level command module, every module of a
        command package that is no layer (pbscale.sweep), or the face of a command package
        that is also a layer (analysis.microworld: its ``__init__``, ``cli``, ``__main__``)."""
        parts = module.split(".")
        if len(parts) < 2 or parts[0] != self.package or parts[1] not in self.commands:
            return False
        in_layer = any(parts[1] in names for names in self.layers)
        return not in_layer or parts[2:] in ([], ["cli"], ["__main__"])


#: The layouts of the packages with commands.
LAYOUTS = {
    "pbscale": Layout(
        "pbscale",
        commands=("prune", "regress", "export", "sweep"),
        plumbing=(),
        layers=(("runs", "forward"), ("methods", "nets"), ("execution",),
                ("pruning", "regression"))),
    "analysis": Layout(
        "analysis",
        commands=("arms_table", "bias", "counterexamples", "gap_calibration", "microworld",
                  "pareto", "regression", "report", "scale_report", "theorems", "variance",
                  "variance_compare", "variance_table"),
        plumbing=("cli",),
        layers=(("exact", "microworld"), ("scale",))),
}


def top_level(package: str, root: Path = ROOT) -> set[str]:
    """The names directly in a package: its modules (without .py) and sub-packages."""
    base = root / package
    return ({p.stem for p in base.glob("*.py") if p.name != "__init__.py"}
            | {p.name for p in base.iterdir() if (p / "__init__.py").exists()})


def layout_plumbing(layout: Layout) -> set[str]:
    """The dotted names of a layout's plumbing modules (any layer may import them)."""
    return {f"{layout.package}.{name}" for name in layout.plumbing}


def layout_violations(graph: dict[str, set[str]], layout: Layout) -> list[tuple[str, str]]:
    """(importer, imported) of every import a sub-package module of ``layout`` makes that its
    layering forbids: a command of its package, a module of a sibling of its layer or of a
    higher layer."""
    out = []
    for a, targets in graph.items():
        la = layout.layer(a)
        if la is None:
            continue
        own = ".".join(a.split(".")[:2])
        for b in targets:
            if b.partition(".")[0] != layout.package or b in layout_plumbing(layout):
                continue
            if layout.command(b) or b == layout.package:
                out.append((a, b))
                continue
            if b == own or b.startswith(own + "."):
                continue
            lb = layout.layer(b)
            if lb is None or lb >= la:
                out.append((a, b))
    return sorted(out)


@pytest.mark.parametrize("package", list(LAYOUTS))
def test_the_top_level_holds_the_commands_and_the_layers(package):
    layout = LAYOUTS[package]
    names = top_level(package)
    expected = {*layout.commands, *layout.plumbing, *(n for ns in layout.layers for n in ns)}
    assert names == expected, (sorted(names - expected), sorted(expected - names))
    for name in layout.commands:
        path = ROOT / package / f"{name}.py"
        text = (path.read_text() if path.exists()
                else (ROOT / package / name / "cli.py").read_text())
        assert "def main(" in text, name
        assert (ROOT / package / name / "__main__.py").exists() if not path.exists() \
            else 'if __name__ == "__main__":' in text, name


@pytest.mark.parametrize("package", list(LAYOUTS))
def test_sub_packages_import_downward_only(package):
    assert layout_violations(graph_of(INFOS), LAYOUTS[package]) == []


def test_the_layout_check_reports_injected_violations():
    layout = LAYOUTS["pbscale"]
    graph = graph_of(INFOS)
    graph["pbscale.methods.trainer"] = graph["pbscale.methods.trainer"] | {
        "pbscale.execution.group",       # a higher layer
        "pbscale.nets.models",           # a sibling of its layer
        "pbscale.prune",                 # a command
        "pbscale.methods.registry",      # its own package: fine
        "pbscale.runs.contracts"}        # a lower layer: fine
    assert [v for v in layout_violations(graph, layout)
            if v[0] == "pbscale.methods.trainer"] == [
        ("pbscale.methods.trainer", "pbscale.execution.group"),
        ("pbscale.methods.trainer", "pbscale.nets.models"),
        ("pbscale.methods.trainer", "pbscale.prune")]
    assert layout.layer("pbscale.runs.loop") == 0 and layout.command("pbscale.sweep.cli")
    # analysis: machinery never imports a command, not even through a command package's face
    alayout = LAYOUTS["analysis"]
    graph["analysis.scale.fronts"] = graph["analysis.scale.fronts"] | {
        "analysis.pareto", "analysis.microworld.cli", "analysis.microworld.claims",
        "analysis.cli"}
    assert [v for v in layout_violations(graph, alayout) if v[0] == "analysis.scale.fronts"] == [
        ("analysis.scale.fronts", "analysis.microworld.cli"),
        ("analysis.scale.fronts", "analysis.pareto")]
    assert alayout.command("analysis.microworld") and not alayout.command(
        "analysis.microworld.runs") and alayout.layer("analysis.microworld.runs") == 0


# -- commands on top of libraries ------------------------------------------------------------------

#: The line that makes a module a script.
MAIN_GUARD = 'if __name__ == "__main__":'


def scripts(package: str, root: Path = ROOT) -> set[str]:
    """The top-level modules of a package without a layout that run as scripts (they hold
    :data:`MAIN_GUARD`): the benchmarks' commands."""
    return {module_name(p, root) for p in sorted((root / package).glob("*.py"))
            if MAIN_GUARD in p.read_text()}


#: The benchmarks' commands.
BENCHMARK_COMMANDS = scripts("benchmarks")

#: Imports of a command by another command of its package that are known and yet to go.
KNOWN_COMMAND_IMPORTS: set[tuple[str, str]] = {
    # the GPU suite runs the other benchmarks (their main, or their measuring functions), and
    # op_count counts under check_gpu_sync's emulated sync check: not moved yet (issue 51)
    ("benchmarks.gpu_suite", "benchmarks.bench_arms_step"),
    ("benchmarks.gpu_suite", "benchmarks.bench_regress_group"),
    ("benchmarks.gpu_suite", "benchmarks.bench_pbscale"),
    ("benchmarks.gpu_suite", "benchmarks.bench_prune"),
    ("benchmarks.gpu_suite", "benchmarks.bench_prune_group"),
    ("benchmarks.gpu_suite", "benchmarks.bench_routes"),
    ("benchmarks.gpu_suite", "benchmarks.check_gpu_sync"),
    ("benchmarks.gpu_suite", "benchmarks.op_count"),
    ("benchmarks.op_count", "benchmarks.check_gpu_sync"),
}


def command_of(module: str, layouts: dict[str, Layout] = LAYOUTS,
               commands: set[str] = BENCHMARK_COMMANDS) -> str | None:
    """The command a module is part of (None: a library module, plumbing, a package): in a
    package with a layout the top-level name of a command (``pbscale.sweep`` for every module
    of the sweep package, ``analysis.microworld`` for its face: :meth:`Layout.command`); else
    the module itself when it is one of ``commands`` (the scripts of a package without a
    layout)."""
    package = module.partition(".")[0]
    if package in layouts:
        return ".".join(module.split(".")[:2]) if layouts[package].command(module) else None
    return module if module in commands else None


def command_imports(graph: dict[str, set[str]], layouts: dict[str, Layout] = LAYOUTS,
                    commands: set[str] = BENCHMARK_COMMANDS) -> list[tuple[str, str]]:
    """(importer, imported) of every import a module of a command makes of a module of another
    command of the same package (:func:`command_of`); the modules of one command package import
    each other freely, and a command of another package is the layering's business."""
    out = []
    for a, targets in graph.items():
        own = command_of(a, layouts, commands)
        if own is None:
            continue
        for b in targets:
            other = command_of(b, layouts, commands)
            if other not in (None, own) and b.partition(".")[0] == a.partition(".")[0]:
                out.append((a, b))
    return sorted(out)


def test_no_command_imports_a_command():
    """Each command parses its options, calls library functions and writes its outputs; what
    two commands share lives in a library module, never in one of them."""
    assert {"benchmarks.gpu_suite", "benchmarks.op_count", "benchmarks.check_gpu_sync",
            "benchmarks.bench_prune"} <= BENCHMARK_COMMANDS
    assert "benchmarks.timing" not in BENCHMARK_COMMANDS  # a library module of the benchmarks
    found = set(command_imports(graph_of(INFOS)))
    assert found == KNOWN_COMMAND_IMPORTS, (sorted(found - KNOWN_COMMAND_IMPORTS),
                                            sorted(KNOWN_COMMAND_IMPORTS - found))
    assert not {e for e in found if e[0].startswith(("analysis.", "pbscale."))}


def test_the_command_check_reports_an_injected_command_import():
    graph = graph_of(INFOS)
    graph["analysis.variance_table"] = graph["analysis.variance_table"] | {
        "analysis.variance",            # another command
        "analysis.exact.variance",      # a library module: fine
        "analysis.cli"}                 # plumbing: fine
    graph["analysis.report"] = graph["analysis.report"] | {
        "analysis.microworld.cli",      # a command package's face
        "analysis.microworld.units"}    # a library module of that package: fine
    graph["pbscale.regress"] = graph["pbscale.regress"] | {"pbscale.sweep.cli"}
    graph["benchmarks.bench_variance"] = graph["benchmarks.bench_variance"] | {
        "benchmarks.bench_microworld", "benchmarks.timing"}
    assert sorted(set(command_imports(graph)) - KNOWN_COMMAND_IMPORTS) == [
        ("analysis.report", "analysis.microworld.cli"),
        ("analysis.variance_table", "analysis.variance"),
        ("benchmarks.bench_variance", "benchmarks.bench_microworld"),
        ("pbscale.regress", "pbscale.sweep.cli")]
    # one command's own modules, and a command of another package, are not reported
    assert command_imports({"analysis.microworld": {"analysis.microworld.cli"},
                            "analysis.microworld.__main__": {"analysis.microworld.cli"},
                            "pbscale.sweep.cli": {"pbscale.sweep.jobs", "pbscale.runs.io"},
                            "analysis.pareto": {"pbscale.prune"},
                            "benchmarks.gpu_suite": {"analysis.variance", "pbscale.regress"}}
                           ) == []
    assert command_of("analysis.microworld.runs") is None
    assert command_of("pbscale.sweep.jobs") == "pbscale.sweep"


# -- the method contract ------------------------------------------------------------------------

def test_every_family_states_its_capabilities_in_one_frozen_dataclass():
    from pbscale.methods import REGISTRY, Capabilities

    capabilities = {f.name for f in dataclasses.fields(Capabilities)}
    assert Capabilities.__dataclass_params__.frozen
    for name, family in REGISTRY.items():
        assert isinstance(family.caps, Capabilities), name
        for cls in type(family).__mro__:  # no capability set beside caps, as a class attribute
            assert not set(vars(cls)) & capabilities, (name, cls)
    with pytest.raises(ValueError, match="unknown commands"):
        Capabilities(commands=("regress", "batched"))  # the old name of regress-group
    # no field's default depends on another: every default is a constant of its own
    assert all(f.default is not dataclasses.MISSING for f in dataclasses.fields(Capabilities))


#: The hooks of a method over mask logits and their explicit arguments.
LOGITS_HOOKS = {"gradient": ["self", "f", "r", "at"], "theta": ["self", "r", "at"],
                "eval_mask": ["self", "r", "at"], "sample_masks": ["self", "r", "k", "at"],
                "temperature": ["self", "at"]}
#: The hooks of a method without logits and their explicit arguments.
MASK_HOOKS = {"initial_mask": ["self", "cuts", "generator"],
              "fraction_at": ["self", "step", "cuts"]}


def test_the_hooks_take_explicit_arguments_and_read_no_trainer_state():
    """Every registered family's hooks have the contract's signature (LogitsFamily: the logits
    and a frozen StepArgs; MaskFamily: its CutSchedule); no family module reads a trainer's
    attributes; the method never builds its own execution strategy."""
    from pbscale.methods import REGISTRY, CutSchedule, LogitsFamily, MaskFamily, StepArgs

    assert StepArgs.__dataclass_params__.frozen and CutSchedule.__dataclass_params__.frozen
    for name, family in REGISTRY.items():
        hooks = (LOGITS_HOOKS if isinstance(family, LogitsFamily)
                 else MASK_HOOKS if isinstance(family, MaskFamily) else {})
        assert hooks, name
        for hook, params in hooks.items():
            assert list(inspect.signature(getattr(type(family), hook)).parameters) == params, (
                name, hook)
    for path in sorted((ROOT / "pbscale" / "methods").glob("*.py")):
        tree = ast.parse(path.read_text())
        reads = [n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)
                 and isinstance(n.value, ast.Name) and n.value.id == "trainer"]
        assert reads == [], (path.name, reads)
    strategies = [(m, b) for m, info in INFOS.items() if m.startswith("pbscale.methods")
                  for b in info.imports if b.startswith("pbscale.execution")]
    assert strategies == []


# -- one definition each ------------------------------------------------------------------------

#: Concepts with one home: each module with the names only it defines (the mask schedules and
#: top-k rules, the MLP plan and its interpreter, the group of G runs, the colour rule, what a
#: pruning run's method reads).
HOMES = {
    "pbscale.methods.schedules": ("keep_count", "check_fraction", "global_magnitude_masks",
                                  "gmp_fraction", "top_scores", "kept_per_layer", "ranking",
                                  "keep_top", "keep_within", "fill_within", "keep_budget",
                                  "budget_order"),
    "pbscale.nets.channel_layout": ("squared_norms", "remaining_cost", "remaining_costs"),
    "pbscale.forward.mlp": ("mlp_plan", "MlpBackend"),
    "pbscale.execution.group": ("MemberBook",),
    "pbscale.methods.registry": ("color_distance",),
    "pbscale.pruning.config": ("method_reads",),
}


def definitions(packages: tuple[str, ...] = LAYERS, root: Path = ROOT) -> dict[str, list[str]]:
    """{top-level name: the modules that define it (def or class)} over the project."""
    out: dict[str, list[str]] = {}
    for pkg in packages:
        for p in sorted((root / pkg).rglob("*.py")):
            for node in ast.parse(p.read_text()).body:
                if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                    out.setdefault(node.name, []).append(module_name(p, root))
    return out


def test_each_shared_concept_is_defined_once_in_its_home():
    found = definitions()
    for home, names in HOMES.items():
        for name in names:
            assert found.get(name) == [home], (name, found.get(name))


def test_the_mlp_plan_is_interpreted_once():
    """Only pbscale.forward.mlp reads plan steps (typed: Linear, Norm, Act); no module indexes
    a plan step as a tuple any more."""
    for path in sorted((ROOT / "pbscale").rglob("*.py")):
        text = path.read_text()
        if module_name(path) == "pbscale.forward.mlp":
            assert "class MlpBackend" in text and text.count("for i, step in enumerate(") == 1
            continue
        assert not re.search(r"\bplan\b.*step\[[0-9]\]|step\[[0-9]\].*\bplan\b", text), path
        assert not re.search(r"isinstance\(\w+, (Linear|Norm|Act)\)", text), path


#: Modules of pbscale, analysis and benchmarks named "batched" (none: "batched" is k masks in
#: one call, and no module is named for that alone).
BATCHED_NAMES: set[str] = set()


def test_batched_and_group_have_one_meaning_each():
    """"batched": k masks in one call (BatchedLoss, the masked forward); "group": G runs in one
    process (the regression and pruning groups, on one MemberBook; ``--seeds`` on both run
    commands, ``group = true`` in a sweep). No module is named for batches of runs; the
    registry's command of regression groups is "regress-group"; the folded forward's masks per
    call are ``per_call``, not a group."""
    from pbscale.methods import COMMANDS
    from pbscale.sweep import cli as sweep_cli

    batched = {m for m in INFOS if m.partition(".")[0] in ("pbscale", "analysis", "benchmarks")
               and "batch" in m.rpartition(".")[2]}
    assert batched == BATCHED_NAMES
    assert "regress-group" in COMMANDS and not [c for c in COMMANDS if "batch" in c]
    run_options = {a.dest for p in sweep_cli.build_parser()._subparsers._group_actions  # noqa: SLF001
                   for sub in p.choices.values() for a in sub._actions}  # noqa: SLF001
    assert "group" in run_options and "batch" not in run_options
    groups = {m for m in INFOS if m.startswith("pbscale.") and "group" in m.rpartition(".")[2]}
    assert groups == {"pbscale.execution.group", "pbscale.pruning.group",
                      "pbscale.regression.group"}
    for m in groups - {"pbscale.execution.group"}:
        assert "pbscale.execution.group" in INFOS[m].imports, m  # one MemberBook for both
    for path in sorted((ROOT / "pbscale" / "forward").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = [a.arg for a in (*node.args.args, *node.args.kwonlyargs)]
                assert "group" not in args, (path, node.name)  # masks per call are per_call


def callers(sources: dict[str, str], name: str) -> set[tuple[str, str]]:
    """(module, enclosing top-level function or class) of every call of ``name`` in ``sources``
    (module -> source text): a bare name, or an attribute ``x.name`` of a module imported as
    ``x`` (not a method of an object: ``Settings.build`` is another function)."""
    out = set()
    for module, text in sources.items():
        tree = ast.parse(text)
        modules = {a.asname or a.name for n in ast.walk(tree)
                   if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names
                   if isinstance(n, ast.Import) or f"{n.module}.{a.name}" in sources}
        for top in tree.body:
            if not isinstance(top, (ast.FunctionDef, ast.ClassDef)):
                continue
            for node in ast.walk(top):
                if not isinstance(node, ast.Call):
                    continue
                f = node.func
                if (isinstance(f, ast.Name) and f.id == name) or (
                        isinstance(f, ast.Attribute) and f.attr == name
                        and isinstance(f.value, ast.Name) and f.value.id in modules):
                    out.add((module, top.name))
    return out


def pbscale_sources() -> dict[str, str]:
    return {".".join(p.relative_to(ROOT).with_suffix("").parts): p.read_text()
            for p in sorted((ROOT / "pbscale").rglob("*.py"))}


#: The one run builder of pruning and the one builder of a run's config.json record: who may
#: call them (a run alone, a group member; the loop for a run alone).
ONE_BUILDER = {
    "build": {("pbscale.pruning.run", "assemble")},
    "assemble": {("pbscale.pruning.run", "run"), ("pbscale.pruning.run", "member")},
    "run_record": {("pbscale.runs.loop", "run"), ("pbscale.pruning.run", "member")},
}


def test_a_pruning_run_has_one_builder_and_one_record_builder():
    """A run alone and a group member are assembled by one function
    (:func:`pbscale.pruning.run.assemble`, the only caller of ``build``), and their config.json
    record is built by one (:func:`pbscale.runs.records.run_record`)."""
    sources = pbscale_sources()
    for name, allowed in ONE_BUILDER.items():
        assert callers(sources, name) == allowed, name


def test_the_builder_check_reports_a_second_builder():
    sources = pbscale_sources()
    sources["pbscale.pruning.extra"] = ("from pbscale.pruning import run as R\n"
                                        "def my_member(cfg):\n    return R.build(cfg, 1, 2)\n"
                                        "def other(cfg):\n    return build(cfg)\n"
                                        "def settings(s):\n    return s.build()\n")
    found = callers(sources, "build") - ONE_BUILDER["build"]
    assert found == {("pbscale.pruning.extra", "my_member"), ("pbscale.pruning.extra", "other")}
