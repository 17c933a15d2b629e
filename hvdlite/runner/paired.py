"""Ranks paired with the processes of a cluster engine: Ray actors and Spark tasks.

A Ray actor or a Spark task cannot itself be an MPI rank: ``mpirun`` must start the
ranks, so that they share one ``MPI_COMM_WORLD`` that can shrink and grow as on
``hvdlite-run``. The integrations therefore run a normal ``mpirun`` job and pair each
of its ranks with one engine process, its *host*:

* the host listens (:class:`RankLink`); rank ``r`` connects to the ``r``-th address
  of :data:`LINKS_ENV` and proves that it belongs to the job with the key in
  :data:`KEY_ENV`; nothing is read from a connection before its key checks out;
* the host sends what its rank is to have on top of the launch's environment: the
  variables the engine set for it (``CUDA_VISIBLE_DEVICES`` for the GPUs Ray or Spark
  gave it, variables added with ``update_env_vars``), its working directory and
  ``sys.path``;
* the host then sends calls (``fn, args, kwargs``, pickled with cloudpickle); the rank
  runs each in turn in the same process, so a model loaded by one call is there for
  the next, and sends back the value or the exception with its traceback;
* the connection's end ends the rank at once, even in the middle of a call: a killed
  actor or a lost executor takes its rank with it, and ``mpirun`` ends the job.

``python -m hvdlite.runner.paired`` is the rank's side, started by ``mpirun``.

This module must stay importable without hvdlite's compiled core.
"""
from __future__ import annotations

import hmac
import os
import queue
import socket
import sys
import threading
import time
import traceback
from typing import Any, Callable

import cloudpickle

from hvdlite.runner.function import receive_message, send_message

#: Comma-separated ``host:port`` of every rank's host, indexed by rank.
LINKS_ENV = "HVDLITE_PAIRED_LINKS"
#: The job's key (hexadecimal); ranks send it first.
KEY_ENV = "HVDLITE_PAIRED_KEY"
#: Exit status of a rank whose host went away.
HOST_GONE_STATUS = 75

#: Prefixes of variables a host never passes to its rank: the launch sets its own.
_NOT_PASSED = ("OMPI_", "PMIX_", "PRTE_", "HVDLITE_PAIRED_", "HOROVOD_RANK", "HOROVOD_SIZE",
               "HOROVOD_LOCAL_", "HOROVOD_CROSS_", "HOROVOD_HOSTNAME")


class RankLost(RuntimeError):
    """The rank paired with this host has gone (its process ended, or the job did)."""


class RankTraceback(Exception):
    """The traceback of an exception raised on a rank, as text; chained as the cause of
    the exception a call re-raises on its host."""

    def __str__(self) -> str:
        return "\n" + str(self.args[0]) if self.args else ""


class RankError(RuntimeError):
    """A rank raised an exception that could not be sent back as itself."""


