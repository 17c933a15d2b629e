"""hvdlite's TensorFlow ops: built on first use against the installed TensorFlow, cached,
and loaded with ``tf.load_op_library``.

Installing hvdlite compiles nothing against TensorFlow (so a user's TensorFlow can be
upgraded or swapped without reinstalling hvdlite). The first time a process builds a
graph that holds an hvdlite collective, :func:`library` compiles
``kernels/hvdlite_tf_ops.cc`` with the C++ compiler (``$CXX``, else ``c++``/``g++``) and
``tf.sysconfig``'s flags, and keeps the shared library in a cache folder:
``$HVDLITE_CACHE_DIR``, else ``$XDG_CACHE_HOME/hvdlite``, else ``~/.cache/hvdlite``, under
``tf-ops/<key>/`` where the key is a hash of the sources, TensorFlow's version and build
flags and the compiler. Later processes load the cached library. The ranks of a job
build it once: an exclusive lock on a file in the cache folder makes the others wait
and then load it, and the library is written under a temporary name and renamed into
place, so that a reader never sees half a file (also where locks do not work, on some
network file systems).

The library does not link against hvdlite's core: it reaches the engine through the
core's table of C functions (``hvdlite/csrc/c_api.h``), whose address is handed to it
after loading.

Where it cannot be built (no compiler, no TensorFlow headers, a failed compile) or
``HVDLITE_TF_KERNEL=0`` is set, :func:`library` returns None and hvdlite falls back to
``tf.py_function`` collectives (see :mod:`hvdlite.tensorflow.mpi_ops`), with one warning
saying why. ``HVDLITE_TF_KERNEL`` and ``HVDLITE_CACHE_DIR`` are hvdlite additions.
"""
from __future__ import annotations

import ctypes
import fcntl
import hashlib
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import threading
import time
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tensorflow as tf

_HERE = Path(__file__).resolve().parent
SOURCE = _HERE / "kernels" / "hvdlite_tf_ops.cc"
C_API_HEADER = _HERE.parent / "csrc" / "c_api.h"
LIBRARY_NAME = "hvdlite_tf_ops.so"
BUILD_TIMEOUT_S = 900


class KernelUnavailable(RuntimeError):
    """hvdlite's TensorFlow ops cannot be built or loaded here (the message says why)."""


@dataclass
class KernelLibrary:
    """The loaded ops: ``ops`` is the module ``tf.load_op_library`` returned (functions
    ``hvdlite_collectives``, ``hvdlite_submit``, ``hvdlite_wait``), ``cdll`` the same library
    through ctypes. ``built`` tells whether this process compiled it (else it came from
    the cache), ``compile_seconds`` how long that took."""
    ops: Any
    cdll: Any
    path: Path
    built: bool
    compile_seconds: float


_lock = threading.Lock()
_library: KernelLibrary | None = None
_unavailable: str | None = None  # why not, once decided


def enabled_by_environment() -> bool:
    """False when ``HVDLITE_TF_KERNEL`` turns the ops off (0, false, no, off)."""
    return os.environ.get("HVDLITE_TF_KERNEL", "1").strip().lower() not in ("0", "false", "no", "off")


def library() -> KernelLibrary | None:
    """The ops, built or loaded on the first call; None (after one warning) where they
    cannot be, or while ``HVDLITE_TF_KERNEL=0`` (read each time a graph is traced)."""
    global _library, _unavailable
    if not enabled_by_environment():
        return None
    if _library is not None:
        return _library
    if _unavailable is not None:
        return None
    with _lock:
        if _library is None and _unavailable is None:
            try:
                _library = _load_or_build()
            except KernelUnavailable as exc:
                _unavailable = str(exc)
                warnings.warn(
                    f"hvdlite: its TensorFlow ops are not available ({exc}). Collectives inside "
                    "graphs fall back to tf.py_function ops, which block a TensorFlow thread "
                    "each: a tf.compat.v1.Session graph with several independent collectives "
                    "can deadlock, and a failed collective inside a graph raises "
                    "tf.errors.UnknownError.", RuntimeWarning, stacklevel=4)
    return _library


def unavailable_reason() -> str | None:
    """Why :func:`library` returned None, once it has (None while it has not)."""
    return _unavailable


