"""Horovod's ``horovod.common.util`` helpers, answered for hvdlite.

Scripts and test suites written for Horovod import a few helpers from this module:
the ``env`` context manager, version and list utilities, and the ``*_built()`` probes
that ask what the installed Horovod was compiled with. The probes here report hvdlite's
real build, as ``hvdlite-run --check-build`` does: the MPI backend is always part of
hvdlite's engine; Gloo, IBM DDL and oneCCL never are; NCCL is opened at run time, so
:func:`nccl_built` says whether this machine's NCCL can be loaded.

As in Horovod, the probes run in a child process (the caller loads neither the engine
nor NCCL) and return ``None`` when hvdlite's engine cannot be loaded at all (Horovod's
answer when none of its extensions loads). Their answers are cached for the process.

Not provided: Horovod's build and packaging internals (``check_extension``,
``get_ext_suffix``, ``get_extension_full_path``, ``check_installed_version``,
``gpu_available``) and its front ends' ``get_average_backwards_compatibility_fun``
(hvdlite's front ends apply the same rule themselves).
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import subprocess
import sys
from typing import Any, Callable, Iterator, Sequence, TypeVar

__all__ = [
    "env", "is_version_greater_equal_than", "split_list", "num_rank_is_power_2", "is_iterable",
    "extension_available", "mpi_built", "gloo_built", "nccl_built", "ddl_built", "ccl_built",
]

_T = TypeVar("_T")


def _cache(f: Callable[..., _T]) -> Callable[..., _T]:
    """Remember ``f``'s result for each combination of arguments (Horovod's ``_cache``:
    keyword arguments count by name and value, in any order)."""
    results: dict[Any, _T] = {}

    @functools.wraps(f)
    def cached(*args: Any, **kwargs: Any) -> _T:
        key = (args, frozenset(kwargs.items()))
        if key not in results:
            results[key] = f(*args, **kwargs)
        return results[key]

    return cached


@contextlib.contextmanager
def env(**kwargs: str | None) -> Iterator[None]:
    """Set environment variables for the duration of a ``with`` block.

    ``with env(HOROVOD_TIMELINE="/tmp/t.json", HOROVOD_CYCLE_TIME=None): ...`` sets the
    first variable and leaves the second alone (``None`` values are ignored). On leaving
    the block each variable given gets its earlier value back, or is removed if it was not
    set before. Values must be strings, as for ``os.environ``."""
    given = {name: value for name, value in kwargs.items() if value is not None}
    saved = {name: os.environ.get(name) for name in given}
    try:
        for name, value in given.items():
            os.environ[name] = value
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@_cache
def is_version_greater_equal_than(ver: str, target: str) -> bool:
    """True if version string ``ver`` is at least ``target`` (``"major.minor.patch"``),
    compared as PEP 440 versions (``"2.13.0+cpu" >= "2.1.0"``). ``ValueError`` for
    arguments that are not strings or a target of another form. Needs the ``packaging``
    package, as Horovod's does."""
    if not isinstance(ver, str) or not isinstance(target, str):
        raise ValueError(f"is_version_greater_equal_than takes two strings; got ver={ver!r} "
                         f"({type(ver).__name__}) and target={target!r} ({type(target).__name__})")
    if len(target.split(".")) != 3:
        raise ValueError(f"the target version must have the form major.minor.patch; got {target!r}")
    try:
        from packaging.version import Version
    except ImportError as exc:  # pragma: no cover - packaging comes with most environments
        raise ImportError("is_version_greater_equal_than needs the 'packaging' package "
                          "(pip install packaging)") from exc
    return Version(ver) >= Version(target)


def split_list(items: Sequence[_T], n: int) -> list[Sequence[_T]]:
    """``items`` cut into ``n`` consecutive chunks whose lengths differ by at most one,
    the longer ones first (``split_list([1, 2, 3, 4, 5], 2) == [[1, 2, 3], [4, 5]]``)."""
    base, extra = divmod(len(items), n)
    chunks = []
    start = 0
    for i in range(n):
        end = start + base + (1 if i < extra else 0)
        chunks.append(items[start:end])
        start = end
    return chunks


