"""The ``mpirun`` command line and environment for a :class:`~hvdlite.runner.config.LaunchConfig`.

Everything that decides the command is in :func:`build_mpirun_command`, a pure
function, so the exact command for given flags can be inspected (``--verbose`` prints
it) and tested without starting a process. Elastic jobs run under Open MPI's ULFM fault
tolerance (``--with-ft ulfm``, shared memory and TCP, both of which report a dead peer
within milliseconds), with every discovered host and its slots given to mpirun so that
later workers have somewhere to start. Each rank starts through a short shell prologue
(:func:`rank_prologue`) that sets the variables Horovod's launcher sets for a worker
(``HOROVOD_RANK``, ``HOROVOD_LOCAL_RANK``, ``HOROVOD_CROSS_RANK``, ...) and, unless the
user sets ``OMP_NUM_THREADS``, gives its thread pools its host's cores divided by the
ranks there. With Open MPI 5 the launcher writes the ranks' output
itself, as it comes (:func:`live_output`, :mod:`hvdlite.runner.output`).

This module must stay importable without hvdlite's compiled core.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence

from hvdlite.common import discovery, horovod_env
from hvdlite.runner.config import LaunchConfig
from hvdlite.runner.hosts import elastic_settings, env_seconds, given_hosts, is_local_host
from hvdlite.runner.mpirun import LaunchError

__all__ = [
    "FORWARD_NAMES",
    "FORWARD_PREFIXES",
    "LOG_LEVELS",
    "THREAD_VARIABLES",
    "build_mpirun_command",
    "has_option",
    "live_output",
    "rank_placement",
    "rank_prologue",
]

#: Prefixes of environment variables that are always forwarded to every rank.
FORWARD_PREFIXES: tuple[str, ...] = ("HVDLITE_", "HOROVOD_", "NCCL_")
#: Further environment variables forwarded to every rank when they are set.
FORWARD_NAMES: tuple[str, ...] = (
    "PATH",
    "LD_LIBRARY_PATH",
    "PYTHONPATH",
    "VIRTUAL_ENV",
    "OMPI_MCA_mpi_yield_when_idle",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "TF_NUM_INTRAOP_THREADS",
    "TF_NUM_INTEROP_THREADS",
)
#: The variables that size a rank's compute thread pools: OpenMP's (PyTorch's intra-op
#: pool; NumPy's OpenBLAS), Intel MKL's (PyTorch's BLAS on x86; MKL_NUM_THREADS wins
#: over OMP_NUM_THREADS there) and TensorFlow's intra-op and inter-op pools. Each
#: framework reads them once, when it loads. Unless the user sets OMP_NUM_THREADS,
#: every rank gets the cores of its host divided by the ranks there
#: (:func:`rank_prologue`).
THREAD_VARIABLES: tuple[str, ...] = (
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS",
)
#: Log levels understood by the core (Horovod's names).
LOG_LEVELS: tuple[str, ...] = ("TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL")

# hvdlite variable set by a flag -> the Horovod name of the same tunable.  When
# the user's environment also carries the Horovod name, it is overwritten with
# the flag's value so the flag wins whatever precedence the core applies.
_HOROVOD_ALIASES: dict[str, str] = {
    "HVDLITE_TIMELINE": "HOROVOD_TIMELINE",
    "HVDLITE_THREAD_AFFINITY": "HOROVOD_THREAD_AFFINITY",
    "HVDLITE_FUSION_THRESHOLD": "HOROVOD_FUSION_THRESHOLD",
    "HVDLITE_CYCLE_TIME": "HOROVOD_CYCLE_TIME",
    "HVDLITE_CACHE_CAPACITY": "HOROVOD_CACHE_CAPACITY",
    "HVDLITE_STALL_CHECK_TIME_SECONDS": "HOROVOD_STALL_CHECK_TIME_SECONDS",
    "HVDLITE_STALL_SHUTDOWN_TIME_SECONDS": "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS",
    "HVDLITE_STALL_CHECK_DISABLE": "HOROVOD_STALL_CHECK_DISABLE",
    "HVDLITE_TIMELINE_MARK_CYCLES": "HOROVOD_TIMELINE_MARK_CYCLES",
    "HVDLITE_LOG_LEVEL": "HOROVOD_LOG_LEVEL",
    "HVDLITE_HIERARCHICAL_ALLREDUCE": "HOROVOD_HIERARCHICAL_ALLREDUCE",
    "HVDLITE_HIERARCHICAL_ALLGATHER": "HOROVOD_HIERARCHICAL_ALLGATHER",
    "HVDLITE_AUTOTUNE": "HOROVOD_AUTOTUNE",
    "HVDLITE_AUTOTUNE_LOG": "HOROVOD_AUTOTUNE_LOG",
    "HVDLITE_AUTOTUNE_WARMUP_SAMPLES": "HOROVOD_AUTOTUNE_WARMUP_SAMPLES",
    "HVDLITE_AUTOTUNE_STEPS_PER_SAMPLE": "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE",
    "HVDLITE_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES",
}


def has_option(args: Sequence[str], *names: str) -> bool:
    """True if any of ``names`` (e.g. ``--map-by``) appears in ``args``."""
    for arg in args:
        head = arg.split("=", 1)[0]
        if head in names:
            return True
    return False



def _mca_chosen(args: Sequence[str], name: str) -> bool:
    """True if ``args`` set the MCA parameter ``name`` (``--mca NAME VALUE``)."""
    for flag, key in zip(args, args[1:]):
        if flag in ("--mca", "-mca", "--gmca", "-gmca") and key == name:
            return True
    return False


def build_mpirun_command(
    config: LaunchConfig,
    mpirun: str = "mpirun",
    environ: Mapping[str, str] | None = None,
    *,
    ompi_major: int | None = 5,
    is_root: bool | None = None,
    host_list: Sequence[tuple[str, int | None]] | None = None,
    status_file: str | None = None,
    keep: str | None = None,
    resume: str | None = None,
    notes: list[str] | None = None,
) -> tuple[list[str], dict[str, str]]:
    """Build the ``mpirun`` argv and the environment to run it with.

    Pure: starts no process.  ``environ`` defaults to ``os.environ`` and is not
    modified; the returned dict is the full environment for ``mpirun``.
    ``ompi_major`` selects option spellings (5: ``--map-by :OVERSUBSCRIBE``;
    older: ``--oversubscribe``).  ``is_root`` defaults to ``os.geteuid() == 0``.
    ``host_list`` is the parsed ``-H``/hostfile content when the caller already
    has it (otherwise it is parsed here).  Without ``-H`` or a hostfile, inside a
    Slurm allocation (``SLURM_JOB_NODELIST`` in ``environ``) the hosts are the
    allocation's nodes with ``SLURM_TASKS_PER_NODE`` slots each
    (:func:`hvdlite.runner.slurm.allocation_hosts`).

    Elastic mode (``config.elastic``): the settings are resolved by
    :func:`elastic_settings` and reach every worker as ``HVDLITE_ELASTIC_*``
    variables; mpirun runs with ``--with-ft ulfm`` over ``--mca pml ob1 --mca btl
    sm,tcp,self`` (a pml or btl chosen in ``--mpi-args`` is kept) and ``--host`` lists
    every host with its slots, which must add up to ``-np`` at least.  With a
    discovery script, ``host_list`` must be the hosts it printed (:func:`launch`
    runs it, this function does not).  ``status_file`` is where the last world's
    rank 0 writes ``finished`` (``HVDLITE_ELASTIC_STATUS_FILE``); ``keep`` names the
    files where the workers keep their last commit on every host
    (``HVDLITE_ELASTIC_KEEP``, with the launcher's live output only); ``resume``, when
    the job starts again from that commit, why (``HVDLITE_ELASTIC_RESUME``,
    ``joined=HOSTS`` or ``lost=HOSTS``).  Stale
    ``HVDLITE_ELASTIC*`` and ``HOROVOD_ELASTIC`` variables in ``environ`` are dropped
    in either mode.

    Each rank's command is started through :func:`rank_prologue`, which sets Horovod's
    per-worker variables and, unless ``OMP_NUM_THREADS`` is set (in ``environ``, or
    with ``-x`` in ``--mpi-args``), sizes its thread pools on its host. A value
    the engine cannot use (:func:`hvdlite.common.horovod_env.bad_engine_values`) is
    not passed on; the ranks get the engine's default. The lines ``hvdlite-run`` prints
    about both, once for the job, are appended to ``notes`` when that is a list.

    Raises :class:`LaunchError` for an inconsistent request (for instance more
    processes than the slots of a remote host list).
    """
    env: dict[str, str] = dict(os.environ if environ is None else environ)
    if is_root is None:
        is_root = hasattr(os, "geteuid") and os.geteuid() == 0
    if config.num_proc < 1:
        raise LaunchError(f"-np must be a positive integer, got {config.num_proc}")
    if not config.command:
        raise LaunchError("no command to launch")
    if config.hosts and config.hostfile:
        raise LaunchError("give either -H/--hosts or --hostfile, not both")

    user_args = list(config.mpi_args)
    argv: list[str] = [mpirun, "-np", str(config.num_proc)]

    # Hosts.
    from_slurm = False
    elastic: discovery.ElasticSettings | None = None
    if config.elastic:
        if config.host_discovery_script is not None:
            if host_list is None:
                raise LaunchError("elastic mode with a host discovery script: pass the hosts "
                                  "it printed as host_list (launch() runs the script)")
            elastic = elastic_settings(config, env)
            default = config.slots_per_host or 1
            elastic_hosts = [(h, default if s is None else s) for h, s in host_list]
            given = "hosts the discovery script printed"
        else:
            elastic = elastic_settings(config, env, host_list)
            elastic_hosts = list(elastic.hosts or [])
            given = "hosts given" if (config.hosts or config.hostfile) else "elastic hosts"
        if ompi_major is not None and ompi_major < 5:
            raise LaunchError(f"elastic mode needs Open MPI 5 or later (its ULFM fault "
                              f"tolerance, mpirun --with-ft ulfm); this mpirun is Open MPI "
                              f"{ompi_major}")
        total = sum(s for _, s in elastic_hosts)
        if config.num_proc > total:
            raise LaunchError(
                f"-np {config.num_proc} exceeds the {total} slots of the {given} "
                f"({discovery.format_hosts(elastic_hosts) or 'none'}); an elastic job starts "
                "only once -np slots are available: add hosts or slots, or lower -np")
        host_list = elastic_hosts
        argv += ["--host", discovery.format_hosts(elastic_hosts)]
    elif host_list is None:
        given, from_slurm = given_hosts(config, env)
        host_list = given or None
    if elastic is not None:
        pass  # --host is already there
    elif config.hosts or from_slurm:
        argv += ["--host", ",".join(
            h if s is None else f"{h}:{s}" for h, s in (host_list or [])
        )]
    elif config.hostfile:
        argv += ["--hostfile", os.path.abspath(config.hostfile)]

    # Oversubscription: always allowed for a launch on this machine alone (ranks
    # here usually outnumber cores and sleep rather than spin); for remote hosts
    # the slots given are respected.
    local_only = not host_list or all(is_local_host(h) for h, _ in host_list)
    user_oversubscribes = has_option(user_args, "--oversubscribe", "-oversubscribe") or any(
        "OVERSUBSCRIBE" in a.upper() for a in user_args
    )
    # Slots given (-H host:N, a hostfile's slots=N, Slurm's tasks) are a promise not to
    # run more ranks there, on this machine too: as with horovodrun (whose mpirun
    # refuses), more ranks than slots is an error unless oversubscription is asked for.
    # Without -H or a hostfile the ranks run here with as many slots as they need.
    if elastic is None and not user_oversubscribes and host_list:
        slots = [s for _, s in host_list]
        if all(s is not None for s in slots):
            total = sum(s for s in slots if s is not None)
            if config.num_proc > total:
                given = ("Slurm allocation (SLURM_TASKS_PER_NODE)" if from_slurm
                         else "hosts given")
                listed = ",".join(f"{h}:{s}" for h, s in host_list)
                hint = (f"-H {host_list[0][0]}:{config.num_proc}, " if len(host_list) == 1
                        and not from_slurm else "")
                raise LaunchError(
                    f"-np {config.num_proc} exceeds the {total} slot{'s' * (total != 1)} of "
                    f"the {given} ({listed}); add slots ({hint}a hostfile's slots=N), lower "
                    "-np, or let ranks share slots with --mpi-args=--oversubscribe"
                )
    if local_only and not user_oversubscribes:
        user_maps = has_option(user_args, "--map-by", "-map-by")
        if ompi_major is not None and ompi_major >= 5 and not user_maps:
            argv += ["--map-by", ":OVERSUBSCRIBE"]
        else:
            argv += ["--oversubscribe"]

    # Binding: ranks share cores with the engine's background thread and with
    # each other, so they must not be pinned one core each.
    if config.binding_args:
        argv += list(config.binding_args)
    elif not has_option(user_args, "--bind-to", "-bind-to"):
        argv += ["--bind-to", "none"]

    # horovodrun's transport and output options, spelled the way Horovod passes them on.
    ssh_args = []
    if config.ssh_port is not None:
        ssh_args += ["-p", str(config.ssh_port)]
    if config.ssh_identity_file is not None:
        ssh_args += ["-i", os.path.abspath(config.ssh_identity_file)]
    if ssh_args:
        if any("plm_ssh_args" in a or "plm_rsh_args" in a for a in user_args):
            raise LaunchError("ssh options given twice: by -p/-i and by plm_ssh_args in "
                              "--mpi-args; keep one")
        argv += ["--mca", "plm_ssh_args", shlex.join(ssh_args)]
    if config.network_interfaces:
        nics = ",".join(config.network_interfaces)
        argv += ["--mca", "btl_tcp_if_include", nics]
        env["NCCL_SOCKET_IFNAME"] = nics
    if config.tcp:
        argv += ["--mca", "pml", "ob1", "--mca", "btl", "self,tcp"]
        env["NCCL_IB_DISABLE"] = "1"  # NCCL over sockets too, as horovodrun sets it
    if elastic is not None:
        # ULFM: a worker's death becomes an error the survivors can handle instead of
        # the end of the job.  Measured here, Open MPI 5's runtime reports a dead local
        # peer to ranks waiting on it over shared memory in 7-25 ms, as over TCP, and
        # shared memory moves a 4 MiB allreduce 2-3x faster: both, unless the user
        # chose the transport.
        if not has_option(user_args, "--with-ft", "-with-ft"):
            argv += ["--with-ft", "ulfm"]
        # A process that lives on but sends nothing (its host cut off from the network,
        # the process stopped) is not reported by the runtime, which watches processes
        # die. ULFM's failure detector is: each rank expects a heartbeat from its
        # neighbour every timeout/4 s, and a rank silent for the timeout counts as
        # failed on every rank. mpirun's own watch of its daemons (TCP keepalive) is
        # turned off: when it fires, mpirun ends the whole job for the one host.
        timeout = failure_timeout(config, env)
        # The detector's verdict reaches the other ranks by ULFM's own reliable
        # broadcast: the runtime, which sees the process alive, would not pass it on.
        if not _mca_chosen(user_args, "mpi_ft_detector"):
            argv += ["--mca", "mpi_ft_detector", "true",
                     "--mca", "mpi_ft_detector_period", f"{timeout / 4:g}",
                     "--mca", "mpi_ft_detector_timeout", f"{timeout:g}",
                     "--mca", "mpi_ft_propagator_with_rbcast", "true"]
        env.setdefault("PRTE_MCA_oob_tcp_keepalive_time", "0")
        env[discovery.ENV_FAILURE_TIMEOUT] = f"{timeout:g}"
        if not config.tcp:
            if not _mca_chosen(user_args, "pml"):
                argv += ["--mca", "pml", "ob1"]
            if not _mca_chosen(user_args, "btl"):
                argv += ["--mca", "btl", "sm,tcp,self"]
        # On this machine alone (and no script that could add other hosts), TCP needs
        # only the loopback: other interfaces may come and go (containers' bridges)
        # while the job runs, and a connection over one that went stalls a rank.
        if (local_only and not elastic.discovery_script and not config.network_interfaces
                and not _mca_chosen(user_args, "btl_tcp_if_include")
                and not _mca_chosen(user_args, "btl_tcp_if_exclude")):
            argv += ["--mca", "btl_tcp_if_include", "lo"]
    path = None if config.output_filename is None else os.path.abspath(config.output_filename)
    if live_output(config, ompi_major, env):
        # Each rank's output as it comes, tagged with its rank: launch() puts the lines
        # back together and shows a progress bar's redraws live (hvdlite.runner.output).
        argv += ["--output", "tag:raw"]
    elif ompi_major is not None and ompi_major >= 5:  # one --output with its qualifiers
        qualifiers = ([f"dir={path}"] if path else []) + (["timestamp"] if config.prefix_timestamp else [])
        if qualifiers:
            argv += ["--output", ",".join(qualifiers)]
    else:
        argv += (["--output-filename", path] if path else []) + (
            ["--timestamp-output"] if config.prefix_timestamp else [])

    # Root.
    if is_root:
        if not has_option(user_args, "--allow-run-as-root"):
            argv.append("--allow-run-as-root")
        env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
        env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"

    # Elastic settings -> environment; never let an outer job's leak in.
    for name in discovery.ENV_NAMES:
        env.pop(name, None)
    if elastic is not None:
        env.update(elastic.to_environ())
        env[discovery.ENV_ALLOCATION] = discovery.format_hosts(host_list or [])
        if status_file is not None:
            env[discovery.ENV_STATUS_FILE] = status_file
        if resume is not None:
            env[discovery.ENV_RESUME] = resume
        if live_output(config, ompi_major, environ):
            # hvdlite-run reads the ranks' output and ends, on rank 0's request, the
            # process of a worker rank 0 counted lost (hvdlite.runner.evict).
            env[discovery.ENV_LAUNCHER_REQUESTS] = "1"
            if keep is not None:
                env[discovery.ENV_KEEP] = keep
        if local_only and not user_oversubscribes:
            env[discovery.ENV_OVERSUBSCRIBED] = "1"
        for name in ("HOROVOD_ELASTIC_TIMEOUT", "HOROVOD_ELASTIC_START_TIMEOUT"):
            if name in env:
                env[name] = env[discovery.ENV_TIMEOUT]

    # Tunables -> environment.
    tunables: dict[str, str] = {}
    if config.timeline_filename is not None:
        dynamic = config.timeline_filename.strip().upper() == "DYNAMIC"  # started at run time
        tunables["HVDLITE_TIMELINE"] = "DYNAMIC" if dynamic else os.path.abspath(config.timeline_filename)
    if config.thread_affinity is not None:
        tunables["HVDLITE_THREAD_AFFINITY"] = config.thread_affinity
    if config.fusion_threshold_mb is not None:
        tunables["HVDLITE_FUSION_THRESHOLD"] = str(
            int(round(config.fusion_threshold_mb * 1024 * 1024))
        )
    if config.cycle_time_ms is not None:
        tunables["HVDLITE_CYCLE_TIME"] = _number_text(config.cycle_time_ms)
    if config.cache_capacity is not None:
        tunables["HVDLITE_CACHE_CAPACITY"] = str(config.cache_capacity)
    if config.autotune is not None:
        tunables["HVDLITE_AUTOTUNE"] = "1" if config.autotune else "0"
    if config.autotune_log_file is not None:
        tunables["HVDLITE_AUTOTUNE_LOG"] = os.path.abspath(config.autotune_log_file)
    for name, value in (("HVDLITE_AUTOTUNE_WARMUP_SAMPLES", config.autotune_warmup_samples),
                        ("HVDLITE_AUTOTUNE_STEPS_PER_SAMPLE", config.autotune_steps_per_sample),
                        ("HVDLITE_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", config.autotune_bayes_opt_max_samples)):
        if value is not None:
            tunables[name] = str(value)
    if config.autotune_gaussian_process_noise is not None:
        # Has no effect (no Gaussian process); under Horovod's name so that rank 0 says so.
        tunables["HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE"] = _number_text(
            config.autotune_gaussian_process_noise)
    if config.stall_check_time is not None:
        tunables["HVDLITE_STALL_CHECK_TIME_SECONDS"] = _number_text(config.stall_check_time)
    if config.stall_shutdown_time is not None:
        tunables["HVDLITE_STALL_SHUTDOWN_TIME_SECONDS"] = _number_text(config.stall_shutdown_time)
    for name, switch in (("HVDLITE_STALL_CHECK_DISABLE", config.no_stall_check),
                         ("HVDLITE_TIMELINE_MARK_CYCLES", config.timeline_mark_cycles),
                         ("HVDLITE_HIERARCHICAL_ALLREDUCE", config.hierarchical_allreduce),
                         ("HVDLITE_HIERARCHICAL_ALLGATHER", config.hierarchical_allgather)):
        if switch is not None:
            tunables[name] = "1" if switch else "0"
    if config.log_level is not None:
        tunables["HVDLITE_LOG_LEVEL"] = config.log_level.upper()
    for name, value in tunables.items():
        env[name] = value
        alias = _HOROVOD_ALIASES.get(name)
        if alias and alias in env:
            env[alias] = value
    # A value the engine cannot use is said once here, for the whole job, and the ranks
    # get what the engine would use instead (its default), so that none repeats it.
    for bad in horovod_env.bad_engine_values(env):
        for name, value in bad.replace.items():
            if value is None:
                env.pop(name, None)
            else:
                env[name] = value
        if notes is not None:
            notes.append(bad.message)
    # MPI must not busy-poll while ranks share cores.
    env.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")

    # Forward the environment explicitly: needed for remote hosts, harmless on one.
    forward = sorted(
        name for name in env
        if name.startswith(FORWARD_PREFIXES) and name != "HVDLITE_MPIRUN"
    )
    forward += [name for name in FORWARD_NAMES if name in env]
    for name in forward:
        argv += ["-x", name]

    argv += user_args
    # Where each rank lands, when hvdlite-run decides it (Horovod's cross ranks at start).
    placement = None
    if not has_option(user_args, *_PLACEMENT_OPTIONS):
        placement = rank_placement(host_list or [("localhost", config.num_proc)], config.num_proc)
    threads = not _threads_chosen(env, user_args)
    binds = _user_binds(config.binding_args, user_args)
    divisor = _elastic_divisor(elastic, host_list)
    if threads and notes is not None:
        # Threads per rank: the host's cores / the ranks there, worked out where each
        # rank starts (a remote host's cores are not known here).
        note = _threads_note(config.num_proc if elastic is None else max(config.num_proc, divisor),
                             local_only, binds)
        if note:
            notes.append(note)
    argv += rank_prologue(threads=threads, divide=not binds, at_least=divisor, placement=placement)
    argv += list(config.command)
    return argv, env




def failure_timeout(config: LaunchConfig, environ: Mapping[str, str]) -> float:
    """Seconds of silence after which an elastic job's worker counts as failed:
    ``--failure-timeout``, else ``HVDLITE_FAILURE_TIMEOUT``, else
    :data:`~hvdlite.common.discovery.DEFAULT_FAILURE_TIMEOUT_S`."""
    if config.failure_timeout is not None:
        return float(config.failure_timeout)
    value = env_seconds(environ, discovery.ENV_FAILURE_TIMEOUT)
    if value is not None:
        if not value > 0:
            raise LaunchError(f"{discovery.ENV_FAILURE_TIMEOUT}={value:g}: give a number of seconds above 0")
        return value
    return discovery.DEFAULT_FAILURE_TIMEOUT_S


def _threads_chosen(env: Mapping[str, str], user_args: Sequence[str]) -> bool:
    """Whether the user sized the ranks' thread pools: OMP_NUM_THREADS in the launcher's
    environment (forwarded to every rank) or given to mpirun (``-x OMP_NUM_THREADS``)."""
    if "OMP_NUM_THREADS" in env:
        return True
    for flag, value in zip(user_args, user_args[1:]):
        if flag in ("-x", "--x") and value.split("=", 1)[0] == "OMP_NUM_THREADS":
            return True
    return any(a.startswith(("-x=OMP_NUM_THREADS", "--x=OMP_NUM_THREADS")) for a in user_args)


def _user_binds(binding_args: Sequence[str], user_args: Sequence[str]) -> bool:
    """Whether the user bound the ranks to cores (--binding-args, or --bind-to other than
    none in --mpi-args): each rank then has cores of its own, not divided further."""
    args = list(binding_args) + list(user_args)
    for i, arg in enumerate(args):
        head, eq, value = arg.partition("=")
        if head in ("--bind-to", "-bind-to"):
            if not eq:
                value = args[i + 1] if i + 1 < len(args) else ""
            return value.split(":", 1)[0].lower() != "none"
    return bool(binding_args)


def _elastic_divisor(elastic: discovery.ElasticSettings | None,
                     host_list: Sequence[tuple[str, int | None]] | None) -> int:
    """In an elastic job, the most workers any host of the launch may hold (its slots):
    workers that join later share the cores with those started first."""
    if elastic is None or not host_list:
        return 1
    return max((s or 1) for _, s in host_list)


#: mpirun options that place ranks otherwise than host by host, in the order given.
_PLACEMENT_OPTIONS: tuple[str, ...] = (
    "--map-by", "-map-by", "--rank-by", "-rank-by", "--npernode", "-npernode", "-N",
    "--ppr", "-ppr", "--rankfile", "-rankfile", "--bynode", "-bynode",
)


def rank_placement(host_list: Sequence[tuple[str, int | None]], num_proc: int) -> list[tuple[str, int]] | None:
    """The ranks each host gets, ``[(host, ranks), ...]`` in rank order, when mpirun fills
    the hosts one after the other up to their slots (its placement for ``-H``, a
    discovery script's hosts and a Slurm allocation); None when that cannot be told
    here (a host without a slot count, or more ranks than slots)."""
    placement: list[tuple[str, int]] = []
    left = num_proc
    for host, slots in host_list:
        if slots is None:
            return None
        take = min(slots, left)
        if take > 0:
            placement.append((host, take))
        left -= take
    return placement if left == 0 else None


def rank_prologue(threads: bool = True, divide: bool = True, at_least: int = 1,
                  placement: Sequence[tuple[str, int]] | None = None) -> list[str]:
    """The words put in front of each rank's command: a POSIX shell that prepares the
    rank's environment on its host, then ``exec``s the command.

    * **Horovod's per-worker variables**, as Horovod's launcher sets them:
      ``HOROVOD_RANK``, ``HOROVOD_SIZE``, ``HOROVOD_LOCAL_RANK`` and
      ``HOROVOD_LOCAL_SIZE`` from Open MPI's; ``HOROVOD_CROSS_RANK`` (the host's place
      among the hosts that have a rank of this local rank), ``HOROVOD_CROSS_SIZE``
      (how many hosts do) and ``HOROVOD_HOSTNAME`` (the host's name as the launch gave
      it) from ``placement``, the ranks of each host in rank order. Without a
      placement the cross pair is left to ``hvd.init()``, which sets all of them from
      the job's real layout, and the host name is the machine's.
    * **Thread pools** (``threads``): when ``OMP_NUM_THREADS`` is unset there, each of
      :data:`THREAD_VARIABLES` that is unset becomes ``max(1, cores // ranks)``:
      ``cores`` are the CPUs the rank may run on (``nproc``: the host's, or those its
      binding gives it), ``ranks`` the ranks of the job on that host
      (``OMPI_COMM_WORLD_LOCAL_SIZE``, at least ``at_least``; 1 when ``divide`` is
      false, for ranks bound to cores of their own). A lone rank on its host (``ranks``
      1, ``divide`` true) keeps the frameworks' own defaults, as with torchrun."""
    lines = [
        'if [ -n "${OMPI_COMM_WORLD_RANK:-}" ]; then',
        ' export HOROVOD_RANK="$OMPI_COMM_WORLD_RANK" HOROVOD_SIZE="$OMPI_COMM_WORLD_SIZE"'
        ' HOROVOD_LOCAL_RANK="$OMPI_COMM_WORLD_LOCAL_RANK" HOROVOD_LOCAL_SIZE="$OMPI_COMM_WORLD_LOCAL_SIZE"',
        ' unset HOROVOD_CROSS_RANK HOROVOD_CROSS_SIZE',
        ' h=',
    ]
    if placement:
        hosts = " ".join(shlex.quote(f"{host}={count}") for host, count in placement)
        lines += [
            ' first=0 cr=0 cs=0',
            f' for hc in {hosts}; do',
            '  c=${hc##*=}',
            '  if [ -z "$h" ] && [ "$HOROVOD_RANK" -lt $((first + c)) ]; then h=${hc%=*} cr=$cs; fi',
            '  [ "$c" -gt "$HOROVOD_LOCAL_RANK" ] && cs=$((cs + 1))',
            '  first=$((first + c))',
            ' done',
            ' [ -n "$h" ] && export HOROVOD_CROSS_RANK=$cr HOROVOD_CROSS_SIZE=$cs',
        ]
    lines += [
        ' [ -n "$h" ] || h=$(hostname 2>/dev/null || uname -n)',
        ' export HOROVOD_HOSTNAME="$h"',
        'fi',
    ]
    if threads:
        lines += [
            'if [ -z "${OMP_NUM_THREADS+x}" ]; then',
            ' n=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc 2>/dev/null'
            ' || getconf _NPROCESSORS_ONLN 2>/dev/null)',
            ' case $n in ""|*[!0-9]*) n=1;; esac',
        ]
        if divide:
            lines += [
                ' d=${OMPI_COMM_WORLD_LOCAL_SIZE:-${MPI_LOCALNRANKS:-1}}',
                ' case $d in ""|*[!0-9]*) d=1;; esac',
                f' [ "$d" -ge {int(at_least)} ] || d={int(at_least)}',
                ' if [ "$d" -gt 1 ]; then n=$((n / d)); else n=; fi',
            ]
        lines += [' if [ -n "$n" ]; then', '  [ "$n" -ge 1 ] || n=1']
        lines += [f'  [ -n "${{{name}+x}}" ] || export {name}=$n' for name in THREAD_VARIABLES]
        lines += [' fi', 'fi']
    lines += ['exec "$@"']
    return ["/bin/sh", "-c", "\n".join(lines), "hvdlite-run"]


def _threads_note(ranks_here: int, local_only: bool, binds: bool) -> str:
    """The line hvdlite-run prints about the threads it gives each rank ("" if none)."""
    what = "OMP_NUM_THREADS, MKL_NUM_THREADS and TensorFlow's TF_NUM_INTRAOP/INTEROP_THREADS"
    if binds:
        return (f"OMP_NUM_THREADS is not set: each rank gets one thread per core "
                f"it is bound to ({what}); set OMP_NUM_THREADS to choose")
    if not local_only:
        return (f"OMP_NUM_THREADS is not set: each rank gets its host's cores / "
                f"the ranks on that host as threads ({what}); set OMP_NUM_THREADS to choose")
    if ranks_here < 2:
        return ""
    cores = _cores_here()
    n = max(1, cores // ranks_here)
    return (f"OMP_NUM_THREADS is not set: each rank gets {n} thread{'s' * (n != 1)} "
            f"({cores} cores / {ranks_here} ranks; {what}); set OMP_NUM_THREADS to choose")


def _cores_here() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


#: mpirun options that shape the ranks' output: given in --mpi-args, they are left to
#: mpirun and hvdlite-run forwards its output as it is.
_OUTPUT_OPTIONS = ("--output", "-output", "--tag-output", "-tag-output", "--timestamp-output",
                   "-timestamp-output", "--xml", "-xml", "--output-filename", "-output-filename",
                   "--merge-stderr-to-stdout", "-merge-stderr-to-stdout")


def live_output(config: LaunchConfig, ompi_major: int | None,
                environ: Mapping[str, str] | None = None) -> bool:
    """Whether hvdlite-run forwards the ranks' output itself, unfinished lines (a
    progress bar's redraws) included, rather than leaving it to mpirun, which holds
    each rank's output until a newline.

    Needs Open MPI 5 (``--output tag:raw``); off when the output goes to files
    (``--output-filename``), is timestamped line by line (``-prefix-timestamp``), when
    ``--mpi-args`` choose an output option, or with ``HVDLITE_LIVE_OUTPUT=0``."""
    env = os.environ if environ is None else environ
    if env.get("HVDLITE_LIVE_OUTPUT", "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    if ompi_major is None or ompi_major < 5:
        return False
    if config.output_filename is not None or config.prefix_timestamp:
        return False
    return not has_option(config.mpi_args, *_OUTPUT_OPTIONS)


def _number_text(value: float) -> str:
    """Render 5.0 as "5" and 0.5 as "0.5" for environment variables."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))
