"""``hvdlite-run``: launch a data-parallel job through Open MPI's ``mpirun``.

Usage::

    hvdlite-run -np 4 python train.py
    hvdlite-run -np 8 -H node1:4,node2:4 --fusion-threshold-mb 32 python train.py
    hvdlite-run -np 8 --hostfile hosts.txt --timeline-filename /tmp/tl.json python train.py
    hvdlite-run --check-build
    sbatch -N 2 --ntasks-per-node 4 --wrap "hvdlite-run -np 8 python train.py"
    hvdlite-run -np 8 -H node1:4,node2:4 -p 2222 --network-interface eth0 python train.py
    hvdlite-run -np 8 --min-np 4 --max-np 12 --host-discovery-script ./hosts.sh python train.py

horovodrun's options work with their horovodrun meaning; the ones for features
hvdlite does not have (Gloo, autotuning, ...) are usage errors that say so
(:data:`UNSUPPORTED_HOROVODRUN_OPTIONS`).

Elastic mode (horovodrun's ``--min-np``, ``--max-np`` or
``--host-discovery-script``) starts ``-np`` workers under Open MPI's ULFM fault
tolerance (``--with-ft ulfm``, shared memory and TCP, both of which report a dead
peer within milliseconds), gives mpirun every discovered host with its slots so that later
workers have somewhere to start, and hands the elastic settings to every worker
as ``HVDLITE_ELASTIC_*`` variables (:mod:`hvdlite.common.discovery`).  With a
discovery script, the launcher first waits up to ``--elastic-timeout`` seconds
for ``-np`` slots to appear.  Rebuilding the job when workers fail or join is
the workers' business, not the launcher's.

The launcher turns its flags into one ``mpirun`` command line and a set of
environment variables, runs it and exits with its exit status; Ctrl-C (or
SIGTERM) stops the job, a second Ctrl-C kills it at once (:func:`_run_mpirun`).  With Open MPI 5 it also writes the ranks' output itself, as it
comes, so that a progress bar's redraws show live (:mod:`hvdlite.runner.output`,
:func:`live_output`).  Inside a Slurm allocation, without ``-H``/``--hostfile``, the
ranks go to the allocation's nodes (:mod:`hvdlite.runner.slurm`).  Everything that
decides the command is in
:func:`build_mpirun_command`, a pure function, so the exact command for given
flags can be inspected (``--verbose`` prints it) and tested without starting a
process.

This module must stay importable without hvdlite's compiled core: it imports
nothing from the engine.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence

from hvdlite.common import discovery, horovod_env
from hvdlite.runner import output, slurm
from hvdlite.runner.check_build import check_build_report, hvdlite_version
from hvdlite.runner.mpirun import LaunchError, find_mpirun, mpirun_version

__all__ = [
    "LaunchConfig",
    "LaunchError",
    "build_mpirun_command",
    "elastic_settings",
    "find_mpirun",
    "live_output",
    "mpirun_version",
    "parse_args",
    "parse_hosts",
    "parse_hostfile",
    "main",
    "wait_for_slots",
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
#: (:func:`rank_threads_command`).
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

#: horovodrun options that hvdlite-run does not implement: option -> (number of
#: values it takes, why).  They are recognised so that a command line copied from
#: horovodrun stops with the reason instead of argparse's "unrecognized arguments".
UNSUPPORTED_HOROVODRUN_OPTIONS: dict[str, tuple[int, str]] = {
    "--gloo": (0, "hvdlite runs on MPI only (there is no Gloo controller); drop --gloo"),
    "--gloo-timeout-seconds": (1, "hvdlite runs on MPI only (there is no Gloo controller)"),
    "--jsrun": (0, "hvdlite-run starts jobs with mpirun only; start them with jsrun yourself"),
    "--config-file": (1, "hvdlite-run reads no YAML config file; give its settings as the "
                         "horovodrun options they stand for, on the command line"),
    "--log-with-timestamp": (0, "hvdlite's log lines carry no timestamp; -prefix-timestamp "
                                "stamps every line of output instead"),
    "--no-log-hide-timestamp": (0, "hvdlite's log lines carry no timestamp; -prefix-timestamp "
                                   "stamps every line of output instead"),
    "--mpi-threads-disable": (0, "hvdlite's engine and callers share MPI from two threads, "
                                 "so it always asks MPI for thread support"),
}

_LOCAL_NAMES = {"localhost", "127.0.0.1", "::1", "localhost.localdomain"}


@dataclasses.dataclass
class LaunchConfig:
    """Everything ``hvdlite-run`` was asked to do, independent of argv parsing.

    Attributes mirror the command-line flags; ``None`` means "flag not given".
    """

    num_proc: int
    command: list[str]
    hosts: str | None = None
    hostfile: str | None = None
    timeline_filename: str | None = None
    thread_affinity: str | None = None  # a core per local rank (HOROVOD_THREAD_AFFINITY)
    fusion_threshold_mb: float | None = None
    cycle_time_ms: float | None = None
    cache_capacity: int | None = None
    # Horovod's autotuner (HOROVOD_AUTOTUNE and its companions).
    autotune: bool | None = None
    autotune_log_file: str | None = None
    autotune_warmup_samples: int | None = None
    autotune_steps_per_sample: int | None = None
    autotune_bayes_opt_max_samples: int | None = None
    autotune_gaussian_process_noise: float | None = None
    stall_check_time: float | None = None
    log_level: str | None = None
    mpi_args: list[str] = dataclasses.field(default_factory=list)
    verbose: bool = False
    # horovodrun's further options.
    # These four: None leaves the variable alone, True/False sets it to 1/0 (horovodrun's
    # --X and --no-X options, for --no-stall-check the other way round).
    timeline_mark_cycles: bool | None = None
    hierarchical_allreduce: bool | None = None
    hierarchical_allgather: bool | None = None
    stall_shutdown_time: float | None = None
    no_stall_check: bool | None = None
    ssh_port: int | None = None
    ssh_identity_file: str | None = None
    network_interfaces: list[str] = dataclasses.field(default_factory=list)
    tcp: bool = False
    binding_args: list[str] = dataclasses.field(default_factory=list)
    output_filename: str | None = None
    prefix_timestamp: bool = False
    # horovodrun's elastic options; elastic mode is on when any of the first three is set.
    min_np: int | None = None
    max_np: int | None = None
    host_discovery_script: str | None = None
    slots_per_host: int | None = None
    elastic_timeout: float | None = None
    reset_limit: int | None = None
    cooldown_range: tuple[float, float] | None = None

    @property
    def elastic(self) -> bool:
        """True when horovodrun's elastic mode is asked for (``--min-np``,
        ``--max-np`` or ``--host-discovery-script``)."""
        return (self.min_np is not None or self.max_np is not None
                or self.host_discovery_script is not None)


# --------------------------------------------------------------------------- hosts


def parse_hosts(spec: str) -> list[tuple[str, int | None]]:
    """Parse ``-H host1:slots,host2:slots`` into ``[(host, slots or None), ...]``.

    Raises ``ValueError`` with a message naming the bad entry.
    """
    result: list[tuple[str, int | None]] = []
    for entry in spec.split(","):
        entry = entry.strip()
        if not entry:
            raise ValueError(f"empty host entry in {spec!r}")
        host, sep, slots_text = entry.rpartition(":")
        if not sep:
            host, slots = entry, None
        else:
            if not host:
                raise ValueError(f"host entry {entry!r} has no host name")
            try:
                slots = int(slots_text)
            except ValueError:
                raise ValueError(
                    f"host entry {entry!r}: slots must be a positive integer"
                ) from None
            if slots < 1:
                raise ValueError(f"host entry {entry!r}: slots must be a positive integer")
        result.append((host, slots))
    return result


def parse_hostfile(path: str) -> list[tuple[str, int | None]]:
    """Read a hostfile (Horovod/Open MPI style: one ``host slots=N`` per line).

    ``#`` starts a comment; ``host:N`` lines are accepted too.  Returns
    ``[(host, slots or None), ...]``; raises ``ValueError`` on a malformed line
    and ``OSError`` if the file cannot be read.
    """
    result: list[tuple[str, int | None]] = []
    with open(path, encoding="utf-8") as fh:
        for lineno, raw in enumerate(fh, 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            fields = line.split()
            host = fields[0]
            slots: int | None = None
            if ":" in host and not host.startswith("["):
                try:
                    (host, slots), = parse_hosts(host)
                except ValueError as exc:
                    raise ValueError(f"{path}:{lineno}: {exc}") from None
            for field in fields[1:]:
                key, _, value = field.partition("=")
                if key == "slots":
                    try:
                        slots = int(value)
                    except ValueError:
                        raise ValueError(
                            f"{path}:{lineno}: bad slots value {value!r}"
                        ) from None
                    if slots < 1:
                        raise ValueError(f"{path}:{lineno}: slots must be positive")
            result.append((host, slots))
    if not result:
        raise ValueError(f"hostfile {path} lists no hosts")
    return result


def program_name() -> str:
    """``horovodrun`` when the launcher was started under that name (the same program,
    installed under Horovod's name too), else ``hvdlite-run``."""
    return "horovodrun" if os.path.basename(sys.argv[0] or "") == "horovodrun" else "hvdlite-run"


def _is_local_host(host: str) -> bool:
    """True when ``host`` names this machine (without a DNS lookup)."""
    if host in _LOCAL_NAMES or host.startswith("127."):
        return True
    name = socket.gethostname()
    return host in (name, name.split(".", 1)[0])


def _has_option(args: Sequence[str], *names: str) -> bool:
    """True if any of ``names`` (e.g. ``--map-by``) appears in ``args``."""
    for arg in args:
        head = arg.split("=", 1)[0]
        if head in names:
            return True
    return False


# --------------------------------------------------------------------------- elastic


def elastic_settings(
    config: LaunchConfig,
    environ: Mapping[str, str] | None = None,
    host_list: Sequence[tuple[str, int | None]] | None = None,
) -> discovery.ElasticSettings:
    """Resolve ``config``'s elastic options the way horovodrun does.  Pure.

    ``--min-np`` defaults to ``-np``, ``--max-np`` to ``-np`` (horovodrun's
    documented defaults), and ``min_np <= -np <= max_np`` must hold;
    ``--elastic-timeout`` defaults to ``$HOROVOD_ELASTIC_TIMEOUT`` (or
    ``$HOROVOD_ELASTIC_START_TIMEOUT``, the elastic guide's name), else 600 s.
    Without a discovery script the hosts are fixed: ``host_list`` when given,
    else ``-H``/``--hostfile`` (a host without slots counts ``--slots-per-host``
    slots, else 1, as ``mpirun --host`` counts it), else the Slurm allocation's
    nodes, else ``localhost`` with ``max_np`` slots.  With a script,
    ``hosts`` is ``None``: the hosts are what the script prints.

    Raises :class:`LaunchError` for inconsistent numbers.
    """
    env = os.environ if environ is None else environ
    if not config.elastic:
        raise LaunchError("elastic_settings() needs --min-np, --max-np or "
                          "--host-discovery-script")
    np_ = config.num_proc
    min_np = np_ if config.min_np is None else config.min_np
    max_np = np_ if config.max_np is None else config.max_np
    if min_np < 1:
        raise LaunchError(f"--min-np must be a positive integer, got {min_np}")
    if min_np > np_:
        raise LaunchError(f"--min-np {min_np} is above -np {np_}: -np is the number of "
                          "workers to start with, at least --min-np")
    if max_np < np_:
        raise LaunchError(f"--max-np {max_np} is below -np {np_}: -np is the number of "
                          "workers to start with, at most --max-np")
    if config.cooldown_range is not None:
        low, high = config.cooldown_range
        if not 0 <= low <= high:
            raise LaunchError(f"--blacklist-cooldown-range {low:g} {high:g}: need "
                              "0 <= MIN <= MAX seconds")
    if config.reset_limit is not None and config.reset_limit < 0:
        raise LaunchError(f"--reset-limit must be >= 0, got {config.reset_limit}")
    if config.slots_per_host is not None and config.slots_per_host < 1:
        raise LaunchError(f"--slots-per-host must be a positive integer, "
                          f"got {config.slots_per_host}")
    if config.host_discovery_script is not None and (config.hosts or config.hostfile):
        raise LaunchError("give either --host-discovery-script or -H/--hostfile, not both")

    timeout = config.elastic_timeout
    if timeout is None:
        # horovodrun's name, then the one Horovod's elastic guide uses for the same wait.
        name = next((n for n in ("HOROVOD_ELASTIC_TIMEOUT", "HOROVOD_ELASTIC_START_TIMEOUT")
                     if env.get(n, "").strip()), "HOROVOD_ELASTIC_TIMEOUT")
        text = env.get(name, "").strip()
        if text:
            try:
                timeout = float(text)
            except ValueError:
                raise LaunchError(f"{name}={text!r} is not a number of seconds") from None
        else:
            timeout = discovery.DEFAULT_ELASTIC_TIMEOUT_S
    if not 0 <= timeout < float("inf"):
        raise LaunchError(f"--elastic-timeout must be a finite number >= 0, got {timeout}")

    hosts: list[tuple[str, int]] | None = None
    if config.host_discovery_script is None:
        if host_list is None:
            host_list, _ = _given_hosts(config, env)
        if host_list:
            default = config.slots_per_host or 1
            hosts = [(h, default if s is None else s) for h, s in host_list]
        else:
            hosts = [("localhost", max_np)]
    return discovery.ElasticSettings(
        min_np=min_np,
        max_np=max_np,
        discovery_script=(None if config.host_discovery_script is None
                          else os.path.abspath(config.host_discovery_script)),
        default_slots=config.slots_per_host,
        timeout_s=float(timeout),
        reset_limit=config.reset_limit,
        cooldown_range=(None if config.cooldown_range is None
                        else (float(config.cooldown_range[0]), float(config.cooldown_range[1]))),
        hosts=hosts,
    )


def wait_for_slots(
    settings: discovery.ElasticSettings,
    needed: int,
    *,
    poll_s: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    log: Callable[[str], None] | None = None,
) -> list[tuple[str, int]]:
    """Run the discovery script until its hosts offer ``needed`` slots; return them.

    horovodrun's rule: the job starts once ``-np`` slots are available, waiting
    up to ``--elastic-timeout`` (``settings.timeout_s``) for them.  The script is
    run once, then every ``poll_s`` seconds.  A failure of the first run is final
    (a broken script should not cost the whole timeout); later failures are
    retried.  Raises :class:`LaunchError` when the first run fails or the timeout
    passes, with the slots last seen and the last failure.  ``log`` receives one
    line when the wait starts.
    """
    script = settings.discovery_script
    if script is None:
        raise LaunchError("wait_for_slots() needs a host discovery script")
    deadline = clock() + settings.timeout_s

    def run_once() -> list[tuple[str, int]]:
        budget = min(30.0, max(1.0, deadline - clock()))
        return discovery.run_discovery_script(script, settings.default_slots, timeout=budget)

    try:
        hosts = run_once()
    except discovery.DiscoveryError as exc:
        raise LaunchError(str(exc)) from None
    last_error: str | None = None
    announced = False
    while sum(s for _, s in hosts) < needed:
        offered = sum(s for _, s in hosts)
        now = clock()
        if now >= deadline:
            seen = discovery.format_hosts(hosts) or "no hosts"
            why = f"\nThe last run failed: {last_error}" if last_error else ""
            raise LaunchError(
                f"-np {needed} needs {needed} slots, but the host discovery script offered "
                f"only {offered} ({seen}) within --elastic-timeout {settings.timeout_s:g} s; "
                f"lower -np or raise --elastic-timeout{why}")
        if log is not None and not announced:
            log(f"waiting up to {settings.timeout_s:g} s (--elastic-timeout) for {needed} "
                f"slots; the host discovery script offers {offered}")
            announced = True
        sleep(max(0.0, min(poll_s, deadline - now)))
        try:
            hosts = run_once()
            last_error = None
        except discovery.DiscoveryError as exc:
            last_error = str(exc)
    return hosts


def _mca_chosen(args: Sequence[str], name: str) -> bool:
    """True if ``args`` set the MCA parameter ``name`` (``--mca NAME VALUE``)."""
    for flag, key in zip(args, args[1:]):
        if flag in ("--mca", "-mca", "--gmca", "-gmca") and key == name:
            return True
    return False


def _given_hosts(config: LaunchConfig, env: Mapping[str, str]) -> tuple[list[tuple[str, int | None]], bool]:
    """The hosts of ``-H``, ``--hostfile`` or, without either, the Slurm allocation
    (empty outside one), and whether they came from Slurm."""
    if config.hosts:
        return parse_hosts(config.hosts), False
    if config.hostfile:
        return parse_hostfile(config.hostfile), False
    try:
        slurm_hosts = list(slurm.allocation_hosts(env) or [])
    except ValueError as exc:
        raise LaunchError(f"Slurm allocation: {exc}; or give -H/--hostfile") from None
    return slurm_hosts, bool(slurm_hosts)


def build_mpirun_command(
    config: LaunchConfig,
    mpirun: str = "mpirun",
    environ: Mapping[str, str] | None = None,
    *,
    ompi_major: int | None = 5,
    is_root: bool | None = None,
    host_list: Sequence[tuple[str, int | None]] | None = None,
    status_file: str | None = None,
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
    rank 0 writes ``finished`` (``HVDLITE_ELASTIC_STATUS_FILE``).  Stale
    ``HVDLITE_ELASTIC*`` and ``HOROVOD_ELASTIC`` variables in ``environ`` are dropped
    in either mode.

    Unless ``OMP_NUM_THREADS`` is set (in ``environ``, or with ``-x`` in
    ``--mpi-args``), each rank's command is started through
    :func:`rank_threads_command`, which sizes its thread pools on its host. A value
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
        given, from_slurm = _given_hosts(config, env)
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
    local_only = not host_list or all(_is_local_host(h) for h, _ in host_list)
    user_oversubscribes = _has_option(user_args, "--oversubscribe", "-oversubscribe") or any(
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
        user_maps = _has_option(user_args, "--map-by", "-map-by")
        if ompi_major is not None and ompi_major >= 5 and not user_maps:
            argv += ["--map-by", ":OVERSUBSCRIBE"]
        else:
            argv += ["--oversubscribe"]

    # Binding: ranks share cores with the engine's background thread and with
    # each other, so they must not be pinned one core each.
    if config.binding_args:
        argv += list(config.binding_args)
    elif not _has_option(user_args, "--bind-to", "-bind-to"):
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
        if not _has_option(user_args, "--with-ft", "-with-ft"):
            argv += ["--with-ft", "ulfm"]
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
        if not _has_option(user_args, "--allow-run-as-root"):
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
    if not _threads_chosen(env, user_args):
        # Compute threads per rank: the host's cores / the ranks there, worked out where
        # each rank starts (a remote host's cores are not known here).
        binds = _user_binds(config.binding_args, user_args)
        divisor = _elastic_divisor(elastic, host_list)
        argv += rank_threads_command(divide=not binds, at_least=divisor)
        if notes is not None:
            note = _threads_note(config.num_proc if elastic is None else max(config.num_proc, divisor),
                                 local_only, binds)
            if note:
                notes.append(note)
    argv += list(config.command)
    return argv, env


# --------------------------------------------------------------------------- threads


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


def rank_threads_command(divide: bool = True, at_least: int = 1) -> list[str]:
    """The words put in front of each rank's command to size its thread pools.

    A POSIX shell, in the rank's own environment on its host, leaves everything alone
    when ``OMP_NUM_THREADS`` is set there; otherwise it sets each of
    :data:`THREAD_VARIABLES` that is unset to ``max(1, cores // ranks)``: ``cores`` are
    the CPUs the rank may run on (``nproc``: the host's, or those its binding gives it),
    ``ranks`` the ranks of the job on that host (``OMPI_COMM_WORLD_LOCAL_SIZE``, at
    least ``at_least``; 1 when ``divide`` is false, for ranks bound to cores of their
    own). A lone rank on its host (``ranks`` 1, ``divide`` true) keeps the frameworks'
    own defaults, as with torchrun. Then it ``exec``s the command."""
    lines = [
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
    lines += [' fi', 'fi', 'exec "$@"']
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
    return not _has_option(config.mpi_args, *_OUTPUT_OPTIONS)


def _number_text(value: float) -> str:
    """Render 5.0 as "5" and 0.5 as "0.5" for environment variables."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


# --------------------------------------------------------------------------- CLI


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    value = _non_negative_float(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def _log_level(text: str) -> str:
    level = text.upper()
    if level not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(
            f"unknown log level {text!r}; choose from {', '.join(LOG_LEVELS)}"
        )
    return level


def make_parser() -> argparse.ArgumentParser:
    """Return the ``hvdlite-run`` argument parser."""
    parser = argparse.ArgumentParser(
        prog=program_name(),
        description="Launch a data-parallel hvdlite job through Open MPI's mpirun.",
        epilog="Example: hvdlite-run -np 4 python train.py",
        allow_abbrev=False,
    )
    parser.add_argument("-np", "--num-proc", dest="num_proc", type=_positive_int,
                        metavar="N", help="number of processes (ranks) to start")
    hosts = parser.add_mutually_exclusive_group()
    hosts.add_argument("--host-discovery-script", metavar="SCRIPT",
                       help="elastic mode: a program printing the available hosts, one "
                            "'host:slots' (or 'host', with --slots-per-host) per line; run "
                            "at launch to find the first hosts, and by the workers to find "
                            "more (horovodrun's meaning)")
    hosts.add_argument("-H", "--hosts", dest="hosts", metavar="HOST:SLOTS,...",
                       help="hosts and slots, e.g. node1:4,node2:4 (default: this machine)")
    hosts.add_argument("-hostfile", "--hostfile", dest="hostfile", metavar="FILE",
                       help="file with one 'host slots=N' line per host")
    parser.add_argument("--timeline-filename", metavar="FILE",
                        help="write a Chrome/Perfetto timeline (HVDLITE_TIMELINE); DYNAMIC: "
                             "none until hvd.start_timeline()")
    parser.add_argument("--thread-affinity", metavar="CORES",
                        help="a core per local rank, comma-separated, to pin each rank's "
                             "background thread to (HOROVOD_THREAD_AFFINITY)")
    parser.add_argument("--fusion-threshold-mb", type=_non_negative_float, metavar="MB",
                        help="tensor fusion buffer size in MiB (HVDLITE_FUSION_THRESHOLD, bytes)")
    parser.add_argument("--cycle-time-ms", type=_positive_float, metavar="MS",
                        help="background cycle time in milliseconds (HVDLITE_CYCLE_TIME)")
    parser.add_argument("--cache-capacity", type=_non_negative_int, metavar="N",
                        help="response cache capacity, 0 disables (HVDLITE_CACHE_CAPACITY)")
    parser.add_argument("--autotune", action="store_true", default=None,
                        help="search the fusion threshold, cycle time, response cache and "
                             "hierarchical allreduce while training runs, then keep the best "
                             "(HOROVOD_AUTOTUNE; docs/autotune.md)")
    parser.add_argument("--autotune-log-file", metavar="FILE",
                        help="rank 0 writes one CSV line per autotuning sample (HOROVOD_AUTOTUNE_LOG)")
    parser.add_argument("--autotune-warmup-samples", type=_non_negative_int, metavar="N",
                        help="samples run before autotuning scores any (default 3)")
    parser.add_argument("--autotune-steps-per-sample", type=_positive_int, metavar="N",
                        help="training steps per autotuning sample (default 10)")
    parser.add_argument("--autotune-bayes-opt-max-samples", type=_positive_int, metavar="N",
                        help="samples the autotuning search may score (default 20)")
    parser.add_argument("--autotune-gaussian-process-noise", type=_non_negative_float, metavar="X",
                        help="accepted for horovodrun's sake; has no effect (hvdlite's tuner fits "
                             "no Gaussian process), and rank 0 says so")
    parser.add_argument("--stall-check-time", type=_non_negative_float, metavar="S",
                        help="seconds before a stalled tensor is reported "
                             "(HVDLITE_STALL_CHECK_TIME_SECONDS)")
    parser.add_argument("--log-level", type=_log_level, metavar="LEVEL",
                        help=f"core log level: {', '.join(LOG_LEVELS)} (HVDLITE_LOG_LEVEL)")
    parser.add_argument("--mpi-args", default="", metavar='"ARGS"',
                        help="extra arguments for mpirun, as one quoted string")
    parser.add_argument("--verbose", action="store_true",
                        help="print the mpirun command before running it")
    parser.add_argument("-cb", "--check-build", action="store_true",
                        help="show which frameworks, controllers and features are available")
    parser.add_argument("-v", "--version", action="version", version=f"hvdlite {hvdlite_version()}")

    hr = parser.add_argument_group(
        "horovodrun's options",
        "accepted with horovodrun's meaning, so that its command lines work unchanged")
    marks = hr.add_mutually_exclusive_group()
    marks.add_argument("--timeline-mark-cycles", action="store_const", const=True,
                       help="mark the engine's cycles on the timeline "
                            "(HVDLITE_TIMELINE_MARK_CYCLES)")
    marks.add_argument("--no-timeline-mark-cycles", dest="timeline_mark_cycles",
                       action="store_const", const=False,
                       help="no cycle marks, whatever HOROVOD_TIMELINE_MARK_CYCLES says")
    two_level_ar = hr.add_mutually_exclusive_group()
    two_level_ag = hr.add_mutually_exclusive_group()
    two_level_ar.add_argument("--hierarchical-allreduce", action="store_const", const=True,
                    help="allreduce host memory in two levels, inside each host and then across "
                         "hosts, whatever the size (HOROVOD_HIERARCHICAL_ALLREDUCE=1; by default "
                         "allreduces of 64 KiB and more across hosts are two-level), and GPU "
                         "allreduces too: NCCL inside each host, MPI or NCCL across "
                         "(HVDLITE_HIERARCHICAL_CROSS; GPU allreduces are flat by default)")
    two_level_ar.add_argument("--no-hierarchical-allreduce", dest="hierarchical_allreduce",
                              action="store_const", const=False,
                              help="never allreduce in two levels (HOROVOD_HIERARCHICAL_ALLREDUCE=0)")
    two_level_ag.add_argument("--hierarchical-allgather", action="store_const", const=True,
                    help="allgather host memory in two levels, inside each host and then across "
                         "hosts, whatever the size (HOROVOD_HIERARCHICAL_ALLGATHER=1; by default "
                         "allgathers of 256 KiB and more across hosts are two-level)")
    two_level_ag.add_argument("--no-hierarchical-allgather", dest="hierarchical_allgather",
                              action="store_const", const=False,
                              help="never allgather in two levels (HOROVOD_HIERARCHICAL_ALLGATHER=0)")
    hr.add_argument("--stall-check-warning-time-seconds", dest="stall_check_time",
                    type=_non_negative_float, metavar="S", help="same as --stall-check-time")
    hr.add_argument("--stall-check-shutdown-time-seconds", type=_non_negative_float,
                    metavar="S", help="seconds after which a stalled job is shut down with an "
                                      "error on every rank (HVDLITE_STALL_SHUTDOWN_TIME_SECONDS)")
    stall = hr.add_mutually_exclusive_group()
    stall.add_argument("--no-stall-check", action="store_const", const=True,
                       help="turn the stall warning and shutdown off (HVDLITE_STALL_CHECK_DISABLE)")
    stall.add_argument("--stall-check", dest="no_stall_check", action="store_const", const=False,
                       help="keep the stall check on, whatever HOROVOD_STALL_CHECK_DISABLE says")
    hr.add_argument("-p", "--ssh-port", type=_positive_int, metavar="PORT",
                    help="ssh port of the remote hosts")
    hr.add_argument("-i", "--ssh-identity-file", metavar="FILE",
                    help="ssh private key for the remote hosts")
    hr.add_argument("--network-interface", "--network-interfaces", dest="network_interfaces",
                    action="append", metavar="NIC[,NIC...]",
                    help="network interfaces MPI (and NCCL) may use, e.g. eth0; repeatable")
    hr.add_argument("--tcp", action="store_true", help="communicate over TCP only")
    hr.add_argument("--binding-args", metavar='"ARGS"',
                    help="mpirun's process binding options, replacing --bind-to none")
    hr.add_argument("--output-filename", metavar="DIR",
                    help="write each rank's stdout and stderr under DIR (mpirun's --output dir=)")
    hr.add_argument("-prefix-timestamp", "--prefix-output-with-timestamp",
                    dest="prefix_timestamp", action="store_true",
                    help="prefix each line of output with a timestamp")
    hr.add_argument("--mpi", action="store_true",
                    help="use MPI (hvdlite's only controller, so always the case)")
    hr.add_argument("--start-timeout", type=_positive_int, metavar="S",
                    help="accepted and unused: hvdlite-run runs no start-up checks that "
                         "could time out")
    hr.add_argument("--disable-cache", action="store_true",
                    help="accepted and unused: hvdlite-run keeps no cache of start-up checks")
    hr.add_argument("--num-nccl-streams", type=_positive_int, metavar="N",
                    help="accepted as 1 only: hvdlite runs one NCCL stream of its own per GPU")
    # horovodrun's switches for what hvdlite always does or never does: accepted, no effect.
    hr.add_argument("--no-autotune", dest="autotune", action="store_false", default=None,
                    help="no autotuning, whatever HOROVOD_AUTOTUNE says")
    hr.add_argument("--no-mpi-threads-disable", action="store_true",
                    help="accepted: hvdlite always initializes MPI with thread support")
    hr.add_argument("--log-without-timestamp", "--log-hide-timestamp", action="store_true",
                    dest="log_without_timestamp",
                    help="accepted: hvdlite's log lines carry no timestamp")
    el = parser.add_argument_group(
        "elastic options (horovodrun's)",
        "elastic mode is on when --min-np, --max-np or --host-discovery-script is given: "
        "the job starts with -np workers under Open MPI's ULFM fault tolerance and keeps "
        "running with between --min-np and --max-np of them")
    el.add_argument("--min-np", "--min-num-proc", dest="min_np", type=_positive_int,
                    metavar="N", help="fewest workers the job continues with (default: -np); "
                                      "without -np, also the number to start with")
    el.add_argument("--max-np", "--max-num-proc", dest="max_np", type=_positive_int,
                    metavar="N", help="most workers the job grows to (default: -np)")
    el.add_argument("--slots-per-host", "--slots", dest="slots_per_host", type=_positive_int,
                    metavar="N", help="slots of a host the discovery script prints without "
                                      "':slots' (and of a -H/hostfile host without slots)")
    el.add_argument("--elastic-timeout", type=_non_negative_float, metavar="S",
                    help="seconds to wait for enough slots, at launch and after a "
                         "rescaling (default: $HOROVOD_ELASTIC_TIMEOUT or "
                         "$HOROVOD_ELASTIC_START_TIMEOUT, else 600)")
    el.add_argument("--reset-limit", type=_non_negative_int, metavar="N",
                    help="most times the job may rescale before it fails (default: no limit)")
    el.add_argument("--blacklist-cooldown-range", dest="cooldown_range", nargs=2,
                    type=_non_negative_float, metavar=("MIN", "MAX"),
                    help="a failed host is left out for a random time between MIN and MAX "
                         "seconds, then tried again (default: left out for good)")
    for option, (nargs, why) in UNSUPPORTED_HOROVODRUN_OPTIONS.items():
        hr.add_argument(option, nargs=nargs, action=_Unsupported, reason=why,
                        help=argparse.SUPPRESS)
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="the program to run on every rank, with its arguments")
    return parser


class _Unsupported(argparse.Action):
    """A horovodrun option hvdlite-run does not implement: a usage error with the reason."""

    def __init__(self, option_strings: Sequence[str], dest: str, reason: str = "",
                 **kwargs: object) -> None:
        super().__init__(option_strings, dest, **kwargs)  # type: ignore[arg-type]
        self.reason = reason

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        parser.error(f"{option_string} is a horovodrun option that hvdlite-run does not "
                     f"support: {self.reason}")


def parse_args(argv: Sequence[str] | None = None) -> tuple[argparse.Namespace, LaunchConfig | None]:
    """Parse ``hvdlite-run`` arguments.

    Returns the namespace and, unless ``--check-build`` was given, the
    :class:`LaunchConfig`.  Usage errors exit with status 2 (argparse's way).
    """
    parser = make_parser()
    ns = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    command = list(ns.command)
    if command and command[0] == "--":
        command = command[1:]
    ns.command = command
    if ns.check_build:
        return ns, None
    elastic = (ns.min_np is not None or ns.max_np is not None
               or ns.host_discovery_script is not None)
    if ns.num_proc is None and elastic and ns.min_np is not None:
        ns.num_proc = ns.min_np  # start as soon as the minimum is there
    if ns.num_proc is None:
        parser.error("-np N is required (the number of processes to start"
                     + ("; in elastic mode -np or --min-np)" if elastic else ")"))
    if elastic:
        _check_elastic_args(parser, ns)
    else:
        for flag, value in (("--slots-per-host", ns.slots_per_host),
                            ("--elastic-timeout", ns.elastic_timeout),
                            ("--reset-limit", ns.reset_limit),
                            ("--blacklist-cooldown-range", ns.cooldown_range)):
            if value is not None:
                parser.error(f"{flag} only applies to elastic mode: add --min-np, --max-np "
                             "or --host-discovery-script")
    if not command:
        parser.error("no command given: e.g. hvdlite-run -np 2 python train.py")
    if ns.num_nccl_streams is not None and ns.num_nccl_streams != 1:
        parser.error(f"--num-nccl-streams {ns.num_nccl_streams}: hvdlite runs one NCCL stream "
                     "of its own per GPU; leave the option out (or give 1)")
    try:
        mpi_args = shlex.split(ns.mpi_args)
    except ValueError as exc:
        parser.error(f"--mpi-args: {exc}")
    try:
        binding_args = shlex.split(ns.binding_args or "")
    except ValueError as exc:
        parser.error(f"--binding-args: {exc}")
    nics = [n.strip() for group in ns.network_interfaces or [] for n in group.split(",")]
    if any(not n for n in nics):
        parser.error("--network-interface: empty interface name")
    if ns.hosts:
        try:
            parse_hosts(ns.hosts)
        except ValueError as exc:
            parser.error(f"-H/--hosts: {exc}")
    if ns.hostfile:
        try:
            parse_hostfile(ns.hostfile)
        except (OSError, ValueError) as exc:
            parser.error(f"--hostfile: {exc}")
    config = LaunchConfig(
        num_proc=ns.num_proc,
        command=command,
        hosts=ns.hosts,
        hostfile=ns.hostfile,
        timeline_filename=ns.timeline_filename,
        thread_affinity=ns.thread_affinity,
        fusion_threshold_mb=ns.fusion_threshold_mb,
        cycle_time_ms=ns.cycle_time_ms,
        cache_capacity=ns.cache_capacity,
        autotune=ns.autotune,
        autotune_log_file=ns.autotune_log_file,
        autotune_warmup_samples=ns.autotune_warmup_samples,
        autotune_steps_per_sample=ns.autotune_steps_per_sample,
        autotune_bayes_opt_max_samples=ns.autotune_bayes_opt_max_samples,
        autotune_gaussian_process_noise=ns.autotune_gaussian_process_noise,
        stall_check_time=ns.stall_check_time,
        log_level=ns.log_level,
        mpi_args=mpi_args,
        verbose=ns.verbose,
        timeline_mark_cycles=ns.timeline_mark_cycles,
        hierarchical_allreduce=ns.hierarchical_allreduce,
        hierarchical_allgather=ns.hierarchical_allgather,
        stall_shutdown_time=ns.stall_check_shutdown_time_seconds,
        no_stall_check=ns.no_stall_check,
        ssh_port=ns.ssh_port,
        ssh_identity_file=ns.ssh_identity_file,
        network_interfaces=list(dict.fromkeys(nics)),
        tcp=ns.tcp,
        binding_args=binding_args,
        output_filename=ns.output_filename,
        prefix_timestamp=ns.prefix_timestamp,
        min_np=ns.min_np,
        max_np=ns.max_np,
        host_discovery_script=(None if ns.host_discovery_script is None
                               else os.path.abspath(ns.host_discovery_script)),
        slots_per_host=ns.slots_per_host,
        elastic_timeout=ns.elastic_timeout,
        reset_limit=ns.reset_limit,
        cooldown_range=None if ns.cooldown_range is None else tuple(ns.cooldown_range),
    )
    return ns, config


def _check_elastic_args(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> None:
    """Usage errors among the elastic options (argparse's exit status 2)."""
    np_, min_np, max_np = ns.num_proc, ns.min_np, ns.max_np
    if min_np is not None and min_np > np_:
        parser.error(f"--min-np {min_np} is above -np {np_} (-np is the number of workers "
                     "to start with, at least --min-np)")
    if max_np is not None and max_np < np_:
        parser.error(f"--max-np {max_np} is below -np {np_} (-np is the number of workers "
                     "to start with, at most --max-np)")
    if ns.cooldown_range is not None and ns.cooldown_range[0] > ns.cooldown_range[1]:
        low, high = ns.cooldown_range
        parser.error(f"--blacklist-cooldown-range {low:g} {high:g}: MIN is above MAX")
    script = ns.host_discovery_script
    if script is not None:
        if not os.path.exists(script):
            parser.error(f"--host-discovery-script: {script} does not exist")
        if not os.path.isfile(script):
            parser.error(f"--host-discovery-script: {script} is not a file")


def launch(config: LaunchConfig, environ: Mapping[str, str] | None = None) -> int:
    """Launch ``config`` through mpirun and return the job's exit status.

    In elastic mode with a host discovery script, the script is run first, until
    its hosts offer ``-np`` slots or ``--elastic-timeout`` passes
    (:func:`wait_for_slots`, a :class:`LaunchError` then).

    SIGINT, SIGTERM and SIGHUP received by this process print one line and are
    forwarded to ``mpirun``, which tears the job down; a second Ctrl-C kills
    ``mpirun`` and every process of the job at once. A job stopped that way, or ended
    by signal N, returns ``128 + N`` (130 for Ctrl-C), as a shell would report it.
    """
    env_in = os.environ if environ is None else environ
    mpirun = find_mpirun(env_in)
    _, major = mpirun_version(mpirun)
    host_list: list[tuple[str, int | None]] | None = None
    if config.elastic and config.host_discovery_script is not None:
        settings = elastic_settings(config, env_in)
        host_list = list(wait_for_slots(
            settings, config.num_proc,
            log=lambda line: print(f"{program_name()}: {line}", file=sys.stderr, flush=True)))
    # The last world's rank 0 of an elastic job writes here when training ended well:
    # mpirun's own status counts workers lost along the way (137 for a killed one that
    # joined).
    status_dir = tempfile.mkdtemp(prefix="hvdlite-elastic-") if config.elastic else None
    notes: list[str] = []
    try:
        argv, env = build_mpirun_command(
            config, mpirun, env_in, ompi_major=major, host_list=host_list,
            status_file=os.path.join(status_dir, "status") if status_dir else None,
            notes=notes)
    except BaseException:
        _read_status(status_dir)  # removes the folder
        raise
    for note in notes:
        print(f"{program_name()}: {note}", file=sys.stderr, flush=True)
    if config.verbose:
        set_vars = {k: v for k, v in env.items() if env_in.get(k) != v}
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(set_vars.items()))
        print(f"{program_name()}: {prefix + ' ' if prefix else ''}{shlex.join(argv)}", flush=True)

    try:
        returncode = _run_mpirun(argv, env, live=live_output(config, major, env_in))
    finally:
        finished = _read_status(status_dir)
    if returncode != 0 and finished:
        print(f"{program_name()}: the elastic job finished its training (mpirun reported status "
              f"{returncode} for workers lost on the way)", file=sys.stderr, flush=True)
        return 0
    return returncode


def _read_status(status_dir: str | None) -> bool:
    """Whether an elastic job's last rank 0 wrote that training finished; removes the
    folder."""
    if status_dir is None:
        return False
    try:
        with open(os.path.join(status_dir, "status")) as f:
            return f.read().strip() == "finished"
    except OSError:
        return False
    finally:
        shutil.rmtree(status_dir, ignore_errors=True)


def _run_mpirun(argv: list[str], env: dict[str, str], live: bool = False) -> int:
    """Run mpirun, stopping the job on SIGINT, SIGTERM or SIGHUP; returns its exit status
    (128 + N for signal N, and 128 + N when this process was asked to stop by signal N).

    The first such signal prints one line and is passed on to mpirun, which stops the
    ranks; a second SIGINT (Ctrl-C again) kills mpirun and every process below it at
    once. Processes of the job still there once mpirun has gone after a signal are
    killed too.

    ``live``: mpirun was asked for tagged raw output (``--output tag:raw``), which is
    read from pipes and written to this process's stdout and stderr by
    :func:`hvdlite.runner.output.forward`."""
    finish = None
    if live:
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            proc = subprocess.Popen(argv, env=env, stdout=out_w, stderr=err_w)
        except BaseException:
            for fd in (out_r, out_w, err_r, err_w):
                os.close(fd)
            raise
        os.close(out_w)
        os.close(err_w)
        finish = output.forward(out_r, err_r, sys.stdout, sys.stderr)
    else:
        proc = subprocess.Popen(argv, env=env)
    received: list[int] = []
    job: dict[int, int] = {}  # the job's processes when it was asked to stop: pid -> start time

    def say(text: str) -> None:
        try:
            print(f"{program_name()}: {text}", file=sys.stderr, flush=True)
        except (OSError, ValueError):
            pass

    def on_signal(signum: int, _frame: object) -> None:
        received.append(signum)
        job.update(_process_tree(proc.pid))
        if len(received) == 1:
            if signum == signal.SIGINT:
                say("interrupted, stopping the job (Ctrl-C again to kill it at once)")
            else:
                say(f"got {signal.Signals(signum).name}, stopping the job")
        elif signum == signal.SIGINT:
            say("killing the job")
            _kill_processes(job)
            try:
                proc.kill()  # where /proc could not list the job's processes
            except OSError:
                pass
            return
        try:
            proc.send_signal(signum)
        except ProcessLookupError:
            pass

    handled = [signal.SIGINT, signal.SIGTERM]
    if hasattr(signal, "SIGHUP"):
        handled.append(signal.SIGHUP)
    previous = {}
    try:
        for sig in handled:
            previous[sig] = signal.signal(sig, on_signal)
    except ValueError:
        # Not the main thread: signals cannot be handled here; mpirun still gets
        # a terminal's Ctrl-C directly since it shares our process group.
        pass
    try:
        returncode = proc.wait()
        if received:
            _kill_processes(job)  # whatever outlived mpirun (a rank's own children)
        if finish is not None:
            # The pipes end when the last process holding them (mpirun, its daemons)
            # has gone; a stray child of a rank may keep them open longer.
            finish(5.0)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if received:
        return 128 + received[0]
    if returncode < 0:
        return 128 - returncode
    return returncode


def _process_table() -> tuple[dict[int, list[int]], dict[int, int]]:
    """Every process's children and start time, from ``/proc`` (empty without it)."""
    children: dict[int, list[int]] = {}
    started: dict[int, int] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return children, started
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            parent, start = int(fields[1]), int(fields[19])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry))
        started[int(entry)] = start
    return children, started


def _process_tree(*roots: int, only: Mapping[int, int] | None = None) -> dict[int, int]:
    """The ``roots`` and every process below them, each with its start time (so that a
    pid used again later is not taken for it). With ``only`` (pid -> start time), a root
    counts only while it is still the process noted there."""
    children, started = _process_table()
    tree: dict[int, int] = {}
    todo = [r for r in roots if r in started and (only is None or only.get(r) == started[r])]
    while todo:
        pid = todo.pop()
        if pid in started and pid not in tree:
            tree[pid] = started[pid]
            todo.extend(children.get(pid, []))
    return tree


def _kill_processes(processes: Mapping[int, int]) -> None:
    """SIGKILL each noted process that is still the one noted, and everything now below
    it."""
    for pid in _process_tree(*processes, only=processes):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``hvdlite-run``, ``horovodrun`` and ``python -m hvdlite.runner``.

    Returns the exit status (the job's, or 2 for a usage error); the console
    script wrapper passes it to ``sys.exit``.
    """
    ns, config = parse_args(argv)
    if config is None:
        print(check_build_report(), flush=True)
        return 0
    try:
        return launch(config)
    except KeyboardInterrupt:  # before the job started (mpirun --version, discovery)
        print(f"{program_name()}: interrupted", file=sys.stderr, flush=True)
        return 128 + signal.SIGINT
    except LaunchError as exc:
        print(f"{program_name()}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"{program_name()}: error: could not start mpirun: {exc}", file=sys.stderr)
        return 127


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
