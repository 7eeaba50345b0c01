"""The layout's promises, checked on the source (issue 24): no import cycles, no function-level imports
of the project's own modules, the layering between packages, and no function over 80 lines.

The import graph is read from the syntax tree of every module in planner/ and solver_models/, so a
circle hidden inside a function counts as much as one at the top of a file.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("planner", "solver_models")
MAX_FUNCTION_LINES = 80
LAZY_THIRD_PARTY = {"torch", "matplotlib", "rich"}
"""Optional or heavy third-party packages a function may import where it needs them (the profiler's torch,
the plots' matplotlib, the live progress bar's rich): start-up time and optional extras, not cycles."""


@dataclass
class Module:
    name: str
    path: Path
    tree: ast.Module
    top: set[str] = field(default_factory=set)  # project modules imported at module level
    inner: list[tuple[int, str]] = field(default_factory=list)  # (line, module) imported inside a function


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Module]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            out[_module_name(path)] = Module(_module_name(path), path, ast.parse(path.read_text(), str(path)))
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The project module an import names (a `from pkg import name` may name a module or an attribute)."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _imported(mod: Module, node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = mod.name.split(".") if mod.path.name == "__init__.py" else mod.name.split(".")[:-1]
            package = package[: len(package) - (node.level - 1)]
            base = ".".join(package + ([base] if base else []))
        names = [f"{base}.{a.name}" for a in node.names] + [base]
    return [n for n in names if n]


def _scan(mod: Module) -> None:
    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                targets = {_resolve(name) or name for name in _imported(mod, child)}
                for target in sorted(targets):
                    if in_function:
                        mod.inner.append((child.lineno, target))
                    elif target in MODULES and target != mod.name:
                        mod.top.add(target)
            else:
                visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    visit(mod.tree, False)


for _m in MODULES.values():
    _scan(_m)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


def _package_edge_ok(importer: str, imported: str) -> bool:
    """A package __init__ importing its own submodules is not a cycle in the sense that matters."""
    return not imported.startswith(importer + ".")


def test_no_import_cycles():
    """The project's module graph, imports inside functions included, has no circle."""
    graph = {m.name: {t for t in m.top if _package_edge_ok(m.name, t)}
             | {t for _, t in m.inner if t in MODULES and t != m.name} for m in MODULES.values()}
    assert _cycles(graph) == []


def test_no_function_level_imports_of_project_modules():
    """Project modules are imported at the top of a file; inside a function only the lazy third-party
    packages named in LAZY_THIRD_PARTY (and the standard library) may be."""
    bad = []
    for m in MODULES.values():
        for line, name in m.inner:
            root = name.split(".")[0]
            if root in PACKAGES or root == "cli" or root == "tools":
                bad.append(f"{m.path.relative_to(ROOT)}:{line} imports {name}")
    assert bad == []


def _transitive(start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for t in MODULES[todo.pop()].top:
            if t not in seen:
                seen.add(t)
                todo.append(t)
    return seen


def test_solver_models_import_only_schemas():
    """solver_models reads integer tables and the search vocabulary; it imports nothing of planner but
    planner.schemas."""
    bad = {m.name: sorted(t for t in m.top if t.startswith("planner.") and not t.startswith("planner.schemas"))
           for m in MODULES.values() if m.name.startswith("solver_models")}
    assert {k: v for k, v in bad.items() if v} == {}


@pytest.mark.parametrize("forbidden", ["planner.search", "planner.output", "planner.commands", "planner.api",
                                       "planner.api_search",
                                       "planner.launcher", "planner.inputs.resolve", "planner.inputs.shell",
                                       "solver_models"])
def test_cost_model_imports_no_search_input_or_output(forbidden):
    """The cost model is one evaluator that everything uses: it depends on no search, input-reading or
    output code, directly or through another module."""
    bad = {m.name: sorted(t for t in _transitive(m.name) if t == forbidden or t.startswith(forbidden + "."))
           for m in MODULES.values() if m.name.startswith("planner.cost")}
    assert {k: v for k, v in bad.items() if v} == {}


def test_product_code_imports_no_tools():
    """tools/ (the fuzzer, the search bench, the validators) are dev tools: planner/ never imports them,
    except the two documented forwarding modules that run them."""
    bad = [f"{m.name} -> {t}" for m in MODULES.values() for t in m.top if t.split(".")[0] == "tools"]
    assert bad == []


def test_no_function_longer_than_80_lines():
    """Every function (methods included) in planner/ and solver_models/ fits in 80 lines."""
    long = []
    for m in MODULES.values():
        for node in ast.walk(m.tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{m.path.relative_to(ROOT)}:{node.lineno} {node.name} ({n} lines)")
    assert long == []


def _imports_by_name(tree: ast.AST) -> list[int]:
    """The lines that import a module named at run time: importlib.import_module(...), __import__(...)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
            if name in ("import_module", "__import__"):
                lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "importlib" \
                and any(a.name == "import_module" for a in node.names):
            lines.append(node.lineno)
    return lines


def test_no_module_imported_by_name_but_the_commands():
    """The one lazy import is cli.py's: a command's module, loaded when the command is named (start-up time).
    planner/ and solver_models/ import nothing by name, so the import graph the tests above read is the whole
    graph."""
    bad = [f"{m.path.relative_to(ROOT)}:{line}" for m in MODULES.values() for line in _imports_by_name(m.tree)]
    assert bad == []


def _lazy_commands() -> dict[str, str]:
    """cli.py's COMMANDS, read from its syntax tree: command name -> the module cli.py loads for it."""
    tree = ast.parse((ROOT / "cli.py").read_text())
    table = next(node.value for node in tree.body if isinstance(node, ast.Assign)
                 and any(isinstance(t, ast.Name) and t.id == "COMMANDS" for t in node.targets))
    return {name: module for name, (module, _summary) in ast.literal_eval(table).items()}


def _top_level_names(tree: ast.Module) -> set[str]:
    names = {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    return names | {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets
                    if isinstance(t, ast.Name)}


def test_cli_loads_only_command_modules_that_import_no_cli():
    """What cli.py loads by name is a module of planner/commands/ defining `command`; the graph those modules
    start is checked above like any other, and no project module imports cli.py (top level or inside a
    function), so that loading a command can close no circle through it."""
    lazy = _lazy_commands()
    assert lazy and all(m.startswith("planner.commands.") and m in MODULES for m in lazy.values())
    for module in lazy.values():
        assert "command" in _top_level_names(MODULES[module].tree), module
    cli_imports = [f"{m.path.relative_to(ROOT)}:{node.lineno}" for m in MODULES.values() for node in ast.walk(m.tree)
                   if isinstance(node, (ast.Import, ast.ImportFrom))
                   and any(name.split(".")[0] == "cli" for name in _imported(m, node))]
    assert cli_imports == []
    assert len(_imports_by_name(ast.parse((ROOT / "cli.py").read_text()))) == 1  # LazyCommands.get_command's
