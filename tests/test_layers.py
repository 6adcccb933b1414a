"""The project's layers, read from its source: sqlenv → training → dashboard → bench, each importing only the floors
below it; `sqlenv` free of ML code; no import cycle inside `sqlenv`; each of its subpackages importing only what it
declares.

The import graph is read with `ast` from every `.py` file, every import statement counted, those inside functions
(lazy imports) and `TYPE_CHECKING` blocks included: a lazy import is still a dependency. One subprocess also imports
every `sqlenv` module and looks at `sys.modules`, which catches ML code pulled in by a third-party package.

When `sqlenv/` gains a subpackage, declare it in `SUBPACKAGES` below (what it may import from the rest of
`sqlenv`), and say the same in words in its `__init__` docstring.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# The floors, lowest first: a module may import its own floor and those below. app.py launches the dashboard.
FLOORS = {"sqlenv": 0, "training": 1, "dashboard": 2, "app": 2, "bench": 3}

# What `sqlenv` never imports, directly or through another package: the ML stack and the UI.
ML_STACK = ("torch", "transformers", "trl", "gradio", "peft", "accelerate", "datasets", "tokenizers", "safetensors")
# ...except that `sqlenv.server` stands on PyPI's `openenv`, whose `openenv.core` imports gradio (its /web page)
# whether or not the page is served: allowed there at run time, never named by `sqlenv.server`'s own imports.
THIRD_PARTY_ALLOWED = {"server": {"gradio"}}

ANY = "*"
# sqlenv's units are its top-level modules (the core: types, protocol, environment, ...) and its subpackages.
# Each subpackage declares the units it may import (ANY: the whole of sqlenv; the package's own `__init__` is always
# allowed: it holds only lazy exports). A subpackage not listed fails `test_every_subpackage_is_declared`.
SUBPACKAGES: dict[str, set[str] | str] = {
    "sandbox": set(),  # the floor: SQL runs here, knowing nothing of episodes
    "agent": {"types"},  # what a model reads and writes: plain text
    "data": {"types"},
    "scoring": {"sandbox", "agent"},  # agent: only its code fences (an ANSWER may come in one)
    "evaluation": {"types", "agent", "data", "json_files", "scoring"},
    "server": {"asgi_body", "client_address", "data", "http_connections", "environment", "protocol", "rewards", "sandbox", "transcript", "types"},
    "cli": ANY,  # the command line sits on top of the whole package
}
# Entry points over the rest of sqlenv, and the only units that may import them.
ENTRY_POINTS = {"cli": {"__main__"}, "server": {"cli"}}


# --------------------------------------------------------------------------------------------------- the graph


@dataclass
class Module:
    name: str  # dotted, e.g. "sqlenv.cli.eval"; "app" for app.py
    path: Path
    is_package: bool
    imports: set[str] = field(default_factory=set)  # every module name imported (dotted, as written, resolved)
    tree: ast.Module | None = None


def _source_files() -> dict[str, Module]:
    modules = {}
    for top in FLOORS:
        paths = [REPO / f"{top}.py"] if (REPO / f"{top}.py").is_file() else sorted((REPO / top).rglob("*.py"))
        for path in paths:
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts = parts[:-1]
            name = ".".join(parts)
            modules[name] = Module(name, path, is_package, tree=ast.parse(path.read_text(), filename=str(path)))
    return modules


def _lazy_exports(module: Module, known: set[str]) -> dict[str, str]:
    """A package's lazily exported names: module-level dicts of {name: "dotted.module"} (`sqlenv._EXPORTS`)."""
    exports = {}
    for node in module.tree.body:
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        if isinstance(value, ast.Dict) and value.keys:
            pairs = [(k.value, v.value) for k, v in zip(value.keys, value.values)
                     if isinstance(k, ast.Constant) and isinstance(v, ast.Constant)
                     and isinstance(k.value, str) and isinstance(v.value, str)]
            if len(pairs) == len(value.keys) and all(v in known for _, v in pairs):
                exports.update(pairs)
    return exports


