"""Static check: no undefined names, unused imports or syntax errors anywhere in the repository (ruff)."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO_ROOT


def test_ruff_finds_no_mistakes():
    proc = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", str(REPO_ROOT)],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _import_graph(package: str) -> dict[str, set[str]]:
    """{module: the modules of `package` it imports}, function-local imports included (a cycle hidden in a
    function is still a cycle). `from pkg import sub` of a submodule counts as importing `pkg.sub` only."""
    import ast

    files = {}
    for path in (REPO_ROOT / package).rglob("*.py"):
        parts = path.relative_to(REPO_ROOT).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in files.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                subs = [f"{node.module}.{alias.name}" for alias in node.names]
                targets = subs if all(s in files for s in subs) else [node.module, *subs]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            deps.update(t for t in targets if t in files and t != name)
        graph[name] = deps
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, state, stack = [], {}, []

    def visit(node: str) -> None:
        state[node] = "open"
        stack.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == "open":
                found.append(stack[stack.index(dep):] + [dep])
            elif dep not in state:
                visit(dep)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


def test_no_import_cycles():
    """Modules import downwards only: no cycle among `sqlenv`'s or `training`'s modules (such as the one
    `sqlenv.data.datasets` <-> `sqlenv.data.builtin` had, hidden by a function-local import)."""
    for package in ("sqlenv", "training"):
        graph = _import_graph(package)
        assert "sqlenv.data.datasets" in graph or package != "sqlenv"
        assert _cycles(graph) == [], package
    # The checker itself sees a cycle (so the assertion above can fail).
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]


def test_layers_import_downwards_only():
    """bench -> dashboard -> training -> sqlenv: no module of a lower layer imports a higher one (function-local
    imports included), so `sqlenv` runs without the training stack and `training` without the dashboard."""
    import ast

    higher = {"sqlenv": ("training", "dashboard", "bench", "app"), "training": ("dashboard", "bench", "app"),
              "dashboard": ("bench",)}
    upward = []
    for package, forbidden in higher.items():
        for path in (REPO_ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names = [node.module]
                elif isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                else:
                    continue
                upward += [f"{path.relative_to(REPO_ROOT)} imports {n}" for n in names
                           if n.split(".")[0] in forbidden]
    assert upward == []
