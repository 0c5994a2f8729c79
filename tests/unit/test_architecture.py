"""The layout's rules, held by reading the source: no import cycle (imports inside functions
included), no layer importing one above it, analysis that opens no file, and units one person can
hold (no C++ source over 600 lines, no Python function over 100)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "cpuprof"

# Lowest first: a module may import its own layer and those below, never one above. The base is
# what every layer uses (errors, the core's limits, text safety, the one file writer).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("cpuprof", "errors", "exit_codes", "units", "safe_text", "output_file", "events", "defaults",
     "_limits_header", "native", "_build_info"),
    ("model",),
    ("machine", "workload"),  # facts of this machine and of the built-in model
    ("analysis",),  # pure: profiles in, reports out
    ("reports", "exports"),
    ("collect", "launch", "options_spec"),  # the spec declares the launch's options, and compare's axes
    ("commands",),
    ("cli", "__main__"),
)
LAYER_OF = {name: i for i, names in enumerate(LAYERS) for name in names}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """Imports under ``if TYPE_CHECKING:`` exist for the type checker only."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(child) for statement in node.body for child in ast.walk(statement))
    return skipped


def _imported(module: str, node: ast.Import | ast.ImportFrom) -> Iterator[str]:
    """The cpuprof modules an import statement loads (a package's name when it imports a name of it)."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    if node.level:
        package = module.split(".") if MODULES[module].name == "__init__.py" else module.split(".")[:-1]
        base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    for alias in node.names:
        yield f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base


def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text())
        skipped = _type_checking_nodes(tree)
        targets = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in skipped:
                for name in _imported(module, node):
                    while name not in MODULES and "." in name:
                        name = name.rsplit(".", 1)[0]
                    if name in MODULES and name != module:
                        targets.add(name)
        graph[module] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
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
                    found.append(sorted(component))
    return found


def layer(module: str) -> int:
    parts = module.split(".")
    return LAYER_OF[parts[1] if len(parts) > 1 else parts[0]]


def test_the_checker_finds_a_cycle_and_an_upward_import():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert layer("cpuprof.model.io") < layer("cpuprof.analysis.gemm") < layer("cpuprof.commands.run")


def test_every_module_has_a_layer():
    assert [m for m in MODULES if (m.split(".")[1] if "." in m else m) not in LAYER_OF] == []


def test_no_import_cycle():
    assert cycles(import_graph()) == []


def test_no_layer_imports_one_above_it():
    upward = [f"{m} -> {t}" for m, targets in sorted(import_graph().items()) for t in sorted(targets)
              if layer(t) > layer(m)]
    assert upward == []


# Calls that read or write files, or list directories: analysis is given what was loaded.
FILE_CALLS = {"open", "read_text", "read_bytes", "write_text", "write_bytes", "iterdir", "glob", "rglob", "exists",
              "is_dir", "is_file", "load", "save", "unlink", "mkdir", "stat", "listdir", "scandir"}


def test_analysis_opens_no_file():
    found = []
    for path in sorted((PACKAGE / "analysis").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "attr", None) or getattr(node.func, "id", None)
                if name in FILE_CALLS:
                    found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)[:80]}")
    assert found == []


def test_no_python_function_over_100_lines():
    long = []
    for module, path in sorted(MODULES.items()):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > 100:
                    long.append(f"{module}.{node.name}: {length} lines")
    assert long == []


@pytest.mark.parametrize("suffix", [".cpp", ".h", ".c"])
def test_no_cpp_source_over_600_lines(suffix: str):
    long = [f"{p.relative_to(ROOT)}: {n}" for p in sorted((ROOT / "csrc").rglob(f"*{suffix}"))
            if (n := len(p.read_text().splitlines())) > 600]
    assert long == []


def test_no_two_test_modules_share_a_name():
    """pytest imports test modules by their file name (the test directories are not packages): two
    of one name in different directories stop the whole suite at collection."""
    names: dict[str, list[str]] = {}
    for path in (ROOT / "tests").rglob("test_*.py"):
        names.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert not {name: paths for name, paths in names.items() if len(paths) > 1}
