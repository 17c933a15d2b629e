"""Every ``HOROVOD_*`` environment variable Horovod documents, and what hvdlite does with it.

One table (:data:`VARIABLES`), so that no Horovod variable is silently ignored: at
``hvd.init()`` rank 0 warns once per process (:class:`HorovodVariableWarning`) for
each variable that is set and that hvdlite does not honour with that value, saying why
and what to use instead; a ``HOROVOD_*`` name that is in no table at all is reported
too (a typo, or a variable of a Horovod feature hvdlite does not know).

Why rank 0 only: the launchers (``hvdlite-run``, ``mpirun -x``, Slurm) hand every rank
the same environment, so one copy of each warning says everything; a copy per rank
would bury it.

The names come from Horovod 0.28.1's documentation (installation, Tensor Fusion,
Timeline, Autotune, MPI, GPU, oneCCL, XLA, process sets, elastic pages), the variables
``horovodrun`` sets for its options, and the knobs its core reads.

Statuses:

* ``HONOURED``: hvdlite reads it with Horovod's meaning (``where`` says which part).
* ``IGNORED``: it has no effect in hvdlite, by design; the note says why and what to
  use instead.
* ``NOT_YET``: it belongs to a feature hvdlite does not have (no entry has this status:
  every documented feature is in).
* ``BUILD``: read by Horovod's installer only. Horovod itself ignores them at run time,
  and so does hvdlite (its build needs MPI alone); no warning at ``hvd.init()``.

An entry may be honoured for some values only (``honoured_if``): ``HOROVOD_CPU_OPERATIONS=MPI``
is what hvdlite does, ``=CCL`` is not.

At import this module loads nothing else of hvdlite or of any framework, so that
``setup.py`` may load it on its own (it reads only the table); :func:`unhonoured` also
reads :mod:`hvdlite.common.variables`, hvdlite's own table, which imports nothing.
"""
from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Callable, Mapping

__all__ = ["HONOURED", "IGNORED", "NOT_YET", "BUILD", "Variable", "VARIABLES",
           "HorovodVariableWarning", "unhonoured", "warn_unhonoured", "ENGINE_VALUES", "BadValue",
           "bad_engine_values"]

HONOURED = "honoured"
IGNORED = "ignored"
NOT_YET = "not yet"
BUILD = "build"


class HorovodVariableWarning(UserWarning):
    """A ``HOROVOD_*`` environment variable is set that hvdlite does not honour."""


