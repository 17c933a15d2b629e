"""``hvdlite.run(func, ...)``: Horovod's function API of its launcher.

``run`` starts ``num_proc`` processes through the same ``mpirun`` command line as
``hvdlite-run``; each process calls ``func(*args, **kwargs)`` and ``run`` returns the
return values as a list indexed by rank.

How the function and the results travel: the calling process (the driver) listens on a
TCP socket. Every rank runs :mod:`hvdlite.runner.task`, connects to the driver, proves
that it belongs to this job with a random key that only the job's environment carries,
receives the pickled ``(func, args, kwargs)``, runs it and sends back its pickled
result, or the formatted exception. Nothing is read from a connection before its key
checks out, since unpickling runs code. This needs no shared file system between hosts;
remote ranks need a route back to the driver (``HVDLITE_RUN_DRIVER_ADDRESS`` names the
address to use when the default, this host's name, is not it).

Functions are pickled with ``cloudpickle``, so lambdas and functions defined in a
notebook or in ``__main__`` travel by value; functions of importable modules travel by
reference and need the module on the ranks (ranks start in the driver's working
directory with its environment).
"""
from __future__ import annotations

import hmac
import os
import secrets
import shlex
import socket
import struct
import sys
import threading
import warnings
from typing import Any, Callable, Sequence

import cloudpickle

from hvdlite.runner import slurm
from hvdlite.runner.config import LaunchConfig
from hvdlite.runner.hosts import is_local_host, parse_hostfile, parse_hosts
from hvdlite.runner.launch import launch

DRIVER_ENV = "HVDLITE_RUN_DRIVER"
KEY_ENV = "HVDLITE_RUN_KEY"
ADDRESS_ENV = "HVDLITE_RUN_DRIVER_ADDRESS"

_LENGTH = struct.Struct("!Q")


def send_message(sock: socket.socket, payload: bytes) -> None:
    sock.sendall(_LENGTH.pack(len(payload)) + payload)


