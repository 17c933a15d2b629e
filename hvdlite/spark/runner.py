"""``hvdlite.spark.run``: Horovod's Spark API on hvdlite, with MPI as the transport.

How it runs (the reasons are in the Spark guide): one Spark job of ``num_proc`` tasks
in barrier mode, so that all start together or none does. Each task registers with
this process (the driver) and waits; once all have, the driver orders them by host,
starts an ``mpirun`` job whose rank ``r`` pairs with the ``r``-th task
(:mod:`hvdlite.runner.paired`), and each task has its rank run the function and
returns the value to Spark. A lost task ends its rank and so the job; a failed rank
ends the tasks' wait and so the Spark job.
"""
from __future__ import annotations

import hmac
import os
import secrets
import shlex
import socket
import sys
import threading
import time
import uuid
from typing import Any, Callable, TextIO

import cloudpickle

from hvdlite.runner.function import Listener, func_name, receive_message, send_message
from hvdlite.runner.remote import CommandService
from hvdlite.runner.paired import (PairedJob, RankLink, RankLost, host_environment, reply_failed,
                                   reply_traceback, reply_value)

#: Seconds the tasks may take to start when neither ``start_timeout`` nor
#: ``HOROVOD_SPARK_START_TIMEOUT`` says (Horovod's default).
DEFAULT_START_TIMEOUT = 600.0


def _active_context() -> Any:
    try:
        from pyspark import SparkContext
    except ImportError as exc:
        raise ImportError("hvdlite.spark needs PySpark: pip install 'hvdlite[spark]'") from exc
    sc = SparkContext._active_spark_context
    if sc is None:
        raise Exception("Could not find an active SparkContext, are you running in a PySpark session?")
    return sc


