"""What ``hvdlite-run`` was asked to do (:class:`LaunchConfig`), independent of how the
command line was parsed, and the name the launcher was started under.

This module must stay importable without hvdlite's compiled core.
"""

from __future__ import annotations

import dataclasses
import os
import sys

__all__ = [
    "LaunchConfig",
    "program_name",
]


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
    # hvdlite's own: seconds of silence after which a worker counts as failed.
    failure_timeout: float | None = None

    @property
    def elastic(self) -> bool:
        """True when horovodrun's elastic mode is asked for (``--min-np``,
        ``--max-np`` or ``--host-discovery-script``)."""
        return (self.min_np is not None or self.max_np is not None
                or self.host_discovery_script is not None)



def program_name() -> str:
    """``horovodrun`` when the launcher was started under that name (the same program,
    installed under Horovod's name too), else ``hvdlite-run``."""
    return "horovodrun" if os.path.basename(sys.argv[0] or "") == "horovodrun" else "hvdlite-run"
