"""How hvdlite's modules import each other, and what importing them loads.

The modules of the package form a DAG: no two import each other, neither at the top
nor through an import moved into a function to dodge the circle. The layers import only
downwards: the framework-neutral core (``hvdlite.common``) imports neither an adapter nor
the launcher, the adapters import neither each other nor the launcher, and the launcher
imports no adapter. Importing ``hvdlite``
(and so the launcher) loads no compiled code; the front ends take the engine's codes
from the compiled core.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "hvdlite"

# Function-local imports that load something lazily on purpose (not to dodge a circle).
LAZY = {
    ("hvdlite", "hvdlite.mpi_ops"),                   # the NumPy collectives, on first use
    ("hvdlite.common.basics", "hvdlite._core"),       # the compiled engine
    ("hvdlite.common.mpi_lib", "hvdlite._build_info"),  # written by the build, if any
}


def _modules() -> dict[str, Path]:
    """Every module of the package, by name: Python files and compiled extensions."""
    mods = {}
    for path in [*PACKAGE.rglob("*.py"), *PACKAGE.rglob("*.so")]:
        parts = list(path.relative_to(REPO).parts)
        parts[-1] = parts[-1].split(".")[0]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def _imported(module: str, node: ast.AST, is_package: bool, mods: dict[str, Path]) -> list[str]:
    """The hvdlite modules an import statement imports (a name imported from a package
    counts as its submodule when there is one)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            pkg = module.split(".") if is_package else module.split(".")[:-1]
            pkg = pkg[:len(pkg) - node.level + 1]
            base = ".".join(pkg + ([base] if base else []))
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
    return [n for n in names if n == "hvdlite" or n.startswith("hvdlite.")]


def _import_graph() -> dict[str, set[str]]:
    """module -> the hvdlite modules it imports, at the top or inside functions (less
    the lazy imports above)."""
    mods = _modules()
    graph: dict[str, set[str]] = {}
    for module, path in mods.items():
        if path.suffix != ".py":
            continue
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for dep in _imported(module, node, path.name == "__init__.py", mods):
                    if dep != module and (module, dep) not in LAZY:
                        deps.add(dep)
        graph[module] = deps
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                return path[path.index(d):] + [d]
            if d not in state and (found := visit(d)) is not None:
                return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)) is not None:
            return found
    return None


def test_modules_import_each_other_without_circles() -> None:
    graph = _import_graph()
    assert "hvdlite.common.ops" in graph and "hvdlite.runner.cli" in graph
    cycle = _cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle)


# The layers of the package, and the ones each may never import (docs/architecture.md):
# the framework-neutral core knows no framework and no launcher, the adapters know
# neither each other nor the launcher, and the launcher loads no framework.
LAYERS = {
    "common": ("hvdlite.common", "hvdlite.mpi_ops"),
    "torch": ("hvdlite.torch",),
    "tensorflow": ("hvdlite.tensorflow",),
    "runner": ("hvdlite.runner",),
}
NEVER = {
    "common": {"torch", "tensorflow", "runner"},
    "torch": {"tensorflow", "runner"},
    "tensorflow": {"torch", "runner"},
    "runner": {"torch", "tensorflow"},
}


def _layer(module: str) -> str | None:
    for layer, prefixes in LAYERS.items():
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return layer
    return None


def _layer_violations(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for module, deps in sorted(graph.items()):
        here = _layer(module)
        for dep in sorted(deps):
            there = _layer(dep)
            if here is not None and there in NEVER[here]:
                found.append(f"{module} ({here}) imports {dep} ({there})")
    return found


def test_layers_import_only_downwards() -> None:
    assert _layer_violations(_import_graph()) == []


def test_the_layer_check_finds_a_violation() -> None:
    graph = {"hvdlite.common.x": {"hvdlite.runner.y"}, "hvdlite.torch.a": {"hvdlite.common.x"},
             "hvdlite.tensorflow.b": {"hvdlite.torch.a"}, "hvdlite.runner.y": {"hvdlite.common.x"}}
    assert _layer_violations(graph) == [
        "hvdlite.common.x (common) imports hvdlite.runner.y (runner)",
        "hvdlite.tensorflow.b (tensorflow) imports hvdlite.torch.a (torch)",
    ]


def test_the_cycle_check_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def _run(code: str) -> str:
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True,
                          text=True, timeout=240, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_importing_hvdlite_loads_no_compiled_code() -> None:
    out = _run("import sys, hvdlite\n"
               "print(sorted(m for m in sys.modules if m in ('hvdlite._core', 'hvdlite.mpi_ops')))\n"
               "hvdlite.allreduce\n"  # the NumPy collectives come on first use
               "import hvdlite.mpi_ops as ops\n"
               "assert tuple(ops.__all__) == hvdlite._NUMPY_OPS, 'hvdlite._NUMPY_OPS is out of date'\n"
               "assert all(getattr(hvdlite, n) is getattr(ops, n) for n in ops.__all__)\n"
               "assert set(ops.__all__) <= set(dir(hvdlite)) and set(ops.__all__) <= set(hvdlite.__all__)\n"
               "print('ok')\n")
    assert out.splitlines() == ["[]", "ok"]


def test_the_neutral_api_loads_no_launcher_code() -> None:
    """``hvdlite.run`` is the launcher's; importing hvdlite (or its neutral core, which
    Python reaches through the package) loads it only when it is used."""
    out = _run("import sys, hvdlite, hvdlite.common.basics\n"
               "print(sorted(m for m in sys.modules if m.startswith('hvdlite.runner')))\n"
               "from hvdlite.runner.function import run\n"
               "assert hvdlite.run is run and 'run' in dir(hvdlite)\n"
               "print('ok')\n")
    assert out.splitlines() == ["[]", "ok"]


@pytest.mark.parametrize("front_end", ["hvdlite", "hvdlite.torch", "hvdlite.tensorflow"])
def test_reduce_ops_come_from_the_core(front_end: str) -> None:
    framework = front_end.split(".")[-1]
    if framework != "hvdlite" and __import__("importlib").util.find_spec(framework) is None:
        pytest.skip(f"{framework} is not installed")
    out = _run(f"import {front_end} as hvd\n"
               "from hvdlite.common.basics import _load_core\n"
               "core = _load_core()\n"
               "for name, code in core.REDUCE_OPS.items():\n"
               "    assert getattr(hvd, name) == code, (name, getattr(hvd, name), code)\n"
               "from hvdlite.common import ops\n"
               "assert ops.DTYPES == core.DATA_TYPES and ops.CPU_DEVICE == core.CPU_DEVICE\n"
               "assert {ops.KIND_NAMES[c]: c for c in ops.KIND_NAMES} == core.REQUEST_TYPES\n"
               "print('ok')\n")
    assert out.strip().endswith("ok")
