"""The package is the architecture: layers import one way, no cycles, no private names.

An AST walk of every module of ``spamnb`` (imports inside functions count:
they run just the same, only later). The layers, lowest first; a module may
import its own layer and the layers below it, never one above. Layers on one
line are independent: neither imports the other.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

import spamnb

PACKAGE = pathlib.Path(spamnb.__file__).parent

LAYERS = [
    ["spamnb._version"],
    ["spamnb.checks"],
    ["spamnb.verdict"],
    ["spamnb.options"],
    ["spamnb.mail"],
    ["spamnb.nb"],
    ["spamnb.model"],
    ["spamnb.scale"],
    ["spamnb.storage", "spamnb.evaluation"],
    ["spamnb.delivery"],
    ["spamnb.web"],
    ["spamnb.cli"],
    ["spamnb._entry"],
    ["spamnb.__main__"],
]


def module_name(path: pathlib.Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, ast.Module]:
    return {module_name(p): ast.parse(p.read_text(), str(p)) for p in sorted(PACKAGE.rglob("*.py"))}


MODULES = modules()


def resolve(name: str) -> str:
    """The module an imported name refers to (``spamnb.mail`` + ``tokenizer`` is a module)."""
    return name if name in MODULES else name.rsplit(".", 1)[0] if name.rsplit(".", 1)[0] in MODULES else name


def imports_of(tree: ast.Module) -> list[tuple[str, list[str], int]]:
    """``(module, names, line)`` of every ``spamnb`` import in ``tree``, wherever it stands."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "spamnb":
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                if sub in MODULES:  # `from spamnb.mail import tokenizer`
                    found.append((sub, [], node.lineno))
                else:
                    found.append((node.module, [alias.name], node.lineno))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "spamnb":
                    found.append((alias.name, [], node.lineno))
    return found


def layer_of(module: str) -> int:
    best, rank = None, -1
    for i, layer in enumerate(LAYERS):
        for prefix in layer:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > rank:
                best, rank = i, len(prefix)
    return best


def group_of(module: str) -> str:
    for layer in LAYERS:
        for prefix in layer:
            if module == prefix or module.startswith(prefix + "."):
                return prefix
    return module


def test_every_module_has_a_layer():
    assert [m for m in MODULES if m != "spamnb" and layer_of(m) is None] == []


def test_imports_go_down_the_layers():
    wrong = []
    for mod, tree in MODULES.items():
        if mod == "spamnb":
            continue
        for target, _, line in imports_of(tree):
            target = resolve(target)
            if target == "spamnb":
                continue
            mine, theirs = layer_of(mod), layer_of(target)
            if theirs > mine or (theirs == mine and group_of(mod) != group_of(target)):
                wrong.append(f"{mod}:{line} imports {target}")
    assert wrong == []


def test_no_import_cycles():
    graph = {mod: {resolve(t) for t, _, _ in imports_of(tree)} & set(MODULES) - {mod}
             for mod, tree in MODULES.items()}
    # A package's __init__ runs before its modules: `from spamnb.cli import x` in a module
    # of spamnb.cli imports spamnb.cli.x, not the package; count only real module edges.
    state, cycles = {}, []

    def visit(node, stack):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    assert cycles == []


def test_no_private_names_across_modules():
    used = []
    for mod, tree in MODULES.items():
        for target, names, line in imports_of(tree):
            for name in names:
                if name.startswith("_") and not name.startswith("__") and resolve(target) != mod:
                    used.append(f"{mod}:{line} takes {target}.{name}")
        aliases = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                   and n.module and n.module.startswith("spamnb") for a in n.names
                   if f"{n.module}.{a.name}" in MODULES}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                used.append(f"{mod}:{node.lineno} uses {node.value.id}.{node.attr}")
    assert used == []


def private_names_defined(tree: ast.Module) -> set[str]:
    """Private names a module defines: functions, classes, methods, attributes it assigns."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def test_no_private_attributes_of_other_modules_objects():
    """``obj._name`` where only another module defines ``_name`` (a method of its class, say)."""
    defined = {mod: private_names_defined(tree) for mod, tree in MODULES.items()}
    used = []
    for mod, tree in MODULES.items():
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                    and not node.attr.startswith("__") and node.attr not in defined[mod]
                    and any(node.attr in names for other, names in defined.items() if other != mod)):
                used.append(f"{mod}:{node.lineno} uses .{node.attr}")
    assert used == []


@pytest.mark.parametrize("bad", [
    "from spamnb.cli.options import cutoffs\n",        # delivery -> cli: upward
    "from spamnb.evaluation import metrics\n",          # delivery -> evaluation: fine (below)
])
def test_the_walk_sees_a_layer_violation(bad):
    tree = ast.parse(bad)
    (target, _, _), = imports_of(tree)
    upward = layer_of(resolve(target)) > layer_of("spamnb.delivery.server")
    assert upward == ("cli" in bad)


def test_the_readme_table_names_every_module():
    """docs/architecture.md ("How it is built") is the map of this tree: every module is in it."""
    section = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if path.name == "__init__.py" and rel != "cli/__init__.py" or path.name == "__main__.py":
            continue
        if rel not in section and f"`{path.name}`" not in section and f" {path.name}" not in section:
            missing.append(rel)
    assert missing == []