def num_rank_is_power_2(num_rank: int) -> bool:
    """True if ``num_rank`` is a power of two (1, 2, 4, ...): the sizes Adasum takes."""
    return num_rank > 0 and num_rank & (num_rank - 1) == 0


def is_iterable(x: Any) -> bool:
    """True if ``iter(x)`` works."""
    try:
        iter(x)
    except TypeError:
        return False
    return True


# Asked in a child process: loads hvdlite's engine (and with it the MPI library) and looks
# for NCCL the way the engine does when the first GPU tensor arrives.
_BUILD_PROBE = (
    "import json\n"
    "from hvdlite.common import basics, gpu_libraries\n"
    "info = gpu_libraries.describe(basics._load_core())\n"
    "nccl = info['nccl']\n"
    "print(json.dumps({'nccl': int(nccl['version_code']) if nccl['loaded'] else 0}))\n"
)


@functools.lru_cache(maxsize=None)
def _engine_build() -> dict[str, Any] | None:
    """What a child process finds of hvdlite's engine: ``{"nccl": code}``, or None if
    the engine does not load."""
    try:
        proc = subprocess.run([sys.executable, "-c", _BUILD_PROBE], capture_output=True, text=True,
                              timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None


def _built(feature: str, verbose: bool, answer: Callable[[dict[str, Any]], Any]) -> Any:
    if verbose:
        print(f"Checking whether hvdlite's engine was built with {feature}.")
    build = _engine_build()
    result = None if build is None else answer(build)
    if verbose:
        if build is None:
            print("hvdlite's engine could not be loaded.")
        else:
            print(f"hvdlite's engine {'was' if result else 'was NOT'} built with {feature}.")
    return result


def mpi_built(verbose: bool = False) -> bool | None:
    """True: MPI is hvdlite's backend and controller. None if hvdlite's engine cannot be
    loaded here (not built, or its MPI library missing)."""
    return _built("MPI", verbose, lambda build: True)


def gloo_built(verbose: bool = False) -> bool | None:
    """False: hvdlite has no Gloo controller (None if its engine cannot be loaded)."""
    return _built("Gloo", verbose, lambda build: False)


def nccl_built(verbose: bool = False) -> int | None:
    """NCCL's version code (e.g. 22303 for 2.23.3) if hvdlite can load NCCL on this
    machine, else 0; None if hvdlite's engine cannot be loaded. hvdlite is never compiled
    against NCCL: it opens the library when the first GPU tensor arrives, so this is
    what Horovod's answer means for a job here."""
    return _built("NCCL", verbose, lambda build: int(build["nccl"]))


def ddl_built(verbose: bool = False) -> bool | None:
    """False: hvdlite has no IBM DDL backend (None if its engine cannot be loaded)."""
    return _built("DDL", verbose, lambda build: False)


def ccl_built(verbose: bool = False) -> bool | None:
    """False: hvdlite has no oneCCL backend (None if its engine cannot be loaded)."""
    return _built("CCL", verbose, lambda build: False)


@_cache
def extension_available(ext_base_name: str, verbose: bool = False) -> bool:
    """True if hvdlite's front end ``hvdlite.<ext_base_name>`` (``torch``,
    ``tensorflow``, ...) imports, framework included; checked in a child process, as
    Horovod checks its ``horovod.<ext_base_name>`` extension. ``mxnet`` is never
    available: hvdlite has no MXNet front end."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", str(ext_base_name)):
        return False
    if verbose:
        print(f"Checking whether hvdlite.{ext_base_name} is available.")
    try:
        proc = subprocess.run([sys.executable, "-c", f"import hvdlite.{ext_base_name}"], capture_output=True,
                              text=True, timeout=300)
        available = proc.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        available = False
    if verbose:
        print(f"hvdlite.{ext_base_name} {'is' if available else 'is NOT'} available.")
    return available
