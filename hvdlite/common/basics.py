"""Process-level API: init/shutdown and who-am-I queries, shared by every front end."""
from __future__ import annotations

import atexit
import os
import signal
import sys
from typing import Any, Callable

from hvdlite.common import discovery, gpu_libraries, horovod_env, mpi_lib, naming
from hvdlite.common.exceptions import ElasticJobError, HvdliteError, NotInitializedError

_core_module: Any = None


def _load_core() -> Any:
    """Import the compiled engine, making sure the MPI library it links is found.

    Loading it only maps the libraries into the process; MPI starts at :func:`init`."""
    global _core_module
    if _core_module is None:
        mpi_lib.preload()
        # Imported here, not at the top: importing hvdlite (and so the launcher,
        # `hvdlite-run --check-build`) must work where the extension is not built.
        import hvdlite._core  # the pybind11 extension built from hvdlite/csrc
        _core_module = hvdlite._core
    return _core_module


def core() -> Any:
    """The engine module, checked to be initialized."""
    c = _load_core()
    if not c.is_initialized():
        forked = c.forked_reason()
        if forked:
            raise HvdliteError(forked)
        reason = c.shutdown_reason()
        if reason and c.stopped_by_failure():
            # As Horovod after an internal failure: HorovodInternalError, which elastic
            # training and scripts catch, rather than "not initialized".
            raise HvdliteError(f"hvdlite is shut down: {reason}; call hvd.init() to start again")
        if reason:
            raise NotInitializedError(f"hvdlite is shut down: {reason}; call hvd.init() to start again")
        raise NotInitializedError(_not_running())
    return c


_shut_down_here = False  # this process called shutdown() (and not init() since)


def _not_running() -> str:
    if _shut_down_here:
        return "hvdlite was shut down by this process (hvd.shutdown()); call hvd.init() to start again"
    return "hvdlite has not been initialized; call hvd.init() first"


def _world() -> Any:
    """The engine module for process-info queries. Unlike :func:`core`, this still
    answers after another rank shut the job down, until this process calls
    ``shutdown()`` itself (Horovod behaves the same way)."""
    c = _load_core()
    if not c.has_world():
        raise NotInitializedError(_not_running())
    return c


def core_or_none() -> Any:
    c = _core_module
    if c is None or not c.is_initialized():
        return None
    return c


# What modules above this one do when hvdlite's world starts (given init's
# `process_sets`) and when it changes or ends (shutdown, an elastic reset): the process
# sets' registry (hvdlite.common.process_sets) registers itself here.
_lifecycle_hooks: list[tuple[Callable[[Any, Any], None], Callable[[], None]]] = []
_init_again_hooks: list[Callable[[Any], None]] = []
# What the running world's init() was given, for hooks registered after it.
_init_arguments: tuple[Any, Any] | None = None


def add_lifecycle_hooks(after_init: Callable[[Any, Any], None], after_change: Callable[[], None],
                        init_again: Callable[[Any], None] | None = None) -> None:
    """Run `after_init(process_sets, comm)` after each successful ``init``,
    `after_change()` after a shutdown or a change of the world (:func:`world_changed`),
    and `init_again(process_sets)` when ``init`` is called while hvdlite runs.

    A module registering after ``init`` (one a front end imports on first use) gets
    `after_init` at once, with what ``init`` was given: ``hvd.init(process_sets="dynamic")``
    holds however late the process-set module is loaded."""
    _lifecycle_hooks.append((after_init, after_change))
    if init_again is not None:
        _init_again_hooks.append(init_again)
    if _init_arguments is not None and is_initialized():
        after_init(*_init_arguments)


def world_changed() -> None:
    """hvdlite's world ended or was replaced: tell the modules that keep state about it."""
    c = _core_module
    if c is not None and c.is_initialized():
        publish_rank_environment(c)
    for _, after_change in _lifecycle_hooks:
        after_change()


#: Horovod's per-worker variables that follow the world (Horovod's elastic workers
#: set them again at each reset); ``HOROVOD_HOSTNAME`` stays as the launcher set it.
RANK_VARIABLES: tuple[str, ...] = (
    "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE",
    "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE",
)


def publish_rank_environment(c: Any) -> None:
    """Set Horovod's per-worker variables from the running world, as Horovod's launcher
    sets them for a worker: scripts written for it read them. Called by ``init`` and
    whenever elastic training makes a new world; ``HOROVOD_HOSTNAME`` is set only
    where the launcher did not set it."""
    values = (c.rank(), c.size(), c.local_rank(), c.local_size(), c.cross_rank(), c.cross_size())
    for name, value in zip(RANK_VARIABLES, values):
        os.environ[name] = str(int(value))
    if "HOROVOD_HOSTNAME" not in os.environ:
        import socket
        os.environ["HOROVOD_HOSTNAME"] = socket.gethostname()


def _get_process_set_ids_and_ranks() -> dict[int, list[int]]:
    """Every registered process set's id and world ranks, the global set's (0) included:
    Horovod's internal helper of this name, which its tests call."""
    return {int(k): list(v) for k, v in core().process_sets().items()}