class RankLink:
    """The host's end of one rank's connection (a Ray actor's, a Spark task's).

    The rank always runs on the host's machine (``mpirun`` places it there), so the link
    listens on the loopback interface only, on a port of its own. :meth:`accept` waits
    for the rank, :meth:`call` runs a function there; calls from several threads run one
    after the other."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.rank: int | None = None
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._server.getsockname()[1]
        self._conn: socket.socket | None = None
        self._lock = threading.Lock()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def accept(self, rank: int, timeout: float, environ: dict[str, str] | None = None,
               cwd: str | None = None, path: list[str] | None = None,
               alive: Callable[[], bool] | None = None,
               defaults: dict[str, str] | None = None) -> None:
        """Wait up to ``timeout`` seconds for rank ``rank`` to connect, then send it
        ``environ`` (default: this process's variables that a rank takes from its
        host), ``defaults`` (variables it takes only where the launch did not set
        them), ``cwd`` and ``path`` (default: this process's). ``alive`` is asked every
        second; when it says no, the wait ends with :class:`RankLost`."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"rank {rank} did not connect within {timeout:g} s")
            if alive is not None and not alive():
                raise RankLost(f"the job ended before rank {rank} connected")
            self._server.settimeout(min(left, 1.0))
            try:
                conn, _ = self._server.accept()
            except (socket.timeout, TimeoutError):
                continue
            try:
                conn.settimeout(10.0)
                key, _, rank_text = receive_message(conn, limit=256).decode(
                    "ascii", "replace").partition(" ")
                if not hmac.compare_digest(key, self.key) or rank_text != str(rank):
                    conn.close()
                    continue
                env = host_environment() if environ is None else environ
                send_message(conn, cloudpickle.dumps(
                    ("setup", env, os.getcwd() if cwd is None else cwd,
                     list(sys.path) if path is None else path, dict(defaults or {}))))
                conn.settimeout(None)
            except (OSError, ConnectionError, ValueError):
                conn.close()
                continue
            self._conn, self.rank = conn, rank
            return

    def call(self, fn: Callable[..., Any], args: tuple = (), kwargs: dict | None = None) -> Any:
        """Run ``fn(*args, **kwargs)`` on the rank and return its value. An exception
        raised there is raised here with the rank's traceback as its cause (or as
        :class:`RankError` when it cannot be pickled); :class:`RankLost` when the rank
        has gone."""
        payload = cloudpickle.dumps((fn, tuple(args), dict(kwargs or {})))
        return reply_value(self.call_pickled(payload), self.rank)

    def call_pickled(self, payload: bytes) -> bytes:
        """Run the pickled ``(fn, args, kwargs)`` on the rank and return its reply as it
        came (:func:`reply_value` reads it): nothing of the user's is unpickled here,
        so this process needs none of the user's modules."""
        with self._lock:
            if self._conn is None:
                raise RankLost(f"rank {self.rank} is not connected" if self.rank is not None
                               else "no rank is paired with this process")
            try:
                send_message(self._conn, cloudpickle.dumps(("call", payload)))
                return receive_message(self._conn)
            except (OSError, ConnectionError, EOFError) as exc:
                self._drop()
                raise RankLost(f"rank {self.rank} ended in the middle of a call "
                               f"(its process, or the job, is gone: see the job's output)") from exc

    def close(self, status: int = 0) -> None:
        """Tell the rank to exit with ``status`` (when connected) and stop listening."""
        with self._lock:
            if self._conn is not None:
                try:
                    send_message(self._conn, cloudpickle.dumps(("exit", status)))
                except OSError:
                    pass
                self._drop()
        self._server.close()

    def _drop(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except OSError:
                pass
            self._conn = None


def reply_failed(reply: bytes) -> bool:
    """Whether a rank's reply reports an exception."""
    return reply[:1] == b"e"


def reply_traceback(reply: bytes) -> str:
    """The traceback text of a failed reply (without unpickling the exception)."""
    return cloudpickle.loads(reply[1:])[1]


def reply_value(reply: bytes, rank: int | None) -> Any:
    """The value a rank's reply carries, or its exception raised here, with the rank's
    traceback as its cause and, from Python 3.11, as a note shown under the caller's
    traceback."""
    if not reply_failed(reply):
        return cloudpickle.loads(reply[1:])
    exc_data, text = cloudpickle.loads(reply[1:])
    try:
        exc = cloudpickle.loads(exc_data) if exc_data is not None else None
    except Exception:
        exc = None
    if not isinstance(exc, BaseException):
        raise RankError(f"rank {rank} raised:\n{text}")
    where = f"on rank {rank}:\n{text}"
    if hasattr(exc, "add_note"):
        exc.add_note(where)
    raise exc from RankTraceback(where)


def host_environment() -> dict[str, str]:
    """This process's variables that its rank takes, all but the launch's own."""
    return {k: v for k, v in os.environ.items() if not k.startswith(_NOT_PASSED)}


# What the rank's calls share: the object ``start_executable`` made (Ray's executable_cls).
executable: Any = None


def start_executable(cls: Callable[..., Any], args: tuple, kwargs: dict) -> None:
    global executable
    executable = cls(*args, **kwargs)


def apply_to_executable(fn: Callable[[Any], Any]) -> Any:
    return fn(executable)


def update_environment(values: dict[str, str]) -> None:
    os.environ.update({str(k): str(v) for k, v in values.items()})


def _rank() -> int:
    for name in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    raise RuntimeError("no rank in the environment; this module is started through mpirun")


def _say(rank: int, text: str) -> None:
    try:
        print(f"hvdlite: rank {rank}: {text}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def _run_call(payload: bytes) -> bytes:
    """Run a pickled call; the reply: ``b"o"`` and the pickled value, or ``b"e"`` and the
    pickled (pickled exception or None, traceback text)."""
    try:
        fn, args, kwargs = cloudpickle.loads(payload)
        value = fn(*args, **kwargs)
    except BaseException as exc:
        text = "".join(traceback.format_exception(
            type(exc), exc, exc.__traceback__.tb_next if exc.__traceback__ else None))
        try:
            data = cloudpickle.dumps(exc)
            cloudpickle.loads(data)
        except Exception:
            data = None
        return b"e" + cloudpickle.dumps((data, text))
    try:
        return b"o" + cloudpickle.dumps(value)
    except Exception:
        return b"e" + cloudpickle.dumps(
            (None, f"the return value could not be pickled:\n{traceback.format_exc()}"))


def main() -> int:
    links, key = os.environ.get(LINKS_ENV), os.environ.get(KEY_ENV)
    if not links or not key:
        print(f"hvdlite.runner.paired: {LINKS_ENV} and {KEY_ENV} are not set; this module is "
              f"started by hvdlite's Ray and Spark integrations", file=sys.stderr)
        return 2
    rank = _rank()
    addresses = links.split(",")
    if rank >= len(addresses):
        _say(rank, f"no host for this rank ({len(addresses)} given)")
        return 2
    host, _, port = addresses[rank].rpartition(":")
    try:
        sock = socket.create_connection((host, int(port)), timeout=60.0)
        send_message(sock, f"{key} {rank}".encode("ascii"))
        _, environ, cwd, path, defaults = cloudpickle.loads(receive_message(sock))
    except (OSError, ConnectionError, EOFError) as exc:
        _say(rank, f"could not reach its host at {addresses[rank]}: {exc}")
        return HOST_GONE_STATUS
    for name, value in defaults.items():
        os.environ.setdefault(name, value)
    os.environ.update(environ)
    try:
        os.chdir(cwd)
    except OSError:
        pass
    sys.path[:0] = [p for p in path if p not in sys.path]
    sock.settimeout(None)

    calls: queue.Queue = queue.Queue()

    def read() -> None:
        while True:
            try:
                message = cloudpickle.loads(receive_message(sock))
            except Exception:
                # The host went away (a killed actor, a lost executor): end now, even in
                # the middle of a call, so that mpirun ends the job.
                _say(rank, "its host process went away; ending")
                os._exit(HOST_GONE_STATUS)
            calls.put(message)
            if message[0] == "exit":
                return

    threading.Thread(target=read, name="hvdlite-paired-reader", daemon=True).start()
    while True:
        message = calls.get()
        if message[0] == "exit":
            sock.close()
            return int(message[1])
        reply = _run_call(message[1])
        try:
            send_message(sock, reply)
        except OSError:
            os._exit(HOST_GONE_STATUS)



class PairedJob:
    """The ``mpirun`` job of paired ranks, run by :func:`hvdlite.runner.launch.launch`
    in a thread of its own, so that the caller goes on serving its engine.

    ``hosts``: ``[(hostname, ranks there)]`` in rank order; ``addresses``: each rank's
    host, ``"ip:port"``, indexed by rank. ``services``: ``{hostname: "ip:port"}`` of a
    :class:`~hvdlite.runner.remote.CommandService` on each host, which Open MPI reaches
    through the agent in place of ssh, with ``service_key``."""

    def __init__(self, hosts: list[tuple[str, int]], addresses: list[str], key: str,
                 environ: dict[str, str] | None = None, mpi_args: list[str] | None = None,
                 executable: str | None = None, network_interfaces: list[str] | None = None,
                 streams: tuple | None = None, verbose: bool = False,
                 prefix_timestamp: bool = False, services: dict[str, str] | None = None,
                 service_key: str | None = None) -> None:
        import tempfile

        from hvdlite.runner import remote
        from hvdlite.runner.config import LaunchConfig
        from hvdlite.runner.launch import launch

        self._config = LaunchConfig(
            num_proc=len(addresses),
            command=[executable or sys.executable, "-m", "hvdlite.runner.paired"],
            hosts=",".join(f"{h}:{n}" for h, n in hosts),
            mpi_args=list(mpi_args or []), verbose=verbose,
            network_interfaces=list(network_interfaces or []),
            prefix_timestamp=prefix_timestamp)
        env = dict(os.environ if environ is None else environ)
        env[LINKS_ENV] = ",".join(addresses)
        env[KEY_ENV] = key
        self._folder: tempfile.TemporaryDirectory | None = None
        if services:
            self._folder = tempfile.TemporaryDirectory(prefix="hvdlite-paired-")
            env["PRTE_MCA_plm_ssh_agent"] = remote.write_agent(self._folder.name)
            env[remote.SERVICES_ENV] = ",".join(f"{h}={a}" for h, a in services.items())
            env[remote.KEY_ENV] = service_key or key
        self._env = env
        self._launch = launch
        self._streams = streams
        self._stop = threading.Event()
        self.returncode: int | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="hvdlite-paired-job", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.returncode = self._launch(self._config, self._env, stop=self._stop,
                                           streams=self._streams)
        except BaseException as exc:  # reported by whoever waits on the job
            self.error = exc
            self.returncode = -1
        finally:
            if self._folder is not None:
                self._folder.cleanup()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def describe_end(self) -> str:
        """Why the job ended, in words."""
        if self.error is not None:
            return f"mpirun could not run the job: {self.error}"
        return f"mpirun ended with exit status {self.returncode}"

    def wait(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds for the job to end; whether it did."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def stop(self, timeout: float = 15.0) -> None:
        """Stop the job as ``hvdlite-run`` does on SIGTERM and wait (bounded) for it."""
        self._stop.set()
        self._thread.join(timeout)


if __name__ == "__main__":
    sys.exit(main())