def _truthy(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on")


def _falsy(value: str) -> bool:
    return value.strip().lower() in ("", "0", "false", "no", "off")


@dataclasses.dataclass(frozen=True)
class Variable:
    """One Horovod variable. ``status`` holds for every value unless ``honoured_if``
    says that this value is honoured after all; ``note`` says why and what to use
    (for honoured ones: what hvdlite does with it); ``where`` names the part of hvdlite
    that reads an honoured variable."""

    name: str
    status: str
    note: str
    honoured_if: Callable[[str], bool] | None = None
    where: str = ""

    def honours(self, value: str) -> bool:
        if self.status == HONOURED:
            return True
        return self.honoured_if is not None and self.honoured_if(value)


def _core(name: str, note: str = "") -> Variable:
    return Variable(name, HONOURED, note or "read by the engine at hvd.init()", where="core")


_NO_GLOO = "hvdlite runs on MPI only (there is no Gloo controller)"
_NO_CCL = "hvdlite has no oneCCL backend: host-memory collectives run on MPI"
_BUILD_NOTE = ("read by Horovod's installer only; hvdlite's build needs MPI alone "
               "(NCCL and the CUDA runtime are found at run time: HVDLITE_NCCL_LIBRARY, "
               "HVDLITE_CUDART_LIBRARY)")

VARIABLES: tuple[Variable, ...] = (
    # Tensor Fusion, response cache, timeline, stall check, logging: the engine reads them.
    _core("HOROVOD_FUSION_THRESHOLD"),
    _core("HOROVOD_CYCLE_TIME"),
    _core("HOROVOD_CACHE_CAPACITY"),
    _core("HOROVOD_TIMELINE", "a file for rank 0's timeline, or DYNAMIC: nothing until "
          "hvd.start_timeline()"),
    _core("HOROVOD_TIMELINE_MARK_CYCLES"),
    _core("HOROVOD_STALL_CHECK_DISABLE"),
    _core("HOROVOD_STALL_CHECK_TIME_SECONDS"),
    _core("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"),
    _core("HOROVOD_LOG_LEVEL"),
    Variable("HOROVOD_LOG_HIDE_TIME", IGNORED,
             "hvdlite's log lines carry no timestamp; hvdlite-run -prefix-timestamp stamps "
             "every line of output instead", honoured_if=_truthy),
    # Collective algorithms and placement.
    _core("HOROVOD_HIERARCHICAL_ALLREDUCE"),
    _core("HOROVOD_HIERARCHICAL_ALLGATHER"),
    Variable("HOROVOD_TORUS_ALLREDUCE", IGNORED,
             "hvdlite's two-level allreduce already runs as a torus (reduce-scatter inside "
             "each host, allreduce across, allgather inside); HOROVOD_HIERARCHICAL_ALLREDUCE=1 "
             "forces it, HVDLITE_HIERARCHICAL_ALGORITHM chooses the schedule",
             honoured_if=_falsy),
    _core("HOROVOD_GPU_OPERATIONS", "NCCL or MPI, read at run time (a build option in Horovod)"),
    _core("HOROVOD_GPU_ALLREDUCE", "NCCL or MPI, read at run time (a build option in Horovod)"),
    _core("HOROVOD_GPU_ALLGATHER", "NCCL or MPI, read at run time (a build option in Horovod)"),
    _core("HOROVOD_GPU_BROADCAST", "NCCL or MPI, read at run time (a build option in Horovod)"),
    _core("HOROVOD_GPU_ALLTOALL", "NCCL or MPI, read at run time (a build option in Horovod)"),
    _core("HOROVOD_GPU_REDUCESCATTER", "NCCL or MPI, read at run time (a build option in Horovod)"),
    Variable("HOROVOD_CPU_OPERATIONS", IGNORED,
             "hvdlite's host-memory collectives run on MPI only (no Gloo, no oneCCL)",
             honoured_if=lambda v: v.strip().upper() in ("", "MPI")),
    Variable("HOROVOD_CONTROLLER", IGNORED, _NO_GLOO + "; drop the variable",
             honoured_if=lambda v: v.strip().upper() in ("", "MPI")),
    Variable("HOROVOD_MPI_THREADS_DISABLE", IGNORED,
             "hvdlite's engine thread and the calling threads share MPI, so it always asks MPI "
             "for thread support (MPI_THREAD_MULTIPLE, at least MPI_THREAD_SERIALIZED)",
             honoured_if=_falsy),
    Variable("HOROVOD_NUM_NCCL_STREAMS", IGNORED,
             "hvdlite runs one NCCL stream of its own per GPU",
             honoured_if=lambda v: v.strip() == "1"),
    Variable("HOROVOD_BATCH_D2D_MEMCOPIES", IGNORED,
             "hvdlite builds no CUDA kernels of its own, so there is no batched copy kernel "
             "to switch; GPU tensors are copied into its fusion buffer by the CUDA runtime",
             honoured_if=_falsy),
    Variable("HOROVOD_DISABLE_GROUP_FUSION", IGNORED,
             "hvdlite fuses a group of grouped_allreduce with other tensors ready at the same "
             "time; there is no switch to keep groups apart", honoured_if=_falsy),
    Variable("HOROVOD_DISABLE_NVTX_RANGES", IGNORED,
             "hvdlite emits no NVTX ranges (hvdlite-run --timeline-filename records its "
             "activity instead)", honoured_if=_truthy),
    Variable("HOROVOD_ENABLE_XLA_OPS", IGNORED,
             "XLA cannot compile hvdlite's TensorFlow collectives (its own graph ops, or "
             "tf.py_function where those cannot be built): keep hvdlite calls out of "
             "jit_compile=True functions",
             honoured_if=_falsy),
    Variable("HOROVOD_ENABLE_ASYNC_COMPLETION", IGNORED,
             "hvdlite's TensorFlow ops have no XLA form, which this switch is for",
             honoured_if=_falsy),
    Variable("HOROVOD_CCL_CACHE", IGNORED, _NO_CCL, honoured_if=_falsy),
    Variable("HOROVOD_CCL_BGT_AFFINITY", IGNORED,
             _NO_CCL + "; use HOROVOD_THREAD_AFFINITY, Horovod's name for the same"),
    Variable("HOROVOD_MLSL_BGT_AFFINITY", IGNORED,
             "hvdlite has no MLSL backend; use HOROVOD_THREAD_AFFINITY, Horovod's later name "
             "for the same"),
    Variable("HOROVOD_GLOO_TIMEOUT_SECONDS", IGNORED, _NO_GLOO),
    Variable("HOROVOD_GLOO_IFACE", IGNORED,
             _NO_GLOO + "; choose MPI's interfaces with hvdlite-run --network-interface "
             "(NCCL's with NCCL_SOCKET_IFNAME)"),
    # Autotuning (rank 0's settings apply; docs/autotune.md).
    _core("HOROVOD_AUTOTUNE", "1: rank 0 searches the fusion threshold, cycle time, response "
          "cache and hierarchical allreduce while training runs, then keeps the best"),
    _core("HOROVOD_AUTOTUNE_LOG", "a CSV file rank 0 writes, one line per sample"),
    _core("HOROVOD_AUTOTUNE_WARMUP_SAMPLES"),
    _core("HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE"),
    _core("HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", "the number of samples the search may score"),
    Variable("HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", IGNORED,
             "hvdlite's autotuner searches one setting at a time and compares its best with the "
             "defaults by measuring both again; it fits no Gaussian process, so there is no "
             "noise to set"),
    Variable("HOROVOD_ADASUM_MPI_CHUNK_SIZE", IGNORED,
             "hvdlite's Adasum sends each tensor's halves whole (docs/adasum.md); there is no "
             "chunk size to set"),
    Variable("HOROVOD_DYNAMIC_PROCESS_SETS", HONOURED,
             "allows hvd.add_process_set / hvd.remove_process_set after init", where="front ends"),
    _core("HOROVOD_THREAD_AFFINITY", "a core per local rank for its background thread"),
    # The launcher's.
    Variable("HOROVOD_ELASTIC", HONOURED, "set by hvdlite-run for an elastic job's workers",
             where="launcher"),
    Variable("HOROVOD_ELASTIC_TIMEOUT", HONOURED,
             "default of hvdlite-run --elastic-timeout", where="launcher"),
    Variable("HOROVOD_ELASTIC_START_TIMEOUT", HONOURED,
             "the elastic documentation's name of HOROVOD_ELASTIC_TIMEOUT, which wins when "
             "both are set", where="launcher"),
    # Set for each worker by Horovod's launcher (its Gloo and elastic modes).
    *(Variable(name, HONOURED,
               "set for each worker by hvdlite-run, as Horovod's launcher sets it, and "
               "again by hvd.init() and after each elastic reset from the job's real "
               "layout; the ranks come from MPI, so a value set by hand is replaced",
               where="launcher")
      for name in ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE",
                   "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE")),
    Variable("HOROVOD_SPARK_START_TIMEOUT", HONOURED,
             "seconds hvdlite.spark.run waits for all its Spark tasks to start, when "
             "start_timeout is not given (default 600)", where="integrations"),
    Variable("HOROVOD_HOSTNAME", HONOURED,
             "set for each worker by hvdlite-run: the host's name as the launch gave it "
             "(-H, the discovery script), else the machine's; hvd.init() sets it only "
             "where it is unset", where="launcher"),
    Variable("HOROVOD_START_TIMEOUT", IGNORED,
             "hvdlite-run runs no start-up checks (ssh probes, interface discovery) that could "
             "time out; mpirun reports an unreachable host itself"),
    # Build time only.
    *(Variable(name, BUILD, _BUILD_NOTE) for name in (
        "HOROVOD_WITH_TENSORFLOW", "HOROVOD_WITHOUT_TENSORFLOW", "HOROVOD_WITH_PYTORCH",
        "HOROVOD_WITHOUT_PYTORCH", "HOROVOD_WITH_MXNET", "HOROVOD_WITHOUT_MXNET",
        "HOROVOD_WITH_MPI", "HOROVOD_WITHOUT_MPI", "HOROVOD_WITH_GLOO", "HOROVOD_WITHOUT_GLOO",
        "HOROVOD_CUDA_HOME", "HOROVOD_CUDA_INCLUDE", "HOROVOD_CUDA_LIB", "HOROVOD_ROCM_HOME",
        "HOROVOD_NCCL_HOME", "HOROVOD_NCCL_INCLUDE", "HOROVOD_NCCL_LIB", "HOROVOD_NCCL_LINK",
        "HOROVOD_GPU", "HOROVOD_ALLOW_MIXED_GPU_IMPL", "HOROVOD_BUILD_ARCH_FLAGS",
        "HOROVOD_BUILD_CUDA_CC_LIST", "HOROVOD_DEBUG", "HOROVOD_CMAKE", "HOROVOD_MPICXX_SHOW",
    )),
)