def init(comm: Any = None, process_sets: Any = None) -> None:
    """Start hvdlite in this process.

    ``comm`` may be an mpi4py communicator (hvdlite works on a duplicate of it) or a
    list of ranks of ``MPI_COMM_WORLD`` that form hvdlite's world; by default the whole
    of ``MPI_COMM_WORLD``. A communicator is kept as ``global_process_set.mpi_comm``.
    Calling ``init`` again while initialized starts nothing; it only looks up the
    ``process_sets`` it is given among those registered (as Horovod does); after
    ``shutdown()`` it starts the engine afresh.

    ``process_sets``: Horovod's static process sets, a list of
    :class:`~hvdlite.common.process_sets.ProcessSet` registered now on every rank alike,
    or ``"dynamic"`` to allow ``add_process_set``/``remove_process_set`` later (as
    ``HOROVOD_DYNAMIC_PROCESS_SETS=1`` does). Sets are numbered as in Horovod: those of
    each communicator first (every rank's communicator gives one set), then the rank
    lists in order. A set given twice, or equal to the global set, raises ``ValueError``
    on the ranks whose list holds the duplicate (the others are registered).
    """
    _check_not_a_child()
    c = _load_core()
    if c.is_initialized():
        for init_again in _init_again_hooks:
            init_again(process_sets)
        return
    comm_handle = 0
    ranks: list[int] = []
    if comm is not None:
        if isinstance(comm, (list, tuple)):
            ranks = [int(r) for r in comm]
        else:
            from mpi4py import MPI  # only needed when the user hands us a communicator
            comm_handle = int(MPI._handleof(comm))
    _tune_mpi_environment()
    naming.reset_auto_names()
    global _shut_down_here
    _shut_down_here = False
    c.init(comm_handle, ranks)  # a process not among `ranks` stays uninitialized
    if c.has_world():
        # Also where the engine has already stopped: a rank that finished first ends
        # the job's engines, possibly before this one gets here.
        publish_rank_environment(c)
    if c.is_initialized():
        os.environ[_OWNER_ENV] = _owner_mark(os.getpid())
        _end_job_on_uncaught_exceptions()
        # No HOROVOD_* variable goes silently unheeded (rank 0 says so, once).
        horovod_env.warn_unhonoured(c.rank())
        global _init_arguments
        _init_arguments = (process_sets, comm)
        for after_init, _ in _lifecycle_hooks:
            after_init(process_sets, comm)


# Set by init() to the initializing process's pid and launcher job, and inherited by
# every process it starts. A process of the same job that finds another pid here is a
# child of a rank (a multiprocessing worker, a subprocess): its MPI_Init would pose as
# that rank, and MPI crashes or hangs. A job launched from inside a rank is a new job.
_OWNER_ENV = "HVDLITE_INIT_PID"
_LAUNCHER_RANK_ENV = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK")


def _owner_mark(pid: int) -> str:
    return f"{pid}:{os.environ.get('PMIX_NAMESPACE', '')}"


def _check_not_a_child() -> None:
    """Refuse init() in a child of an initialized rank, before MPI can crash or hang."""
    mark = os.environ.get(_OWNER_ENV)
    if not mark or mark == _owner_mark(os.getpid()):
        return
    forked = _core_module.forked_reason() if _core_module is not None else ""
    if forked:
        raise HvdliteError(forked)
    owner, _, job = mark.partition(":")
    if not any(v in os.environ for v in _LAUNCHER_RANK_ENV) or job != os.environ.get("PMIX_NAMESPACE", ""):
        return  # no launcher (the parent ran alone, and so may this process), or a new job
    raise HvdliteError(
        f"hvd.init() was called in process {os.getpid()}, a child of process {owner}, which "
        f"already runs hvdlite as a rank of this job; a child cannot join its parent's job. "
        "multiprocessing's 'spawn' and 'forkserver' workers (a DataLoader's, for example) "
        "re-run the script's top level: put the training code under "
        "`if __name__ == '__main__':`")


_previous_excepthook: Any = None


def _end_job_on_uncaught_exceptions() -> None:
    """Make an exception nothing catches end this rank at once, so that the launcher
    ends the job (Open MPI kills the other ranks when one exits with an error).

    Without it the interpreter would go on to its exit handlers, and MPI_Finalize there
    waits for every other rank -- which are waiting in a collective for this one: the
    job would hang with the traceback printed and nothing else happening. Installed once,
    by ``init()``; only while hvdlite runs on more than one rank."""
    global _previous_excepthook
    if _previous_excepthook is not None:
        return
    _previous_excepthook = sys.excepthook

    def hook(exc_type: Any, exc: Any, tb: Any) -> None:
        _previous_excepthook(exc_type, exc, tb)
        c = _core_module
        if c is None or not c.has_world() or c.forked_reason() or c.size() < 2:
            return
        # ElasticJobError is raised on every rank to end the job: nobody is to go on.
        elastic = discovery.in_elastic_job() and not issubclass(exc_type, ElasticJobError)
        if elastic:
            # Open MPI's fault tolerance reports a process that died, not one that
            # exited with an error status: the survivors would wait for this rank for
            # ever. Leaving as a lost worker does lets them go on without it, as
            # Horovod's elastic driver does with a worker that failed.
            sys.stderr.write(f"hvdlite: rank {c.rank()} leaves the elastic job on the uncaught "
                             f"{exc_type.__name__} above; the other workers go on without it\n")
        else:
            sys.stderr.write(f"hvdlite: rank {c.rank()} exits on the uncaught {exc_type.__name__} "
                             "above without waiting for the other ranks; the launcher ends the job\n")
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - nothing more to do on the way out
                pass
        if elastic:
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(1)

    sys.excepthook = hook