def _receive_exactly(sock: socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            raise ConnectionError("the connection closed in the middle of a message")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def receive_message(sock: socket.socket, limit: int | None = None) -> bytes:
    (n,) = _LENGTH.unpack(_receive_exactly(sock, _LENGTH.size))
    if limit is not None and n > limit:
        raise ConnectionError(f"message of {n} bytes where at most {limit} were expected")
    return _receive_exactly(sock, n)


class Driver:
    """The driver's side: serves the pickled call to each rank and collects results.

    Each connection starts with ``key`` followed by the rank number; connections with
    any other key are closed unread."""

    def __init__(self, payload: bytes, num_proc: int, host: str) -> None:
        self.payload = payload
        self.num_proc = num_proc
        self.key = secrets.token_hex(32)
        self.results: dict[int, Any] = {}
        self.errors: dict[int, str] = {}
        self.rejected = 0
        self._lock = threading.Lock()
        self._listener = Listener(host, self._serve, "hvdlite-run-driver")
        self.port = self._listener.port

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.settimeout(60.0)
                hello = receive_message(conn, limit=256).decode("ascii", "replace")
                key, _, rank_text = hello.partition(" ")
                if not hmac.compare_digest(key, self.key) or not rank_text.isdigit():
                    with self._lock:
                        self.rejected += 1
                    return
                rank = int(rank_text)
                send_message(conn, self.payload)
                conn.settimeout(None)  # the function runs as long as it runs
                status, value = cloudpickle.loads(receive_message(conn))
            except (OSError, ConnectionError, EOFError, ValueError):
                return
            with self._lock:
                if status == "ok":
                    self.results[rank] = value
                else:
                    self.errors[rank] = value

    def close(self) -> None:
        self._listener.close(wait_for_handlers=5.0)


class Listener:
    """A TCP listener on ``host`` (``""``: every interface), on a port of its own: each
    connection goes to ``handle(conn)``, in a thread of its own, or in the accepting
    thread with ``inline`` (for handlers that return at once), until :meth:`close`."""

    def __init__(self, host: str, handle: Callable[[socket.socket], None], name: str,
                 inline: bool = False) -> None:
        self._handle = handle
        self._inline = inline
        self._server = socket.create_server((host, 0))
        self._server.settimeout(0.2)
        self.port: int = self._server.getsockname()[1]
        self._stop = threading.Event()
        self._handlers: list[threading.Thread] = []
        self._acceptor = threading.Thread(target=self._accept, name=name, daemon=True)
        self._acceptor.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except (socket.timeout, TimeoutError):
                continue
            except OSError:
                return
            if self._inline:
                self._handle(conn)
                continue
            t = threading.Thread(target=self._handle, args=(conn,), daemon=True)
            t.start()
            self._handlers.append(t)

    def close(self, wait_for_handlers: float = 0.0) -> None:
        """Stop accepting; wait up to ``wait_for_handlers`` seconds for each handler."""
        self._stop.set()
        self._acceptor.join()
        self._server.close()
        if wait_for_handlers:
            for t in self._handlers:
                t.join(timeout=wait_for_handlers)


def _driver_address(hosts: list[tuple[str, int | None]]) -> tuple[str, str]:
    """(address to listen on, address the ranks connect to)."""
    named = os.environ.get(ADDRESS_ENV)
    if named:
        return "", named
    if all(is_local_host(h) for h, _ in hosts):
        return "127.0.0.1", "127.0.0.1"
    return "", socket.getfqdn()


def _refuse(**given: Any) -> None:
    for name, value in given.items():
        if value is not None:
            raise NotImplementedError(
                f"hvdlite.run({name}=...): hvdlite.run starts a fixed number of processes "
                f"(num_proc); for elastic training put the function in a script and launch it "
                f"with hvdlite-run --min-np/--max-np")


def run(func: Callable[..., Any], args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None,
        num_proc: int | None = None, min_num_proc: int | None = None,
        max_num_proc: int | None = None, slots: int | None = None,
        reset_limit: int | None = None, cooldown_range: Any = None, hosts: str | None = None,
        hostfile: str | None = None, host_discovery_script: str | None = None,
        start_timeout: float | None = None, ssh_port: int | None = None,
        ssh_identity_file: str | None = None, disable_cache: bool | None = None,
        output_filename: str | None = None, verbose: bool | None = None,
        use_gloo: bool | None = None, use_mpi: bool | None = None,
        mpi_args: str | None = None, network_interface: str | None = None,
        network_interfaces: Sequence[str] | None = None, executable: str | None = None,
        np: int | None = None, min_np: int | None = None, max_np: int | None = None) -> list[Any]:
    """Run ``func(*args, **kwargs)`` in ``num_proc`` processes and return the list of their
    return values, indexed by rank (Horovod's ``horovod.run``, same arguments in the same
    order). ``func`` calls ``hvd.init()`` itself, as in a training script.

    ``hosts`` (``"host1:2,host2:2"``) or ``hostfile`` place the processes, as for
    ``hvdlite-run``; ``mpi_args`` (a string) goes to ``mpirun``; ``executable`` is the
    Python that runs on the ranks (default: this one). ``np`` is the deprecated spelling
    of ``num_proc``. ``start_timeout``, ``disable_cache``, ``use_mpi`` and ``slots`` are
    accepted and have no effect (hvdlite always launches through ``mpirun``). Elastic
    arguments (``min_num_proc``, ``max_num_proc``, ``reset_limit``, ``cooldown_range``,
    ``host_discovery_script``) and ``use_gloo=True`` raise ``NotImplementedError``.

    If any rank raises, or the job fails, ``RuntimeError`` is raised with the failing
    ranks' tracebacks.
    """
    if np is not None:
        warnings.warn("hvdlite.run(np=...) is deprecated; use num_proc", DeprecationWarning,
                      stacklevel=2)
        num_proc = np if num_proc is None else num_proc
    _refuse(min_num_proc=min_num_proc, max_num_proc=max_num_proc, reset_limit=reset_limit,
            cooldown_range=cooldown_range, host_discovery_script=host_discovery_script,
            min_np=min_np, max_np=max_np)
    if use_gloo:
        raise NotImplementedError("hvdlite.run(use_gloo=True): hvdlite runs on MPI only")
    num_proc = 1 if num_proc is None else int(num_proc)
    if num_proc < 1:
        raise ValueError(f"hvdlite.run: num_proc must be at least 1, got {num_proc}")
    if not callable(func):
        raise TypeError(f"hvdlite.run: func must be callable, got {type(func).__name__}")
    del start_timeout, disable_cache, use_mpi, slots

    # Where the ranks run decides where they reach this process: the launch places them
    # on a Slurm allocation's nodes when no hosts are given.
    host_list = (parse_hosts(hosts) if hosts else parse_hostfile(hostfile) if hostfile
                 else slurm.allocation_hosts(os.environ) or [("localhost", None)])
    listen_on, connect_to = _driver_address(host_list)
    payload = cloudpickle.dumps((func, tuple(args), dict(kwargs or {})))
    interfaces = list(network_interfaces or [])
    if network_interface:
        interfaces += [i for i in network_interface.split(",") if i]
    driver = Driver(payload, num_proc, listen_on)
    try:
        config = LaunchConfig(
            num_proc=num_proc,
            command=[executable or sys.executable, "-m", "hvdlite.runner.task"],
            hosts=hosts, hostfile=hostfile if not hosts else None,
            mpi_args=shlex.split(mpi_args) if mpi_args else [], verbose=bool(verbose),
            ssh_port=ssh_port, ssh_identity_file=ssh_identity_file,
            network_interfaces=interfaces, output_filename=output_filename)
        environ = dict(os.environ)
        environ[DRIVER_ENV] = f"{connect_to}:{driver.port}"
        environ[KEY_ENV] = driver.key
        returncode = launch(config, environ)
    finally:
        driver.close()

    if driver.errors:
        details = "\n".join(f"--- rank {r} ---\n{tb}" for r, tb in sorted(driver.errors.items()))
        raise RuntimeError(f"hvdlite.run: {func_name(func)} raised on rank(s) "
                           f"{', '.join(map(str, sorted(driver.errors)))}:\n{details}")
    missing = [r for r in range(num_proc) if r not in driver.results]
    if returncode != 0 or missing:
        raise RuntimeError(f"hvdlite.run: the job ended with exit status {returncode}; no "
                           f"result from rank(s) {', '.join(map(str, missing)) or 'none'}")
    return [driver.results[r] for r in range(num_proc)]


def func_name(func: Callable[..., Any]) -> str:
    return getattr(func, "__qualname__", None) or repr(func)


__all__ = ["run"]