class _Registry:
    """The driver's end of the tasks' registrations: each task connects, sends the job's
    key and what it is, and waits on the connection for its rank."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.tasks: dict[int, dict[str, Any]] = {}
        self._conns: dict[int, socket.socket] = {}
        self._lock = threading.Lock()
        self._listener = Listener("", self._register, "hvdlite-spark-registry")
        self.port = self._listener.port

    def _register(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(10.0)
            key, _, rest = receive_message(conn, limit=4096).decode("utf-8", "replace").partition(" ")
            if not hmac.compare_digest(key, self.key):
                conn.close()
                return
            info = dict(item.split("=", 1) for item in rest.split("\n") if "=" in item)
            partition = int(info["partition"])
            conn.settimeout(None)
        except (OSError, ConnectionError, ValueError, KeyError):
            conn.close()
            return
        with self._lock:
            self.tasks[partition] = info
            self._conns[partition] = conn

    def answer(self, ranks: dict[int, int]) -> None:
        for partition, rank in ranks.items():
            try:
                send_message(self._conns[partition], str(rank).encode())
            except OSError:
                pass

    def release(self) -> None:
        """Tell every task that the job has ended."""
        for conn in self._conns.values():
            try:
                send_message(conn, b"done")
            except OSError:
                pass

    def close(self) -> None:
        self._listener.close()
        for conn in self._conns.values():
            try:
                conn.close()
            except OSError:
                pass


def _task_function(driver: str, key: str, start_timeout: float, call: bytes) -> Callable:
    """What each Spark task runs: register, pair with its rank, have it run the call,
    and stay until the driver says the job has ended."""

    def task(_: Any) -> Any:
        from pyspark import BarrierTaskContext

        ctx = BarrierTaskContext.get()
        partition = ctx.partitionId()
        link = RankLink(key)
        # Open MPI reaches this host through a task's command service here (no ssh);
        # the daemon it starts lives as long as the job, so the task stays as long.
        service = CommandService(key)
        gpus = ctx.resources().get("gpu")
        gpu_ids = ",".join(gpus.addresses) if gpus is not None else ""
        host, _, port = driver.rpartition(":")
        rank = None
        try:
            with socket.create_connection((host, int(port)), timeout=60.0) as sock:
                here = sock.getsockname()[0]  # the address the driver reaches this host by
                send_message(sock, f"{key} partition={partition}\nhostname={socket.gethostname()}\n"
                                   f"address={link.address}\ngpus={gpu_ids}\n"
                                   f"service={here}:{service.port}".encode())
                sock.settimeout(start_timeout + 30.0)
                try:
                    rank = int(receive_message(sock, limit=64).decode())
                except (OSError, ConnectionError, ValueError):
                    return [(partition, None, "lost", "the driver went away before the job started")]
                forced = {"CUDA_VISIBLE_DEVICES": gpu_ids} if gpus is not None else {}
                try:
                    link.accept(rank, start_timeout, environ=forced, defaults=host_environment())
                    reply = link.call_pickled(call)
                except (RankLost, TimeoutError) as exc:
                    return [(partition, rank, "lost", str(exc))]
                # A rank that raised ends the job: the others may be waiting for it.
                link.close(status=1 if reply_failed(reply) else 0)
                # Wait for the driver to see the job end (or go away itself).
                sock.settimeout(None)
                try:
                    receive_message(sock, limit=64)
                except (OSError, ConnectionError):
                    pass
                return [(partition, rank, "reply", reply)]
        finally:
            link.close()
            service.close()

    return task


def run(fn: Callable[..., Any], args: tuple = (), kwargs: dict | None = None,
        num_proc: int | None = None, start_timeout: float | None = None,
        extra_mpi_args: str | None = None, env: dict[str, str] | None = None,
        stdout: TextIO | None = None, stderr: TextIO | None = None, verbose: int = 1,
        nics: set[str] | None = None, prefix_output_with_timestamp: bool = False,
        use_mpi: bool | None = None, use_gloo: bool | None = None,
        executable: str | None = None) -> list[Any]:
    """Run ``fn(*args, **kwargs)`` on ``num_proc`` ranks, one per Spark task of the active
    session, and return the values ordered by rank (Horovod's ``horovod.spark.run``).

    Args:
        num_proc: ranks, default the context's ``defaultParallelism``.
        start_timeout: seconds the Spark tasks may take to start, all together (barrier
            mode); default ``$HOROVOD_SPARK_START_TIMEOUT`` or 600.
        extra_mpi_args: more ``mpirun`` options, as one string.
        env: the ranks' environment (default ``os.environ``); the executors' variables
            fill in what it does not set.
        stdout: where the ranks' standard output goes (default: this process's).
        stderr: where the ranks' standard error goes (default: this process's).
        verbose: 2 or more prints the ``mpirun`` command.
        nics: the network interfaces MPI uses.
        prefix_output_with_timestamp: start each output line with the time.
        use_mpi: accepted (hvdlite always uses MPI). ``use_gloo=True`` is refused.
        executable: the Python the ranks run (default: this one).

    Raises:
        TimeoutError: the tasks did not all start within ``start_timeout`` (too few
            free slots in the cluster, say); the Spark job is cancelled.
        RuntimeError: a rank raised (its traceback is in the message), or the job or
            the Spark job failed (a lost executor, say).
    """
    if use_gloo:
        raise NotImplementedError("hvdlite.spark.run(use_gloo=True): hvdlite runs on MPI only")
    del use_mpi
    for name, value in (env or {}).items():
        if name in ("HOROVOD_CONTROLLER", "HOROVOD_CPU_OPERATIONS") and str(value).lower() == "gloo":
            raise ValueError(f"hvdlite.spark.run(env=...): {name}={value} asks for Horovod's Gloo "
                             f"controller; hvdlite runs on MPI only")
    sc = _active_context()
    if sc.getConf().get("spark.dynamicAllocation.enabled", "false").lower() == "true":
        raise ValueError("hvdlite.spark.run: spark.dynamicAllocation.enabled is true; hvdlite runs its "
                         "tasks in Spark's barrier mode, which Spark refuses with dynamic allocation "
                         "(set spark.dynamicAllocation.enabled=false for this application)")
    num_proc = int(num_proc or sc.defaultParallelism)
    if num_proc < 1:
        raise ValueError(f"hvdlite.spark.run: num_proc must be at least 1, got {num_proc}")
    if start_timeout is None:
        start_timeout = float(os.environ.get("HOROVOD_SPARK_START_TIMEOUT", DEFAULT_START_TIMEOUT))
    key = secrets.token_hex(32)
    registry = _Registry(key)
    driver_host = sc.getConf().get("spark.driver.host") or socket.gethostname()
    call = cloudpickle.dumps((fn, tuple(args), dict(kwargs or {})))
    task = _task_function(f"{driver_host}:{registry.port}", key, float(start_timeout), call)
    group = f"hvdlite.spark.run-{uuid.uuid4().hex[:12]}"
    outcome: dict[str, Any] = {}

    def collect() -> None:
        try:
            sc.setJobGroup(group, f"hvdlite.spark.run({func_name(fn)}) on {num_proc} ranks",
                           interruptOnCancel=True)
            outcome["results"] = (sc.parallelize(range(num_proc), num_proc).barrier()
                                  .mapPartitions(task).collect())
        except BaseException as exc:
            outcome["error"] = exc

    from pyspark import InheritableThread
    spark_job = InheritableThread(target=collect, name="hvdlite-spark-job", daemon=True)
    job: PairedJob | None = None
    started = time.monotonic()
    try:
        spark_job.start()
        # All tasks start together, or the job stays queued until Spark has the slots.
        while len(registry.tasks) < num_proc:
            if not spark_job.is_alive():
                raise RuntimeError(f"hvdlite.spark.run: the Spark job failed before every task "
                                   f"started: {_first_line(outcome.get('error'))}")
            if time.monotonic() - started > start_timeout:
                raise TimeoutError(
                    f"Timed out waiting for Spark tasks to start. {len(registry.tasks)} of "
                    f"{num_proc} task(s) started within {start_timeout:g} s; the cluster may "
                    f"have fewer than {num_proc} free task slots (defaultParallelism is "
                    f"{sc.defaultParallelism}). Check the cluster's resources, or raise "
                    f"start_timeout (HOROVOD_SPARK_START_TIMEOUT)")
            time.sleep(0.05)
        tasks = registry.tasks
        # Ranks contiguous per host: hosts in the order of their lowest partition.
        hosts: dict[str, list[int]] = {}
        for partition in sorted(tasks):
            hosts.setdefault(tasks[partition]["hostname"], []).append(partition)
        order = [p for ps in hosts.values() for p in ps]
        ranks = {p: r for r, p in enumerate(order)}
        streams = (stdout or sys.stdout, stderr or sys.stderr)
        job = PairedJob([(h, len(ps)) for h, ps in hosts.items()],
                        [tasks[p]["address"] for p in order], key,
                        environ=dict(os.environ if env is None else env),
                        mpi_args=shlex.split(extra_mpi_args) if extra_mpi_args else [],
                        executable=executable, network_interfaces=sorted(nics or []),
                        streams=streams, verbose=verbose >= 2,
                        prefix_timestamp=prefix_output_with_timestamp,
                        services={h: tasks[ps[0]]["service"] for h, ps in hosts.items()})
        registry.answer(ranks)
        released = False
        while spark_job.is_alive():
            spark_job.join(0.2)
            if not released and not job.running:
                registry.release()
                released = True
    except BaseException:
        sc.cancelJobGroup(group)
        if job is not None:
            job.stop()
        spark_job.join(10.0)
        raise
    finally:
        registry.close()
    if job is not None and not job.wait(30.0):
        job.stop()
    if "error" in outcome:
        raise RuntimeError(f"hvdlite.spark.run: the Spark job failed: "
                           f"{_first_line(outcome['error'])}") from outcome["error"]
    by_rank = {rank: (status, payload) for _, rank, status, payload in outcome["results"]}
    errors = {r: reply_traceback(p) for r, (s, p) in by_rank.items()
              if s == "reply" and reply_failed(p)}
    if errors:
        details = "\n".join(f"--- rank {r} ---\n{tb}" for r, tb in sorted(errors.items()))
        raise RuntimeError(f"hvdlite.spark.run: {func_name(fn)} raised on rank(s) "
                           f"{', '.join(map(str, sorted(errors)))}:\n{details}")
    lost = {r: p for r, (s, p) in by_rank.items() if s != "reply"}
    if lost:
        why = job.describe_end() if job is not None else "the job did not start"
        raise RuntimeError(f"hvdlite.spark.run: no result from rank(s) "
                           f"{', '.join(map(str, sorted(lost)))} ({why}): {next(iter(lost.values()))}")
    return [reply_value(by_rank[r][1], r) for r in range(num_proc)]


def _first_line(exc: BaseException | None) -> str:
    if exc is None:
        return "no reason given"
    text = str(exc).strip()
    for line in text.splitlines():
        if "Exception" in line or "Error" in line or "abort" in line.lower():
            return line.strip()
    return text.splitlines()[0] if text else type(exc).__name__


def run_elastic(*args: Any, **kwargs: Any) -> list[Any]:
    """Not available: Horovod's ``horovod.spark.run_elastic`` runs on its Gloo
    controller, and a Spark job in barrier mode ends when any task is lost. For elastic
    training use ``hvdlite-run --min-np/--max-np``, or Ray."""
    raise NotImplementedError(
        "hvdlite.spark.run_elastic: Horovod's Spark elastic mode needs its Gloo controller, and "
        "hvdlite runs Spark jobs in barrier mode, where one lost task ends the stage; use "
        "hvdlite-run --min-np/--max-np with a host discovery script for elastic training")
