"""hvdlite's C++ unit layer: the engine's MPI-free parts, tested in one process.

The tests in ``tests/unit/*.cc`` are compiled with the C++ compiler Python's build tools
use (``$CXX``, else sysconfig's ``CXX``, else ``c++``/``g++``/``clang++``) and linked with
the engine sources they need: for every header of ``hvdlite/csrc`` a test includes,
directly or through other headers, the ``.cc`` file beside it, and so on for what those
include. There is no MPI include path and no MPI library: a part that needed MPI would
not build here. Objects and the binary are kept in ``build/unit/`` and rebuilt only when
a source or header they were built from changes (its modification time), so a rerun
takes seconds.

Each C++ test (``TEST(name)`` in ``tests/unit/*.cc``, see ``check.h``) is one pytest case
named after it; ``build/unit/unit_tests NAME`` runs one by hand.
"""
from __future__ import annotations

import concurrent.futures
import fcntl
import json
import os
import shlex
import shutil
import subprocess
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UNIT = Path(__file__).resolve().parent
BUILD = ROOT / "build" / "unit"
BINARY = BUILD / "unit_tests"

CSRC = "hvdlite/csrc"
FLAGS = ["-std=c++17", "-O1", "-pthread", "-I", CSRC, "-I", "tests/unit"]
RUN_TIMEOUT_S = 60


def find_compiler() -> list[str] | None:
    """The C++ compiler command (with any flags it comes with), or None."""
    candidates = [shlex.split(v) for v in (os.environ.get("CXX"), sysconfig.get_config_var("CXX")) if v]
    candidates += [["c++"], ["g++"], ["clang++"]]
    for command in candidates:
        if command and shutil.which(command[0]):
            return command
    return None


def unit_sources() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in UNIT.glob("*.cc"))


def parse_depfile(path: Path) -> list[str]:
    """The prerequisites a compiler's -MD file lists (paths relative to ROOT or absolute)."""
    text = path.read_text().replace("\\\n", " ")
    _, _, deps = text.partition(": ")
    words = deps.replace("\\ ", "\0").split()
    return [w.replace("\0", " ") for w in words]


def mtimes(paths: list[str]) -> dict[str, int] | None:
    """Modification times (ns) of `paths`, or None if one is gone."""
    out = {}
    for p in paths:
        try:
            out[p] = (ROOT / p).stat().st_mtime_ns
        except FileNotFoundError:
            return None
    return out


class BuildError(Exception):
    pass


def _current(stamp: Path, command: list[str]) -> bool:
    """Whether what `stamp` recorded was built by `command` from files unchanged since."""
    try:
        recorded = json.loads(stamp.read_text())
    except (OSError, ValueError):
        return False
    inputs = recorded.get("inputs")
    return recorded.get("command") == command and bool(inputs) and mtimes(list(inputs)) == inputs


def _write_stamp(stamp: Path, command: list[str], inputs: list[str], started_ns: int) -> None:
    """Records the inputs' times, unless one changed while it was being built (then the
    next run builds again)."""
    times = mtimes(inputs)
    if times is None or any(t >= started_ns for t in times.values()):
        stamp.unlink(missing_ok=True)
        return
    tmp = stamp.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({"command": command, "inputs": times}))
    os.replace(tmp, stamp)


