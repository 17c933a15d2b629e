"""Reaching other hosts without ssh: a command service in a process of each host (a
Ray actor, a Spark task) and an agent that Open MPI runs in place of ssh.

Open MPI starts its daemon on a remote host by running ``AGENT [ssh options] HOST
"<command line>"`` (its ``plm_ssh_agent``). On a Ray or Spark cluster there is no sshd
and no key, but there is a process of the job on every host: its first Ray actor or
Spark task there runs a :class:`CommandService`. The agent (``python -m
hvdlite.runner.remote HOST COMMAND``, through the script :func:`write_agent` makes)
connects to the service of HOST (the addresses are in :data:`SERVICES_ENV`), proves it
belongs to the job with the key in :data:`KEY_ENV`, has the service run the command
line, relays its output and ends with its exit status.

The command runs as a child of the service: it has the engine's environment on that
host (as the actor or task does), and it dies with the process that hosts the service
(``PR_SET_PDEATHSIG``), or when the agent's connection ends. Open MPI then hears that
it lost the daemon of that host, as it would when ssh's connection drops.

This module must stay importable without hvdlite's compiled core.
"""
from __future__ import annotations

import ctypes
import hmac
import os
import signal
import socket
import stat
import subprocess
import sys
import threading

from hvdlite.runner.function import Listener, receive_message, send_message

#: ``host=address:port`` of every host's command service, comma-separated; or ``@PATH``,
#: a file of such lines, read at each start (an elastic job's hosts change).
SERVICES_ENV = "HVDLITE_REMOTE_SERVICES"
#: The job's key (hexadecimal); the agent sends it first.
KEY_ENV = "HVDLITE_REMOTE_KEY"

