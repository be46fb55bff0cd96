"""Rules of the code's shape that a reviewer would otherwise check by hand (docs/ARCHITECTURE.md)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "launcher"


def _module(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def _imports(path: Path, typing_too: bool = False, source: str | None = None) -> set[str]:
    """The launcher modules ``path`` imports (at any depth; under ``if TYPE_CHECKING:`` only with ``typing_too``);
    ``source``: the module's text, read from ``path`` when not given."""
    tree = ast.parse(path.read_text(encoding="utf-8") if source is None else source)
    package = _module(path) if path.name == "__init__.py" else _module(path).rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test) and not typing_too:
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("launcher"))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            if base.startswith("launcher"):
                found.add(base)
                found.update(f"{base}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _graph(typing_too: bool = False) -> dict[str, set[str]]:
    modules = {_module(p): p for p in PACKAGE.rglob("*.py")}
    return {
        name: {dep for dep in _imports(path, typing_too) if dep in modules and dep != name}
        for name, path in modules.items()
    }


#: The layers of docs/ARCHITECTURE.md, lowest first: a module imports its own layer or lower ones.
LAYERS = ["errors", "catalog", "spec", "plan", "metrics", "store", "backends", "views", "run", "dashboard", "cli", "__main__", "recipes"]
#: Imported by any layer: the package root and the node side (shipped to nodes, stdlib only).
SHARED = {"", "node"}


def _layer(module: str) -> str:
    return module.split(".")[1] if module.count(".") else ""


def test_dependencies_point_down_the_layers() -> None:
    """Type-only imports count too: a planner that names the Backend class in its signature depends on it."""
    upward = sorted(
        f"{module} -> {dep}"
        for module, deps in _graph(typing_too=True).items()
        for dep in deps
        if _layer(module) not in SHARED and _layer(dep) not in SHARED
        and LAYERS.index(_layer(dep)) > LAYERS.index(_layer(module))
    )
    assert upward == []


def test_every_module_sits_in_a_known_layer() -> None:
    """A new top-level package or module must be given its place in LAYERS (and in docs/ARCHITECTURE.md)."""
    assert {_layer(module) for module in _graph()} <= set(LAYERS) | SHARED


def test_the_direction_test_sees_an_upward_import() -> None:
    """The AST reader finds a type-only import of a higher layer (the knot the planner once had), and a relative one.
    The module is never written: another test's walk of launcher/ would find it."""
    module = PACKAGE / "plan" / "_probe_upward.py"
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from launcher.backends.base import Backend\n"
    assert not module.exists()
    assert _imports(module, source=source) == set()
    assert "launcher.backends.base" in _imports(module, typing_too=True, source=source)
    assert "launcher.plan.batch" in _imports(module, source="from .batch import BatchPlan\n")


def test_no_import_cycles_among_launcher_modules() -> None:
    """Type-only imports count: a cycle through ``if TYPE_CHECKING:`` is still two modules that need each other."""
    graph = _graph(typing_too=True)
    cycles = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def walk(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                cycles.append(stack[stack.index(dep):] + [dep])
            elif dep not in state:
                walk(dep)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            walk(node)
    assert cycles == [], "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_base_backend_imports_no_concrete_backend() -> None:
    """Every package under backends/ is a concrete backend (found on disk, so a new one is covered): base.py
    imports none of them, nor any module inside one, type-only imports included."""
    concrete = sorted(f"launcher.backends.{p.parent.name}" for p in (PACKAGE / "backends").glob("*/__init__.py"))
    assert {"launcher.backends.local", "launcher.backends.slurm"} <= set(concrete)
    imported = _imports(PACKAGE / "backends" / "base.py", typing_too=True)
    assert sorted(m for m in imported if any(m == c or m.startswith(c + ".") for c in concrete)) == []


def _backend_branches(source: str) -> list[str]:
    """Comparisons of a ``backend`` value with a name (``cluster.backend == "ssh"``, ``backend in (...)``, ``!=``);
    ``backend is None`` asks whether there is one, not which."""

    def is_backend(side: ast.expr) -> bool:
        return (isinstance(side, ast.Attribute) and side.attr == "backend") or (isinstance(side, ast.Name) and side.id == "backend")

    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        others = [side for side in sides if not is_backend(side)]
        if len(others) < len(sides) and not all(isinstance(o, ast.Constant) and o.value is None for o in others):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_backend_branch_finder_sees_every_form_of_a_branch() -> None:
    source = ('if cluster.backend == "ssh": pass\nif plan.backend != "ray": pass\n'
              'if backend in ("slurm", "ray"): pass\nok = "ssh" == self.backend\nif job.name == "x": pass\n'
              'if backend is not None: pass\n')
    assert [line.split(":")[0] for line in _backend_branches(source)] == ["1", "2", "3", "4"]


def test_no_backend_branches_outside_the_backends_and_the_spec_models() -> None:
    outside = {
        str(path.relative_to(PACKAGE)): found
        for path in PACKAGE.rglob("*.py")
        if path.relative_to(PACKAGE).parts[0] not in ("backends", "spec")
        and (found := _backend_branches(path.read_text(encoding="utf-8")))
    }
    assert outside == {}


def _untyped_handle_uses(source: str) -> list[str]:
    """What bypasses the declared ``NodeHandle``: a ``getattr`` on a handle, a node handle class (one with
    ``lines``, ``poll`` and ``terminate``) that is not a ``NodeHandle``, a ``generation`` set on a backend."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "getattr" and node.args \
                and "handle" in ast.unparse(node.args[0]).lower():
            found.append(f"{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.ClassDef) and node.name != "NodeHandle" and {"lines", "poll", "terminate"} <= {
                f.name for f in node.body if isinstance(f, ast.FunctionDef)} \
                and "NodeHandle" not in {ast.unparse(b).rpartition(".")[2] for b in node.bases}:
            found.append(f"{node.lineno}: class {node.name}")
        elif isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            found += [f"{node.lineno}: {ast.unparse(t)}" for t in targets if isinstance(t, ast.Attribute)
                      and t.attr == "generation" and ast.unparse(t.value).rpartition(".")[2] == "backend"]
    return sorted(found, key=lambda line: int(line.split(":")[0]))


def test_the_untyped_handle_finder_sees_each_form() -> None:
    source = ('x = getattr(handle, "fenced", None)\ny = getattr(self.handle, "error")\nz = getattr(exc, "reason")\n'
              'class Node:\n    def lines(self): pass\n    def poll(self): pass\n    def terminate(self, g): pass\n'
              'class Typed(base.NodeHandle):\n    def lines(self): pass\n    def poll(self): pass\n'
              '    def terminate(self, g): pass\nbackend.generation = 2\nmoved.backend.generation = 1\nself.generation = 3\n')
    assert [line.split(":")[0] for line in _untyped_handle_uses(source)] == ["1", "2", "4", "12", "13"]


def test_node_handles_are_typed_and_the_generation_is_passed() -> None:
    """The supervisor reads a node handle's declared attributes (``NodeHandle``) and passes its generation to the
    backend's fenced commands; nothing reads an undeclared one or sets one on a backend."""
    found = {
        str(path.relative_to(ROOT)): uses
        for path in [*PACKAGE.rglob("*.py"), *(ROOT / "tests").rglob("*.py")]
        if path.name != "test_architecture.py" and (uses := _untyped_handle_uses(path.read_text(encoding="utf-8")))
    }
    assert found == {}


def test_the_node_side_imports_nothing_outside_itself() -> None:
    outside = {
        path.name: sorted(m for m in _imports(path, typing_too=True) if not m.startswith("launcher.node"))
        for path in (PACKAGE / "node").glob("*.py")
    }
    assert {name: found for name, found in outside.items() if found} == {}


def test_the_test_harness_is_not_shipped_in_the_package() -> None:
    assert not (PACKAGE / "testbed.py").exists()


def test_no_two_test_files_share_a_name() -> None:
    """pytest imports test files by their base name (no __init__.py in tests/): two alike stop the whole run."""
    names = sorted(path.name for path in (ROOT / "tests").rglob("test_*.py"))
    assert sorted(set(names)) == names, [name for name in set(names) if names.count(name) > 1]


STATES_MODULE = PACKAGE / "store" / "states.py"


def _state_literals(source: str) -> list[str]:
    """``line: NAME`` for each string literal that spells a job's or a node's state (``"FAILED"``), outside ``__all__``
    and outside enums (Slurm's own states are spelt alike)."""
    from launcher.store.states import JobState, NodeState

    names = {state.value for state in JobState} | {state.value for state in NodeState}
    tree = ast.parse(source)
    skipped: set[int] = set()
    for node in ast.walk(tree):
        enum = isinstance(node, ast.ClassDef) and any("Enum" in ast.unparse(base) for base in node.bases)
        exported = isinstance(node, ast.Assign) and any(ast.unparse(t) == "__all__" for t in node.targets)
        if enum or exported:
            skipped.update(id(inner) for inner in ast.walk(node))
    found = [node for node in ast.walk(tree)
             if isinstance(node, ast.Constant) and node.value in names and id(node) not in skipped]
    return [f"{node.lineno}: {node.value}" for node in sorted(found, key=lambda node: (node.lineno, node.col_offset))]


def test_the_state_literal_finder_sees_a_literal_in_any_form() -> None:
    source = ('if state == "FAILED": pass\nx = {"SUCCEEDED": 1}\ny = state in ("CANCELLED", "x")\n'
              'def f(state="RUNNING"): pass\nclass Theirs(StrEnum):\n    RUNNING = "RUNNING"\n__all__ = ["PENDING"]\n')
    assert _state_literals(source) == ["1: FAILED", "2: SUCCEEDED", "3: CANCELLED", "4: RUNNING"]


def test_no_state_literal_outside_the_states_module() -> None:
    """Job and node states are ``JobState``/``NodeState`` members everywhere but where they are defined: a misspelt
    state is then an AttributeError, never a comparison that is quietly false."""
    found = {
        str(path.relative_to(PACKAGE)): literals
        for path in PACKAGE.rglob("*.py")
        if path != STATES_MODULE and (literals := _state_literals(path.read_text(encoding="utf-8")))
    }
    assert found == {}


def test_docs_architecture_names_every_module() -> None:
    """docs/ARCHITECTURE.md is where a reader finds a module's responsibility: each module is named there."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    unnamed = sorted(str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py")
                     if path.name not in ("__init__.py", "__main__.py") and f"`{path.name}`" not in text)
    assert unnamed == []


def _store_writers() -> set[str]:
    """The store's methods that change it: those that execute SQL through ``_execute`` or ``_transaction``, and
    those that call one of them (read from the store's classes, so a new writer is one at once)."""
    calls: dict[str, set[str]] = {}
    for path in (PACKAGE / "store").glob("*.py"):
        for cls in (n for n in ast.parse(path.read_text(encoding="utf-8")).body if isinstance(n, ast.ClassDef)):
            for method in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
                calls.setdefault(method.name, set()).update(
                    node.func.attr for node in ast.walk(method)
                    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "self")
    writers = {"_execute", "_transaction"}
    while grown := {name for name, called in calls.items() if called & writers} - writers:
        writers |= grown
    return {name for name in writers if not name.startswith("_")}


def _writes(source: str, writers: set[str]) -> list[str]:
    """``line: name`` for each call of a store writer (``anything.add_event(...)``) in ``source``."""
    return [f"{node.lineno}: {node.func.attr}" for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in writers]


def test_the_store_writers_are_found_from_the_store_itself() -> None:
    writers = _store_writers()
    assert {"create_job", "transition", "update_job", "set_node", "add_event", "add_batch"} <= writers
    assert not writers & {"job", "jobs", "nodes", "events", "metrics", "samples", "running_summary", "run_dir"}
    assert _writes("def f(store):\n    store.add_event('j', 'k', 'm')\n    store.job('j')\n", writers) == ["2: add_event"]


def test_views_import_no_writer() -> None:
    """views/ only read: no call of a store method that writes, and no import of run/ (the layers forbid it), where
    the writers live."""
    writers = _store_writers()
    found = {str(path.relative_to(PACKAGE)): calls for path in (PACKAGE / "views").glob("*.py")
             if (calls := _writes(path.read_text(encoding="utf-8"), writers))}
    assert found == {}
    assert not {dep for path in (PACKAGE / "views").glob("*.py") for dep in _imports(path, typing_too=True)
                if dep.startswith("launcher.run")}


def test_a_modules_main_block_is_its_last_statement() -> None:
    """`python -m` runs a module's ``if __name__ == "__main__":`` where it stands: what is defined after it does not
    exist yet for the code it calls (the detached supervisor once failed so)."""
    late = [str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py")
            if any("__main__" in ast.unparse(node.test) for node in ast.parse(path.read_text(encoding="utf-8")).body[:-1]
                   if isinstance(node, ast.If))]
    assert late == []


def test_mypy_reports_an_import_of_a_launcher_module_that_does_not_exist(tmp_path: Path) -> None:
    """Missing imports are forgiven only for untyped third-party modules: a launcher module moved or misspelt
    is an error of `make test`'s type check, not a silent ``Any``."""
    wrong = tmp_path / "wrong.py"
    wrong.write_text("from launcher.backends.nosuch import thing\nimport pynvml\n", encoding="utf-8")
    result = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
                             "--cache-dir", str(tmp_path / "cache"), str(wrong)],
                            cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert result.returncode == 1, result.stdout + result.stderr
    assert [line.split(": error: ")[1] for line in result.stdout.splitlines() if ": error: " in line] == [
        'Cannot find implementation or library stub for module named "launcher.backends.nosuch"  [import-not-found]']