def _resolve_imports(modules: dict[str, Module]) -> None:
    """Fill each module's `imports`: `from P import N` names the module P.N when it is one, else the module that
    P lazily exports N from, else P; relative imports resolved; a string constant naming a project module exactly
    (for importlib or runpy) counts as an import too, except a package's own lazy-export targets (loaded on first
    use of the name, by whoever uses it)."""
    known = set(modules)
    exports = {name: _lazy_exports(m, known) for name, m in modules.items() if m.is_package}
    for module in modules.values():
        package = module.name.split(".") if module.is_package else module.name.split(".")[:-1]
        lazy_targets = set(exports.get(module.name, {}).values())  # imported on first use, not by the package
        for node in ast.walk(module.tree):
            if isinstance(node, ast.Import):
                module.imports.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package[: len(package) - (node.level - 1)]
                    base = ".".join(parent + ([node.module] if node.module else []))
                for alias in node.names:
                    target = f"{base}.{alias.name}"
                    if target not in known:
                        target = exports.get(base, {}).get(alias.name, base)
                    module.imports.add(target)
            elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in known
                  and "." in node.value and node.value not in lazy_targets):
                module.imports.add(node.value)
        module.imports.discard(module.name)


@pytest.fixture(scope="module")
def modules() -> dict[str, Module]:
    found = _source_files()
    _resolve_imports(found)
    return found


def _top(name: str) -> str:
    return name.split(".")[0]