def _compile(cxx: list[str], source: str) -> Path:
    name = source.replace("/", "__").removesuffix(".cc")
    obj = BUILD / "obj" / f"{name}.o"
    dep = obj.with_suffix(".d")
    stamp = obj.with_suffix(".stamp")
    command = [*cxx, *FLAGS, "-c", source]  # what decides the object, without the output paths
    if obj.exists() and _current(stamp, command):
        return obj
    started = time.time_ns()
    tmp_obj = obj.with_suffix(f".o.tmp{os.getpid()}")
    tmp_dep = obj.with_suffix(f".d.tmp{os.getpid()}")
    proc = subprocess.run([*command, "-o", str(tmp_obj), "-MD", "-MF", str(tmp_dep)], cwd=ROOT,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        tmp_obj.unlink(missing_ok=True)
        tmp_dep.unlink(missing_ok=True)
        raise BuildError(f"{shlex.join(command)}\n{proc.stdout}{proc.stderr}")
    os.replace(tmp_obj, obj)
    os.replace(tmp_dep, dep)
    _write_stamp(stamp, command, [*parse_depfile(dep)], started)
    return obj


def engine_sources_of(depfile: Path) -> set[str]:
    """The engine's .cc files beside the hvdlite/csrc headers a compiled file included."""
    out = set()
    for d in parse_depfile(depfile):
        d = os.path.normpath(d)
        if d.startswith(CSRC + "/") and d.endswith(".h"):
            cc = d[:-2] + ".cc"
            if (ROOT / cc).exists():
                out.add(cc)
    return out


def build(cxx: list[str]) -> tuple[Path, list[str]]:
    """Compiles what changed (in parallel) and links the unit test binary; returns its
    path and the engine sources linked."""
    (BUILD / "obj").mkdir(parents=True, exist_ok=True)
    with open(BUILD / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another pytest building at once waits here
        objects: dict[str, Path] = {}
        pending = set(unit_sources())
        errors = []
        with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            while pending:  # the tests, then the engine sources they need, and theirs
                futures = {s: pool.submit(_compile, cxx, s) for s in sorted(pending)}
                pending = set()
                for source, f in futures.items():
                    try:
                        objects[source] = f.result()
                    except BuildError as e:
                        hint = " (it needs MPI?)" if "mpi.h" in str(e) else ""
                        errors.append(f"{source}{hint}: {e}")
                        continue
                    pending |= engine_sources_of(objects[source].with_suffix(".d")) - set(objects)
                pending -= set(futures)
        if errors:
            raise BuildError("\n".join(errors))
        inputs = [str(objects[s].relative_to(ROOT)) for s in sorted(objects)]
        engine = sorted(s for s in objects if s.startswith(CSRC + "/"))
        stamp = BUILD / "unit_tests.stamp"
        command = [*cxx, "-pthread", *inputs, "-o", str(BINARY.relative_to(ROOT))]
        if BINARY.exists() and _current(stamp, command):
            return BINARY, engine
        started = time.time_ns()
        tmp = BUILD / f"unit_tests.tmp{os.getpid()}"
        proc = subprocess.run([*command[:-1], str(tmp)], cwd=ROOT, capture_output=True, text=True)
        if proc.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise BuildError(f"{shlex.join(command)}\n{proc.stdout}{proc.stderr}")
        os.replace(tmp, BINARY)
        _write_stamp(stamp, command, inputs, started)
    return BINARY, engine


@dataclass
class Layer:
    binary: Path | None = None
    names: list[str] = field(default_factory=list)
    engine_sources: list[str] = field(default_factory=list)
    skip: str = ""
    error: str = ""


_layer: Layer | None = None


def layer() -> Layer:
    """The built binary and its test names, built once per pytest process."""
    global _layer
    if _layer is not None:
        return _layer
    cxx = find_compiler()
    if cxx is None:
        _layer = Layer(skip="no C++ compiler: set CXX, or install g++ or clang++")
        return _layer
    try:
        binary, engine = build(cxx)
        listed = subprocess.run([str(binary), "--list"], capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
                                check=True)
        _layer = Layer(binary=binary, names=listed.stdout.split(), engine_sources=engine)
    except (BuildError, subprocess.SubprocessError) as e:
        _layer = Layer(error=f"the C++ unit tests did not build:\n{e}")
    return _layer


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "unit_test" in metafunc.fixturenames:
        names = layer().names
        # Without a binary, one case that says why (skipped, or failed with the compiler's words).
        metafunc.parametrize("unit_test", names or ["build"])


def _require_binary() -> Path:
    state = layer()
    if state.skip:
        pytest.skip(state.skip)
    if state.error:
        pytest.fail(state.error, pytrace=False)
    assert state.binary is not None
    return state.binary


def test_cxx(unit_test: str) -> None:
    """One C++ test, run in its own process."""
    binary = _require_binary()
    proc = subprocess.run([str(binary), unit_test], capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    output = proc.stdout + proc.stderr
    if proc.returncode != 0 or f"PASS {unit_test}\n" not in proc.stdout:
        how = f"killed by signal {-proc.returncode}" if proc.returncode < 0 else f"exit {proc.returncode}"
        pytest.fail(f"{unit_test} failed ({how}):\n{output}", pytrace=False)


def test_layer_has_tests_and_unique_names() -> None:
    _require_binary()
    names = layer().names
    assert len(set(names)) == len(names), sorted(n for n in names if names.count(n) > 1)
    for part in ("coordinator_", "response_cache_", "cache_cycle_", "registry_", "autotune_", "kernels_",
                 "config_", "message_"):
        assert any(n.startswith(part) for n in names), f"no test of {part}"


def test_unknown_test_name_fails() -> None:
    binary = _require_binary()
    proc = subprocess.run([str(binary), "no_such_test"], capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 2
    assert "no test named 'no_such_test'" in proc.stderr


def test_engine_parts_include_no_mpi_header() -> None:
    """The parts under test built without MPI; their dependency lists prove no MPI header
    crept in through the compiler's default include paths either."""
    _require_binary()
    engine = layer().engine_sources
    for part in ("negotiation/coordinator.cc", "negotiation/cache_cycle.cc", "negotiation/response_cache.cc",
                 "negotiation/autotune.cc", "backends/registry.cc", "kernels/reduce.cc", "common/config.cc"):
        assert f"{CSRC}/{part}" in engine, engine
    for source in engine:
        dep = BUILD / "obj" / (source.replace("/", "__").removesuffix(".cc") + ".d")
        headers = [Path(d).name for d in parse_depfile(dep)]
        assert not [h for h in headers if h in ("mpi.h", "nccl.h", "cuda_runtime.h")], (source, headers)