def cache_root() -> Path:
    """The folder hvdlite caches built libraries in (see the module's docstring)."""
    if os.environ.get("HVDLITE_CACHE_DIR"):
        return Path(os.environ["HVDLITE_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hvdlite"


def find_compiler() -> str:
    """The C++ compiler: ``$CXX`` (a command, maybe with arguments), else ``c++`` or ``g++``."""
    cxx = os.environ.get("CXX")
    if cxx:
        first = shlex.split(cxx)[0] if cxx.strip() else ""
        if first and (shutil.which(first) or os.path.isfile(first)):
            return cxx
        raise KernelUnavailable(f"the C++ compiler CXX={cxx!r} was not found")
    for name in ("c++", "g++"):
        found = shutil.which(name)
        if found:
            return found
    raise KernelUnavailable("no C++ compiler found (install g++, or point CXX at one)")


def _compiler_identity(cxx: str) -> str:
    try:
        out = subprocess.run([*shlex.split(cxx), "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        raise KernelUnavailable(f"the C++ compiler {cxx!r} does not run ({exc})") from None
    first = (out.stdout or out.stderr).strip().splitlines()
    return first[0] if first else cxx


def _build_inputs() -> tuple[str, list[str], list[str], str]:
    """The compiler, TensorFlow's compile and link flags, and the cache key."""
    cxx = find_compiler()
    compile_flags = list(tf.sysconfig.get_compile_flags())
    link_flags = list(tf.sysconfig.get_link_flags())
    include = tf.sysconfig.get_include()
    if not (Path(include) / "tensorflow" / "core" / "framework" / "op_kernel.h").exists():
        raise KernelUnavailable(f"TensorFlow's C++ headers are missing (looked in {include})")
    if not SOURCE.exists() or not C_API_HEADER.exists():
        raise KernelUnavailable(f"hvdlite's kernel sources are missing ({SOURCE}, {C_API_HEADER})")
    h = hashlib.sha256()
    for part in (SOURCE.read_bytes(), C_API_HEADER.read_bytes(), tf.version.VERSION.encode(),
                 tf.version.GIT_VERSION.encode(), " ".join(compile_flags).encode(),
                 " ".join(link_flags).encode(), _compiler_identity(cxx).encode(),
                 platform.machine().encode(), sys.implementation.cache_tag.encode()):
        h.update(part)
        h.update(b"\0")
    return cxx, compile_flags, link_flags, h.hexdigest()[:20]


def _compile(cxx: str, compile_flags: list[str], link_flags: list[str], target: Path) -> float:
    """Compile the library to `target` (under a temporary name first); returns seconds."""
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    cmd = [*shlex.split(cxx), "-std=c++17", "-O2", "-shared", "-fPIC", "-fvisibility=hidden",
           "-Wno-deprecated-declarations", f"-I{C_API_HEADER.parent}", *compile_flags,
           str(SOURCE), "-o", str(tmp), *link_flags]
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        tmp.unlink(missing_ok=True)
        raise KernelUnavailable(f"compiling {SOURCE.name} took more than {BUILD_TIMEOUT_S} s") from None
    except OSError as exc:
        raise KernelUnavailable(f"the C++ compiler did not run ({exc})") from None
    seconds = time.monotonic() - start
    if proc.returncode != 0 or not tmp.exists():
        tmp.unlink(missing_ok=True)
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        raise KernelUnavailable(f"compiling {SOURCE.name} failed ({shlex.join(cmd)}):\n{tail}")
    os.replace(tmp, target)  # atomic: other processes see the whole file or none
    return seconds


def _remove_stale_temporaries(folder: Path) -> None:
    """Delete what builds that were killed left behind (older than a build may take)."""
    now = time.time()
    for p in folder.glob(f".{LIBRARY_NAME}.*.tmp"):
        try:
            if now - p.stat().st_mtime > BUILD_TIMEOUT_S:
                p.unlink()
        except OSError:
            pass


def _load_or_build() -> KernelLibrary:
    cxx, compile_flags, link_flags, key = _build_inputs()
    folder = cache_root() / "tf-ops" / key
    target = folder / LIBRARY_NAME
    built, seconds = False, 0.0
    if not target.exists():
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise KernelUnavailable(f"cannot create the cache folder {folder} ({exc}); "
                                    "set HVDLITE_CACHE_DIR to a writable folder") from None
        with open(folder / "build.lock", "a+") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX)  # another rank may be building it
            except OSError:
                pass  # no locks here: each builds, the rename keeps the file whole
            if not target.exists():
                _remove_stale_temporaries(folder)
                seconds = _compile(cxx, compile_flags, link_flags, target)
                built = True
                info = {"tensorflow": tf.version.VERSION, "compiler": cxx,
                        "compile_seconds": round(seconds, 2), "built_by_pid": os.getpid(),
                        "built_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
                (folder / "build.json").write_text(json.dumps(info, indent=1) + "\n")
    return _load(target, built, seconds)


def _load(path: Path, built: bool, seconds: float) -> KernelLibrary:
    from hvdlite.common import basics
    try:
        ops = tf.load_op_library(str(path))
        cdll = ctypes.CDLL(str(path))  # the same loaded library, for its C entry points
    except Exception as exc:  # noqa: BLE001 - a stale or foreign file: say which
        raise KernelUnavailable(f"loading {path} failed ({exc}); delete that folder to rebuild") from None
    cdll.hvdlite_tf_set_core_api.argtypes = [ctypes.c_void_p]
    cdll.hvdlite_tf_set_core_api.restype = ctypes.c_int
    cdll.hvdlite_tf_take_submit_trace.argtypes = [ctypes.c_char_p, ctypes.c_int64]
    cdll.hvdlite_tf_take_submit_trace.restype = ctypes.c_int64
    cdll.hvdlite_tf_trace_submits.argtypes = [ctypes.c_int]
    if cdll.hvdlite_tf_set_core_api(ctypes.c_void_p(basics._load_core().c_api_address())) != 1:
        raise KernelUnavailable(f"{path} was built for another version of hvdlite's engine interface")
    return KernelLibrary(ops=ops, cdll=cdll, path=path, built=built, compile_seconds=seconds)


def trace_submits(on: bool) -> None:
    """Tests: record when each gradient submit op runs (see :func:`take_submit_trace`)."""
    lib = library()
    if lib is not None:
        lib.cdll.hvdlite_tf_trace_submits(1 if on else 0)


def take_submit_trace() -> list[tuple[int, list[str]]]:
    """Tests: the submit ops run since the last call, as (``time.monotonic_ns()`` when
    it ran, its request names), oldest first."""
    lib = library()
    if lib is None:
        return []
    size = lib.cdll.hvdlite_tf_take_submit_trace(None, 0)
    buf = ctypes.create_string_buffer(size + 1)
    lib.cdll.hvdlite_tf_take_submit_trace(buf, size + 1)
    events = []
    for line in buf.value.decode().splitlines():
        ns, _, names = line.partition(" ")
        events.append((int(ns), names.split(",") if names else []))
    return events