_BY_NAME = {v.name: v for v in VARIABLES}


def unhonoured(environ: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """``(name, message)`` for every ``HOROVOD_*`` variable set in ``environ`` (default
    ``os.environ``) that hvdlite does not honour with its value, in name order.
    Build-time variables are left out (Horovod ignores them at run time too)."""
    env = os.environ if environ is None else environ
    found: list[tuple[str, str]] = []
    for name in sorted(k for k in env if k.startswith("HOROVOD_")):
        value = env[name]
        entry = _BY_NAME.get(name)
        if entry is None and name in _engine_horovod_names():
            continue  # an hvdlite engine setting, read under Horovod's prefix too
        if entry is None:
            found.append((name, f"{name} is not a variable hvdlite knows (nor one Horovod "
                                "documents): it has no effect; check its spelling"))
        elif entry.status == BUILD or entry.honours(value):
            continue
        elif entry.status == NOT_YET:
            found.append((name, f"{name}={value!s} is not honoured: not yet supported by "
                                f"hvdlite: {entry.note}"))
        else:
            found.append((name, f"{name}={value!s} is not honoured: {entry.note}"))
    return found


def _engine_horovod_names() -> frozenset[str]:
    """The ``HOROVOD_*`` spellings of hvdlite's own engine settings (the engine reads
    ``HVDLITE_<NAME>``, else ``HOROVOD_<NAME>``): set by hand, they take effect."""
    from hvdlite.common.variables import VARIABLES as HVDLITE_VARIABLES
    return frozenset(v.horovod_name for v in HVDLITE_VARIABLES if v.horovod_name)


_warned: set[str] = set()


def warn_unhonoured(rank: int, environ: Mapping[str, str] | None = None) -> list[str]:
    """On rank 0, warn once per process for each variable :func:`unhonoured` finds;
    returns the names warned about now."""
    if rank != 0:
        return []
    names = []
    for name, message in unhonoured(environ):
        if name in _warned:
            continue
        _warned.add(name)
        names.append(name)
        warnings.warn(message, HorovodVariableWarning, stacklevel=3)
    return names


# ---------------------------------------------------------------- values the engine reads
#
# The engine reads each of these as HVDLITE_<SUFFIX>, else HOROVOD_<SUFFIX>
# (hvdlite/csrc/common/parameters.cc), and reports a value it cannot use ("ignoring ...; using
# the default", said by the world's rank 0 at hvd.init()). hvdlite-run checks them here
# first, by the same rules, says so once for the whole job and hands the ranks the
# value the engine would use (the default: the variable dropped), so that the engine
# has nothing to say. tests/test_horovod_env.py checks these rules against the engine's.

_C_SPACE = " \t\n\v\f\r"


def _c_int(text: str) -> int | None:
    """``text`` as the engine's ParseInt reads it (strtoll base 10, spaces around)."""
    body = text.lstrip(_C_SPACE).rstrip(_C_SPACE)
    if not body or body[0] in "+-" and (len(body) == 1 or not body[1:].isdigit()):
        return None
    digits = body[1:] if body[0] in "+-" else body
    if not digits.isascii() or not digits.isdigit():
        return None
    value = int(body)
    return value if -2**63 <= value < 2**63 else None


def _c_real(text: str) -> bool:
    """Whether strtod reads all of ``text`` (spaces around allowed) without overflow."""
    body = text.lstrip(_C_SPACE).rstrip(_C_SPACE)
    if not body or "_" in body or not body.isascii():
        return False
    try:
        value = float(body)
    except ValueError:
        try:
            value = float.fromhex(body)
        except ValueError:
            return False
    return not (value in (float("inf"), float("-inf")) and "inf" not in body.lower())


def _one_of(*choices: str) -> Callable[[str], bool]:
    return lambda v: v == "" or v.lower() in choices


def _integer(v: str) -> bool:
    return _c_int(v) is not None


def _log_level(v: str) -> bool:
    names = ("trace", "debug", "info", "warning", "error", "fatal", "warn")
    n = _c_int(v)
    return v.lower() in names or (n is not None and 0 <= n <= 5)


def _cores(v: str) -> bool:
    return all((n := _c_int(item)) is not None and 0 <= n < 2**20 for item in v.split(","))


#: suffix -> (whether the engine can use a value, what it expects)
ENGINE_VALUES: dict[str, tuple[Callable[[str], bool], str]] = {
    **{s: (_integer, "an integer") for s in (
        "FUSION_THRESHOLD", "CACHE_CAPACITY", "HOST_CHUNK_BYTES", "FUSION_DIRECT_BYTES",
        "RING_MIN_SEGMENT_BYTES", "SPIN_MICROSECONDS", "HIERARCHICAL_CHUNK_BYTES",
        "AUTOTUNE_WARMUP_SAMPLES", "AUTOTUNE_STEPS_PER_SAMPLE", "AUTOTUNE_BAYES_OPT_MAX_SAMPLES")},
    **{s: (_c_real, "a number") for s in (
        "CYCLE_TIME", "STALL_CHECK_TIME_SECONDS", "STALL_SHUTDOWN_TIME_SECONDS")},
    "LOG_LEVEL": (_log_level, "trace, debug, info, warning, error, fatal or 0-5"),
    "THREAD_AFFINITY": (_cores, "core numbers separated by commas, one per local rank"),
    **{s: (_one_of("nccl", "mpi"), "NCCL or MPI (hvdlite has no other GPU backend)") for s in (
        "GPU_OPERATIONS", "GPU_ALLREDUCE", "GPU_ALLGATHER", "GPU_BROADCAST", "GPU_ALLTOALL",
        "GPU_REDUCESCATTER")},
    "HIERARCHICAL_ALGORITHM": (_one_of("torus", "leader"), "torus or leader"),
    "HIERARCHICAL_CROSS": (_one_of("mpi", "nccl"), "mpi or nccl"),
}
#: The engine's largest response cache (kMaxCacheCapacity in hvdlite/csrc/common/parameters.h).
MAX_CACHE_CAPACITY = 65536


@dataclasses.dataclass(frozen=True)
class BadValue:
    """A variable the engine would report on every rank: ``message`` says what it does
    instead; ``replace`` maps each variable to its new value (None: removed), giving the
    ranks what the engine would use."""

    name: str
    message: str
    replace: dict[str, str | None]


def bad_engine_values(environ: Mapping[str, str] | None = None) -> list[BadValue]:
    """The values of :data:`ENGINE_VALUES` in ``environ`` (default ``os.environ``) that
    the engine cannot use, in suffix order; each is dropped under both its names, since
    the engine then takes its default whatever the other name says."""
    env = os.environ if environ is None else environ
    found: list[BadValue] = []
    for suffix in sorted(ENGINE_VALUES):
        names = (f"HVDLITE_{suffix}", f"HOROVOD_{suffix}")
        name = next((n for n in names if n in env), None)
        if name is None:
            continue
        value = env[name]
        ok, expected = ENGINE_VALUES[suffix]
        drop = {n: None for n in names if n in env}
        if not ok(value):
            found.append(BadValue(name, f"ignoring {name}={value!r}: expected {expected}; "
                                        "every rank uses the default", drop))
        elif suffix == "CACHE_CAPACITY" and (_c_int(value) or 0) > MAX_CACHE_CAPACITY:
            found.append(BadValue(name, f"{name}={value} is above hvdlite's limit; every rank uses "
                                        f"{MAX_CACHE_CAPACITY} (each cycle carries two bits per entry)",
                                  {**drop, name: str(MAX_CACHE_CAPACITY)}))
    return found