def _unit(name: str) -> str:
    """sqlenv's unit of a module: its subpackage or top-level module; "" for the package `sqlenv` itself."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else ""


def _subpackage(name: str, modules: dict[str, Module]) -> str | None:
    """The sqlenv subpackage a module belongs to (None for the core's top-level modules and the package itself)."""
    unit = _unit(name)
    package = modules.get(f"sqlenv.{unit}")
    return unit if _top(name) == "sqlenv" and unit and package is not None and package.is_package else None


def _sqlenv(modules: dict[str, Module]) -> dict[str, Module]:
    return {name: m for name, m in modules.items() if _top(name) == "sqlenv"}


def _subpackages(modules: dict[str, Module]) -> set[str]:
    return {_subpackage(name, modules) for name in modules} - {None}


# --------------------------------------------------------------------------------------------------- floors


def test_no_module_imports_a_floor_above_its_own(modules):
    wrong = sorted(f"{name} imports {target}" for name, m in modules.items() for target in m.imports
                   if _top(target) in FLOORS and FLOORS[_top(target)] > FLOORS[_top(name)])
    assert not wrong, "\n".join(wrong)


def test_sqlenv_names_no_ml_or_ui_package(modules):
    wrong = sorted(f"{name} imports {target}" for name, m in _sqlenv(modules).items() for target in m.imports
                   if _top(target) in ML_STACK)
    assert not wrong, "\n".join(wrong)


def test_importing_every_sqlenv_module_loads_no_ml_code(modules):
    """Every sqlenv module imported in one fresh process, the core before `sqlenv.server`: what each brought in."""
    core = sorted(n for n in _sqlenv(modules) if _unit(n) != "server")
    server = sorted(n for n in _sqlenv(modules) if _unit(n) == "server")
    code = (
        "import importlib, json, sys\n"
        "def loaded(names):\n"
        "    for name in names: importlib.import_module(name)\n"
        "    return sorted({m.split('.')[0] for m in sys.modules} & set(ML))\n"
        f"ML = {list(ML_STACK)!r}\n"
        f"print(json.dumps({{'core': loaded({core!r}), 'server': loaded({server!r})}}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert loaded["core"] == [], f"importing sqlenv's core loads {loaded['core']}"
    extra = set(loaded["server"]) - THIRD_PARTY_ALLOWED["server"]
    assert not extra, f"importing sqlenv.server loads {sorted(extra)}"


# --------------------------------------------------------------------------------------------------- inside sqlenv


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` (as a path that returns to its start), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_cycle_finder_finds_a_cycle_and_passes_a_tree():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycle_between_sqlenv_modules(modules):
    inside = _sqlenv(modules)
    cycle = _cycle({name: {t for t in m.imports if t in inside} for name, m in inside.items()})
    assert cycle is None, " -> ".join(cycle)


def test_no_import_cycle_between_sqlenv_units(modules):
    """Subpackages and top-level modules as nodes: a subpackage never needs what needs it."""
    graph: dict[str, set[str]] = {}
    for name, m in _sqlenv(modules).items():
        graph.setdefault(_unit(name), set()).update(
            _unit(t) for t in m.imports if _top(t) == "sqlenv" and _unit(t) not in ("", _unit(name)))
    cycle = _cycle(graph)
    assert cycle is None, " -> ".join(cycle)


def test_every_subpackage_is_declared(modules):
    undeclared = sorted(_subpackages(modules) - set(SUBPACKAGES))
    assert not undeclared, (f"sqlenv subpackages {undeclared} are not in tests/test_layers.py's SUBPACKAGES: "
                            "declare what each may import there and in its __init__ docstring")


def test_subpackages_import_only_what_they_declare(modules):
    wrong = []
    for name, m in _sqlenv(modules).items():
        allowed = SUBPACKAGES.get(_subpackage(name, modules) or "")
        if allowed is None or allowed == ANY:
            continue
        wrong += [f"{name} imports {t}" for t in sorted(m.imports)
                  if _top(t) == "sqlenv" and _unit(t) not in {"", _unit(name), *allowed}]
    assert not wrong, "\n".join(wrong)


def test_entry_points_are_imported_only_from_above(modules):
    wrong = sorted(f"{name} imports {t}" for name, m in _sqlenv(modules).items() for t in m.imports
                   if _top(t) == "sqlenv" and _unit(t) in ENTRY_POINTS and _unit(t) != _unit(name)
                   and _unit(name) not in ENTRY_POINTS[_unit(t)])
    assert not wrong, "\n".join(wrong)


def test_the_graph_sees_lazy_relative_and_exported_imports(tmp_path, monkeypatch):
    """The reader itself, on a small package: a lazy import inside a function, a relative import, a name taken from
    a package's lazy exports, and a runpy-style string all count; a docstring naming a module does not."""
    pkg = tmp_path / "sqlenv"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text('"""sqlenv.b is named here."""\n_EXPORTS = {"Thing": "sqlenv.b"}\n')
    (pkg / "a.py").write_text("def f():\n    from sqlenv import Thing\n    return Thing\n")
    (pkg / "b.py").write_text("from .sub import c\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "c.py").write_text("import runpy\nrunpy.run_module('training.x')\n")
    (tmp_path / "training").mkdir()
    (tmp_path / "training" / "x.py").write_text("")
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    found = _source_files()
    _resolve_imports(found)
    assert found["sqlenv.a"].imports == {"sqlenv.b"}
    assert found["sqlenv.b"].imports == {"sqlenv.sub.c"}
    assert found["sqlenv.sub.c"].imports == {"runpy", "training.x"}
    assert found["sqlenv"].imports == set()
    assert [f"{n} imports {t}" for n, m in found.items() for t in m.imports
            if _top(t) in FLOORS and FLOORS[_top(t)] > FLOORS[_top(n)]] == ["sqlenv.sub.c imports training.x"]


# --------------------------------------------------------------------------------------------------- inside dashboard

# The dashboard's folders, lowest first: each may import its own folder and those below it, never a tab its neighbour.
# `access` (the public app's guards) ← `core` (what two tabs share) ← the tabs ← `page` (the tabs on one page) ←
# `server` (serving it); `style` (CSS, theme) imports nothing of the dashboard.
DASHBOARD_TABS = ("train", "compare", "play", "runs")
DASHBOARD_FLOORS = {"style": 0, "access": 0, "core": 1, **{tab: 2 for tab in DASHBOARD_TABS}, "page": 3, "server": 4}
#: The most entries (modules and folders, `__init__.py` included) the dashboard's top folder holds.
DASHBOARD_TOP_ENTRIES = 10
MAX_DASHBOARD_MODULE_LINES = 500


def _dashboard_part(name: str) -> str | None:
    """The folder (or top-level module) of a dashboard module: "train" for dashboard.train.form; None for the
    package itself and for modules outside the dashboard."""
    parts = name.split(".")
    return parts[1] if parts[0] == "dashboard" and len(parts) > 1 else None


def _dashboard_wrong_imports(modules: dict[str, Module]) -> list[str]:
    """Imports inside the dashboard that run sideways (a tab importing another tab) or upward (a floor of
    `DASHBOARD_FLOORS` importing a higher one); a part the table does not know is refused too."""
    wrong = []
    for name, m in modules.items():
        part = _dashboard_part(name)
        if part is None:
            continue
        for target in sorted(m.imports):
            other = _dashboard_part(target)
            if other is None or other == part:
                continue
            if part not in DASHBOARD_FLOORS or other not in DASHBOARD_FLOORS:
                wrong.append(f"{name} imports {target}: declare its folder in DASHBOARD_FLOORS")
            elif other in DASHBOARD_TABS and part in DASHBOARD_TABS:
                wrong.append(f"{name} imports {target}: a tab imports another tab (move what they share to core)")
            elif DASHBOARD_FLOORS[other] >= DASHBOARD_FLOORS[part]:
                wrong.append(f"{name} imports {target}: {part} sits below {other}")
    return wrong


def test_dashboard_has_a_folder_per_tab_and_a_short_top(modules):
    top = REPO / "dashboard"
    for folder in (*DASHBOARD_TABS, "access", "core"):
        assert (top / folder / "__init__.py").is_file(), f"dashboard/{folder}/ is not a package"
    entries = sorted(p.name for p in top.iterdir() if p.name != "__pycache__")
    assert len(entries) <= DASHBOARD_TOP_ENTRIES, entries
    assert {_dashboard_part(n) for n in modules} - {None} <= set(DASHBOARD_FLOORS), "an undeclared dashboard part"


def test_no_dashboard_tab_imports_another_and_no_folder_imports_upward(modules):
    wrong = _dashboard_wrong_imports(modules)
    assert not wrong, "\n".join(wrong)


def test_no_dashboard_module_is_over_500_lines():
    long = {str(p.relative_to(REPO)): n for p in (REPO / "dashboard").rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_DASHBOARD_MODULE_LINES}
    assert not long, long


def test_the_dashboard_check_sees_a_tab_importing_another():
    """The check itself, on a made-up graph: a tab importing another tab (lazily or not, the graph has both), core
    importing a tab and access importing core are refused; a tab importing core and the page importing tabs are not."""
    graph = {"dashboard.runs.tab": {"dashboard.train.form", "dashboard.core.charts"},
             "dashboard.core.context": {"dashboard.play.episodes"},
             "dashboard.access.owner": {"dashboard.core.paths"},
             "dashboard.page": {"dashboard.runs.tab", "dashboard.access.owner"},
             "dashboard.train.form": {"dashboard.core.runner", "training.config"}}
    found = {name: Module(name, REPO, False, imports=set(targets)) for name, targets in graph.items()}
    assert [line.split(":")[0] for line in _dashboard_wrong_imports(found)] == [
        "dashboard.runs.tab imports dashboard.train.form", "dashboard.core.context imports dashboard.play.episodes",
        "dashboard.access.owner imports dashboard.core.paths"]


# --------------------------------------------------------------------------------------------------- inside training

# training's units (its subpackages and top-level modules), in the order data flows through a run, each with the units
# it may import (lazy imports included; the package's own `__init__` is always allowed). The floor is the run record
# (`run`, the one contract with the dashboard) and the small rule modules; then the config (plain data) → the teacher's
# environment → models → the plan → generation → GRPO → the warm start → evals, trainer hooks, validation → the phases
# → the run (`train`) → its commands. A unit not listed fails `test_every_training_unit_is_declared`.
TRAINING_UNITS: dict[str, set[str]] = {
    "run": set(),  # the run record: schema, directory, recorder, results, listing, health, kept weights
    "distributed": set(),  # which rank this is
    "device": set(),  # device, precision, CPU threads
    "gpu": set(),  # the GPU readout a run stores
    "config": {"run"},  # run ids, the runs folder and the secret rule come from the record's schema
    "panel": {"config"},
    "environment": {"config"},  # EpisodeSource, SQLEnvTRL, the teacher's conversations
    "models": {"device", "environment", "run"},  # environment: the tiny model's tokenizer corpus
    "plan": {"config", "device", "environment", "models", "panel"},
    "generation": {"environment", "models"},
    "grpo": {"config", "environment", "generation", "models", "plan"},
    "warm_start": {"config", "distributed", "environment", "generation", "grpo", "models", "plan"},
    "evals": {"generation", "run"},
    "callbacks": {"distributed", "generation", "run"},  # trainer hooks only; what they write goes through `run`
    "validation": {"distributed", "evals", "generation", "run"},
    "phases": {"callbacks", "distributed", "evals", "grpo", "models", "plan", "run", "validation", "warm_start"},
    "train": {"config", "distributed", "gpu", "phases", "plan", "run"},
    "cli": {"config", "distributed", "plan", "run", "train"},
    "runs": {"run"},  # python -m training.runs list
}
# Names that are not dependencies: `python -m training.train` runs the CLI (runpy.run_module("training.cli")).
TRAINING_COMMAND_ALIASES = {"train": {"cli"}}
MAX_TRAINING_MODULE_LINES = 500


def _training_unit(name: str) -> str | None:
    """training's unit of a module: "run" for training.run.directory, "plan" for training.plan; None for the package
    itself and for modules outside training."""
    parts = name.split(".")
    return parts[1] if parts[0] == "training" and len(parts) > 1 else None


def _training_graph(modules: dict[str, Module]) -> dict[str, set[str]]:
    """Unit → the other units its modules import (every import, lazy and TYPE_CHECKING ones included)."""
    graph: dict[str, set[str]] = {}
    for name, m in modules.items():
        unit = _training_unit(name)
        if unit is not None:
            graph.setdefault(unit, set()).update(other for t in m.imports
                                                 if (other := _training_unit(t)) not in (None, unit))
    return graph


def _training_wrong_imports(modules: dict[str, Module]) -> list[str]:
    """Imports between training's units that `TRAINING_UNITS` does not allow (or from or to an undeclared unit)."""
    wrong = []
    for name, m in sorted(modules.items()):
        unit = _training_unit(name)
        if unit is None:
            continue
        for target in sorted(m.imports):
            other = _training_unit(target)
            if other in (None, unit) or other in TRAINING_COMMAND_ALIASES.get(unit, ()):
                continue
            if unit not in TRAINING_UNITS or other not in TRAINING_UNITS:
                wrong.append(f"{name} imports {target}: declare both units in TRAINING_UNITS")
            elif other not in TRAINING_UNITS[unit]:
                wrong.append(f"{name} imports {target}: {unit} may import only {sorted(TRAINING_UNITS[unit])}")
    return wrong


def test_every_training_unit_is_declared(modules):
    found = {_training_unit(name) for name in modules} - {None}
    assert found == set(TRAINING_UNITS), (f"undeclared: {sorted(found - set(TRAINING_UNITS))}, "
                                          f"gone: {sorted(set(TRAINING_UNITS) - found)}")


def test_the_declared_training_order_has_no_cycle():
    cycle = _cycle(TRAINING_UNITS)
    assert cycle is None, " -> ".join(cycle)


def test_training_units_import_only_what_they_declare(modules):
    wrong = _training_wrong_imports(modules)
    assert not wrong, "\n".join(wrong)


def test_no_import_cycle_between_training_units(modules):
    """Read from the source alone, whatever the table says: a unit never needs, even lazily, what needs it."""
    graph = _training_graph(modules)
    for unit, aliases in TRAINING_COMMAND_ALIASES.items():
        graph[unit] = graph.get(unit, set()) - aliases
    cycle = _cycle(graph)
    assert cycle is None, " -> ".join(cycle)


def test_importing_the_run_record_loads_no_ml_code(modules):
    """Every module of the run record imported in one fresh process: the dashboard reads runs without torch."""
    names = sorted(n for n in modules if _training_unit(n) == "run")
    assert "training.run.schema" in names and "training.run.recorder" in names
    code = (
        "import importlib, json, sys\n"
        f"for name in {names!r}: importlib.import_module(name)\n"
        f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({list(ML_STACK)!r}))))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [], "importing training.run loads ML code"


def test_no_training_module_is_over_500_lines():
    long = {str(p.relative_to(REPO)): n for p in (REPO / "training").rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_TRAINING_MODULE_LINES}
    assert not long, long


def test_the_training_check_sees_an_import_back_up_and_a_hidden_cycle():
    """The check itself, on a made-up graph: the record importing the trainer hooks, a lazy models -> plan import
    (the graph holds lazy imports like any other) are refused; the phases importing the hooks is not."""
    graph = {"training.run.recorder": {"training.callbacks"},
             "training.models": {"training.plan", "training.run.schema"},
             "training.plan": {"training.models.gguf"},
             "training.phases": {"training.callbacks", "sqlenv.types"},
             "training.train": {"training.cli"}}
    found = {name: Module(name, REPO, False, imports=set(targets)) for name, targets in graph.items()}
    assert [line.split(":")[0] for line in _training_wrong_imports(found)] == [
        "training.models imports training.plan", "training.run.recorder imports training.callbacks"]
    assert _cycle(_training_graph(found)) == ["models", "plan", "models"]
