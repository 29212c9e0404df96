"""No import cycles among dglkit's modules, lazy imports inside functions included: a cycle that works today
only because one side imports late breaks as soon as someone moves that import to the top."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "app" / "dglkit"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, modules: set[str]) -> set[str]:
    """The dglkit modules that the file imports anywhere in it (relative imports resolved)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]) if node.level else ""
            source = ".".join(filter(None, [base, node.module]))
            found |= {source} | {f"{source}.{alias.name}" for alias in node.names}
    return (found & modules) - {name}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle that a depth-first walk meets, each once, as module names from its first to itself again."""
    found: list[list[str]] = []
    done: set[str] = set()

    def walk(module: str, path: list[str]) -> None:
        for target in sorted(graph[module]):
            if target in path:
                cycle = path[path.index(target):]
                if set(cycle) not in [set(c) for c in found]:
                    found.append([*cycle, target])
            elif target not in done:
                walk(target, [*path, target])
        done.add(module)

    for module in sorted(graph):
        if module not in done:
            walk(module, [module])
    return found


def test_no_import_cycles() -> None:
    files = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(path) for path in files}
    assert {"dglkit.data", "dglkit.hetero", "dglkit.train", "dglkit.launch"} <= modules
    graph = {module_name(path): imports(path, modules) for path in files}
    assert "dglkit.common" in graph["dglkit.data"]  # the reading works: every module imports common
    found = cycles(graph)
    assert not found, "import cycles: " + "; ".join(" -> ".join(cycle) for cycle in found)