#: ssh's options that take a value (the agent skips them, as Open MPI may pass some).
_SSH_OPTIONS_WITH_VALUE = set("bcDEeFIiJLlmOopQRSWw")
_OUT, _ERR, _EXIT = b"1", b"2", b"x"


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the thread that started it ends (the
    service's connection thread, which lives as long as its host process)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    os.setsid()


class CommandService:
    """Runs the agent's command lines on this host, for the job that knows ``key``.

    Listens on every interface (the agent runs where ``mpirun`` runs, on another host),
    on a port of its own; nothing is read from a connection before its key checks out.
    """

    def __init__(self, key: str) -> None:
        self.key = key
        self._children: set[subprocess.Popen] = set()
        self._lock = threading.Lock()
        self._listener = Listener("", self._serve, "hvdlite-command-service")
        self.port: int = self._listener.port

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.settimeout(10.0)
                key, _, command = receive_message(conn, limit=1 << 20).decode(
                    "utf-8", "replace").partition("\n")
                if not hmac.compare_digest(key, self.key):
                    return
            except (OSError, ConnectionError, ValueError):
                return
            env = dict(os.environ)
            # Open MPI's daemon (prted) lies beside this Python, in the same environment.
            env["PATH"] = os.pathsep.join([os.path.join(sys.prefix, "bin"), env.get("PATH", "")])
            try:
                child = subprocess.Popen(["/bin/sh", "-c", command], stdin=subprocess.DEVNULL,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         env=env, preexec_fn=_die_with_parent)
            except OSError as exc:
                _send(conn, _ERR + f"hvdlite command service: {exc}\n".encode())
                _send(conn, _EXIT + b"127")
                return
            with self._lock:
                self._children.add(child)
            conn.settimeout(None)
            pumps = [threading.Thread(target=_pump, args=(pipe, tag, conn), daemon=True)
                     for pipe, tag in ((child.stdout, _OUT), (child.stderr, _ERR))]
            for p in pumps:
                p.start()
            # The agent's end closing (Open MPI gave up on the host, the job ended) ends
            # the command too.
            watcher = threading.Thread(target=_watch_agent, args=(conn, child), daemon=True)
            watcher.start()
            status = child.wait()
            for p in pumps:
                p.join(5.0)
            with self._lock:
                self._children.discard(child)
            _send(conn, _EXIT + str(status if status >= 0 else 128 - status).encode())

    def close(self) -> None:
        """Stop listening and end the commands still running."""
        self._listener.close()
        with self._lock:
            children = list(self._children)
        for child in children:
            try:
                os.killpg(child.pid, signal.SIGKILL)
            except OSError:
                pass


def _send(conn: socket.socket, frame: bytes) -> None:
    try:
        send_message(conn, frame)
    except OSError:
        pass


def _pump(pipe, tag: bytes, conn: socket.socket) -> None:
    with pipe:
        for chunk in iter(lambda: pipe.read1(65536), b""):
            _send(conn, tag + chunk)


def _watch_agent(conn: socket.socket, child: subprocess.Popen) -> None:
    try:
        while conn.recv(1):
            pass
    except OSError:
        pass
    if child.poll() is None:
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except OSError:
            pass


def write_agent(folder: str) -> str:
    """Write the agent script Open MPI runs in place of ssh into ``folder``; its path
    (for ``PRTE_MCA_plm_ssh_agent``: a path without spaces or colons)."""
    path = os.path.join(folder, "hvdlite-agent")
    with open(path, "w") as f:
        f.write(f"#!/bin/sh\nexec {sys.executable} -m hvdlite.runner.remote \"$@\"\n")
    os.chmod(path, stat.S_IRWXU)
    return path


def read_services(value: str) -> dict[str, str]:
    """The host -> service address map that :data:`SERVICES_ENV` holds or names."""
    if value.startswith("@"):
        try:
            with open(value[1:]) as f:
                value = ",".join(f.read().split())
        except OSError:
            value = ""
    return dict(item.split("=", 1) for item in value.split(",") if "=" in item)


def write_services(path: str, services: dict[str, str]) -> None:
    """Replace the map file at ``path`` at once (the agent may be reading it)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write("".join(f"{h}={a}\n" for h, a in services.items()))
    os.replace(tmp, path)


def _parse_agent_argv(argv: list[str]) -> tuple[str, str]:
    """``[ssh options] HOST COMMAND...`` -> (HOST, the command line)."""
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        flag = argv[i]
        i += 2 if len(flag) == 2 and flag[1] in _SSH_OPTIONS_WITH_VALUE else 1
    if i >= len(argv):
        raise ValueError("no host given")
    return argv[i], " ".join(argv[i + 1:])


def agent(argv: list[str]) -> int:
    try:
        host, command = _parse_agent_argv(argv)
    except ValueError as exc:
        print(f"hvdlite agent: {exc}", file=sys.stderr)
        return 255
    services = read_services(os.environ.get(SERVICES_ENV, ""))
    key = os.environ.get(KEY_ENV, "")
    address = services.get(host) or services.get(host.split(".")[0])
    if address is None or not key:
        print(f"hvdlite agent: no command service for host {host!r} (known: "
              f"{', '.join(sorted(services)) or 'none'})", file=sys.stderr)
        return 255
    where, _, port = address.rpartition(":")
    try:
        conn = socket.create_connection((where, int(port)), timeout=30.0)
        send_message(conn, f"{key}\n{command}".encode())
        conn.settimeout(None)
    except OSError as exc:
        print(f"hvdlite agent: cannot reach the command service of {host} at {address}: {exc}",
              file=sys.stderr)
        return 255
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda *_: os._exit(255))
    out, err = sys.stdout.buffer, sys.stderr.buffer
    with conn:
        while True:
            try:
                frame = receive_message(conn)
            except (OSError, ConnectionError):
                print(f"hvdlite agent: lost the connection to {host}", file=sys.stderr)
                return 255
            tag, data = frame[:1], frame[1:]
            if tag == _EXIT:
                return int(data)
            stream = out if tag == _OUT else err
            stream.write(data)
            stream.flush()


if __name__ == "__main__":
    sys.exit(agent(sys.argv[1:]))