def _tune_mpi_environment() -> None:
    """Ask Open MPI not to busy-poll: ranks usually share cores with compute here.

    Only fills in values the user has not set; read by MPI_Init, so it has an effect
    only when hvdlite is the one initializing MPI."""
    os.environ.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")


# This process's rank when it last called shutdown() on a working world (None if it
# did not): an elastic job's rank 0 may shut down before it exits.
_rank_when_shut_down: int | None = None


def rank_when_shut_down() -> int | None:
    """This process's rank in the world it last shut down itself, if it was working."""
    return _rank_when_shut_down


def shutdown() -> None:
    """Stop the background thread; outstanding operations fail with an error."""
    global _shut_down_here, _rank_when_shut_down
    c = _core_module
    if c is not None and c.has_world():  # also after another rank stopped the job
        _rank_when_shut_down = c.rank() if c.is_initialized() else None
        c.shutdown()
        _shut_down_here = True
        world_changed()


def is_initialized() -> bool:
    """True between ``hvd.init()`` and ``hvd.shutdown()`` in this process."""
    c = _core_module
    return bool(c is not None and c.is_initialized())


def rank() -> int:
    """This process's rank in hvdlite's world."""
    return _world().rank()


def size() -> int:
    """Number of processes in hvdlite's world."""
    return _world().size()


def local_rank() -> int:
    """Rank among the processes on this host (use it to pick a GPU)."""
    return _world().local_rank()


def local_size() -> int:
    """Number of processes on this host."""
    return _world().local_size()


def cross_rank() -> int:
    """Index of this host among the hosts (rank among processes with the same local rank)."""
    return _world().cross_rank()


def cross_size() -> int:
    """Number of hosts (processes with this local rank across hosts)."""
    return _world().cross_size()


def is_homogeneous() -> bool:
    """True if every host runs the same number of ranks."""
    return size() == local_size() * cross_size()


def mpi_threads_supported() -> bool:
    """True if MPI runs with MPI_THREAD_MULTIPLE, so user code may call MPI too."""
    return bool(core().mpi_threads_supported())


def mpi_enabled() -> bool:
    """Always True: hvdlite's collectives and control plane run on MPI."""
    return True


def mpi_built() -> bool:
    """hvdlite always carries its MPI backend."""
    return True


def gloo_enabled() -> bool:
    """Always False: hvdlite has no Gloo controller (Horovod's other launcher)."""
    return False


def gloo_built() -> bool:
    """Always False: hvdlite carries no Gloo backend."""
    return False


def nccl_built() -> int:
    """NCCL's version code (e.g. 22303 for 2.23.3) if hvdlite's NCCL backend can load NCCL
    in this process, else 0 -- Horovod's answer to "was it built with NCCL". hvdlite is
    built without NCCL and opens it at run time (see hvdlite.common.gpu_libraries); this
    opens it to find out."""
    info = _gpu_info()["nccl"]
    return int(info["version_code"]) if info["loaded"] else 0


def ddl_built() -> bool:
    """Always False: hvdlite has no IBM DDL backend."""
    return False


def ccl_built() -> bool:
    """Always False: hvdlite has no oneCCL backend (host memory goes through MPI)."""
    return False


def cuda_built() -> bool:
    """True if the CUDA runtime can be loaded in this process (hvdlite opens it at run
    time; it is never compiled in)."""
    return bool(_gpu_info()["cuda"]["loaded"])


def _gpu_info() -> dict[str, Any]:
    return gpu_libraries.describe(_load_core())


def rocm_built() -> bool:
    """Always False: hvdlite has no ROCm backend (its GPU path is CUDA and NCCL)."""
    return False


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Start writing a Chrome/Perfetto trace to ``file_path`` (rank 0 writes it)."""
    core().start_timeline(str(file_path), bool(mark_cycles))


def stop_timeline() -> None:
    """Stop the timeline and close its file as valid JSON.

    Once hvdlite has shut down (here, or on every rank because rank 0 did) the timeline
    is closed already and this does nothing, as in Horovod: a rank that reaches its
    closing ``stop_timeline()`` after rank 0 has finished must not fail for it."""
    c = _load_core()
    if not c.is_initialized() and c.shutdown_reason() and not c.forked_reason():
        return
    core().stop_timeline()


def _finalize_at_exit() -> None:
    c = _core_module
    if c is not None:
        # Python flushes its streams only after the exit handlers, and finalize may end
        # the process (see FinalizeWatchdog in bindings.cc): flush what was printed now.
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (AttributeError, OSError, ValueError):
                pass
        c.finalize()


atexit.register(_finalize_at_exit)
