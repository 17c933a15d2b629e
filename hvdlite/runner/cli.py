"""``hvdlite-run`` (also installed as ``horovodrun``): the command line.

Usage::

    hvdlite-run -np 4 python train.py
    hvdlite-run -np 8 -H node1:4,node2:4 --fusion-threshold-mb 32 python train.py
    hvdlite-run -np 8 --hostfile hosts.txt --timeline-filename /tmp/tl.json python train.py
    hvdlite-run --check-build
    sbatch -N 2 --ntasks-per-node 4 --wrap "hvdlite-run -np 8 python train.py"
    hvdlite-run -np 8 -H node1:4,node2:4 -p 2222 --network-interface eth0 python train.py
    hvdlite-run -np 8 --min-np 4 --max-np 12 --host-discovery-script ./hosts.sh python train.py

horovodrun's options work with their horovodrun meaning; the ones for features
hvdlite does not have (Gloo, a YAML config file, ...) are usage errors that say so
(:data:`UNSUPPORTED_HOROVODRUN_OPTIONS`). :func:`parse_args` turns the command line
into a :class:`~hvdlite.runner.config.LaunchConfig`; :func:`main` runs it with
:func:`~hvdlite.runner.launch.launch`.

This module must stay importable without hvdlite's compiled core.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
from collections.abc import Sequence

from hvdlite.runner.check_build import check_build_report, hvdlite_version
from hvdlite.runner.command import LOG_LEVELS
from hvdlite.runner.config import LaunchConfig, program_name
from hvdlite.runner.hosts import parse_hostfile, parse_hosts
from hvdlite.runner.launch import launch
from hvdlite.runner.mpirun import LaunchError

__all__ = [
    "UNSUPPORTED_HOROVODRUN_OPTIONS",
    "main",
    "make_parser",
    "parse_args",
]

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
    el.add_argument("--failure-timeout", type=_positive_float, metavar="S",
                    help="a worker that sends nothing for S seconds (its host cut off from "
                         "the network, its process stopped) counts as failed, and the others "
                         "go on without it (default: $HVDLITE_FAILURE_TIMEOUT, else 10)")
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
                            ("--failure-timeout", ns.failure_timeout),
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
        failure_timeout=ns.failure_timeout,
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
