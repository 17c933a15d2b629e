"""Running a job: :func:`launch` starts ``mpirun`` with the command
:func:`~hvdlite.runner.command.build_mpirun_command` makes and watches it to the end.

Ctrl-C (or SIGTERM, SIGHUP) stops the job, a second Ctrl-C kills it at once, and a job
that has not stopped :data:`STOP_GRACE_SECONDS` after the first is killed
(:func:`_run_mpirun`); the launcher exits with the job's status, ``128 + N`` for a job
stopped by signal N. An elastic job that finished its training counts as a success
even when mpirun reports the workers lost on the way.

This module must stay importable without hvdlite's compiled core.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import TextIO

from hvdlite.common import kept_commits
from hvdlite.common.discovery import LAUNCHER_REQUEST, format_hosts, same_host
from hvdlite.runner import output
from hvdlite.runner.evict import Requests
from hvdlite.runner.command import build_mpirun_command, live_output
from hvdlite.runner.config import LaunchConfig, program_name
from hvdlite.runner.hosts import elastic_settings, given_hosts, is_local_host, wait_for_slots
from hvdlite.runner.mpirun import find_mpirun, mpirun_version
from hvdlite.runner.processes import kill_processes, process_tree
from hvdlite.runner.session_dirs import remove_stale_session_dirs, session_tmpdir

__all__ = [
    "launch",
]

#: How long mpirun gets to stop the job after the first SIGINT, SIGTERM or SIGHUP
#: before the launcher kills it and every process of the job on this host. mpirun
#: waits for its daemons to report their ranks gone, and a daemon on a host cut off
#: from the network never answers: without a bound, ``hvdlite-run`` then outlived a
#: ``timeout`` or a scheduler's SIGTERM by minutes.
STOP_GRACE_SECONDS = 8.0
#: Seconds mpirun may take to end once an elastic job's last rank 0 wrote that training
#: finished. mpirun waits for every daemon of the job to report, and the daemon of a host
#: cut off from the network (whose workers the others went on without) never does:
#: past this, hvdlite-run ends what is left of the job here and reports success.
FINISH_GRACE_SECONDS = 10.0


def launch(config: LaunchConfig, environ: Mapping[str, str] | None = None,
           stop: threading.Event | None = None,
           streams: tuple[TextIO, TextIO] | None = None) -> int:
    """Launch ``config`` through mpirun and return the job's exit status.

    ``stop``: for a launch run in a thread other than the main one (the Ray and Spark
    integrations), where signals cannot be handled; once set, the job is stopped as on
    SIGTERM. ``streams``: where the ranks' stdout and stderr go (default: this
    process's).

    In elastic mode with a host discovery script, the script is run first, until
    its hosts offer ``-np`` slots or ``--elastic-timeout`` passes
    (:func:`~hvdlite.runner.hosts.wait_for_slots`, a :class:`~hvdlite.runner.mpirun.LaunchError` then).

    SIGINT, SIGTERM and SIGHUP received by this process print one line and are
    forwarded to ``mpirun``, which tears the job down; a second Ctrl-C kills
    ``mpirun`` and every process of the job at once, and so does a job still running
    :data:`STOP_GRACE_SECONDS` after the first signal. A job stopped that way, or ended
    by signal N, returns ``128 + N`` (130 for Ctrl-C), as a shell would report it.
    """
    env_in = os.environ if environ is None else environ
    mpirun = find_mpirun(env_in)
    _, major = mpirun_version(mpirun)
    host_list: list[tuple[str, int | None]] | None = None
    if config.elastic:
        # What the user asked for, kept as the job starts again with other -np.
        settings = elastic_settings(config, env_in)
        config = dataclasses.replace(config, min_np=settings.min_np, max_np=settings.max_np)
        if config.host_discovery_script is not None:
            host_list = list(wait_for_slots(settings, config.num_proc, log=_say))
    # The last world's rank 0 of an elastic job writes here when training ended well.
    # mpirun's own status cannot tell: it counts workers lost along the way (137 for a
    # killed one that joined), and under fault tolerance it is 0 when every worker died.
    status_dir = tempfile.mkdtemp(prefix="hvdlite-elastic-") if config.elastic else None
    status_path = os.path.join(status_dir, "status") if status_dir else None
    resume: str | None = None  # why the job starts again, and the hosts concerned
    live = live_output(config, major, env_in)
    # Names the files where the workers keep their last commit on every host
    # (hvdlite.common.kept_commits), for the job to start again from it.
    keep = uuid.uuid4().hex[:16] if config.elastic and live else None
    try:
        while True:
            notes: list[str] = []
            argv, env = build_mpirun_command(
                config, mpirun, env_in, ompi_major=major, host_list=host_list,
                status_file=status_path, keep=keep, resume=resume, notes=notes)
            if resume is None:
                for note in notes:
                    _say(note)
            if config.verbose:
                set_vars = {k: v for k, v in env.items() if env_in.get(k) != v}
                prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(set_vars.items()))
                print(f"{program_name()}: {prefix + ' ' if prefix else ''}{shlex.join(argv)}", flush=True)

            # A killed job's session folder would make the mpirun that gets its process
            # id fail at start.
            stale = remove_stale_session_dirs(env)
            if stale and config.verbose:
                _say(f"removed {len(stale)} session folder(s) that killed Open MPI processes left in "
                     f"{session_tmpdir(env)}")
            requests = Requests(env, _say)
            try:
                returncode = _run_mpirun(
                    argv, env, live=live, requests=requests, stop=stop, streams=streams,
                    finished=(lambda: requests.finished or _finished(status_path)) if status_path else None)
            finally:
                finished = (status_path is not None and _finished(status_path)) or requests.finished
            if finished or requests.stopped:
                break
            hosts_before = host_list if host_list is not None else given_hosts(config, env_in)[0]
            if requests.relaunch is not None and returncode < 128:
                # A host joined the discovery output: every worker left at a commit, and
                # the job starts again on the hosts rank 0 asked for, from that commit.
                host_list = list(requests.relaunch)
                joined = [h for h, _ in host_list if not any(same_host(h, b) for b, _ in hosts_before)]
                resume = "joined=" + ",".join(joined)
                config = dataclasses.replace(config, num_proc=sum(n or 1 for _, n in host_list))
                _say(f"starting the job again on {format_hosts(host_list)} ({config.num_proc} workers) "
                     "from its last commit")
            elif keep is not None and requests.lost_hosts:
                # mpirun ended the job when it lost a host's daemon (every process there
                # died): the job starts again on the other hosts, from the last commit.
                lost = requests.lost_hosts
                host_list = [(h, n) for h, n in hosts_before if not any(same_host(h, x) for x in lost)]
                n = min(sum(n or 1 for _, n in host_list), config.max_np or config.num_proc)
                if n < (config.min_np or 1):
                    _say(f"mpirun lost the daemon of {', '.join(lost)}; the hosts left have {n} "
                         f"slot{'s' * (n != 1)}, fewer than --min-np {config.min_np}: the job ends")
                    break
                resume = "lost=" + ",".join(lost)
                config = dataclasses.replace(config, num_proc=n)
                _say(f"mpirun lost the daemon of {', '.join(lost)} and ended the job; starting it again on "
                     f"{format_hosts(host_list)} ({n} workers) from its last commit")
            else:
                break
    finally:
        if status_dir is not None:
            shutil.rmtree(status_dir, ignore_errors=True)
        if keep is not None:
            kept_commits.remove_all(keep)  # this machine's; a remote host's own at the end
    if returncode != 0 and finished:
        _say(f"the elastic job finished its training (mpirun reported status {returncode} for workers "
             "lost on the way)")
        return 0
    if returncode == 0 and config.elastic and not finished and (live or _status_visible(config, env_in, host_list)):
        # Under fault tolerance mpirun reports 0 for workers that died, and for a job
        # it ended itself (a lost daemon): nobody said training finished.
        _say("the elastic job ended without finishing its training: no worker reached the end (see "
             "the output above)")
        return 1
    return returncode


def _say(text: str) -> None:
    """One line from the launcher on stderr (not at all where stderr is gone)."""
    try:
        print(f"{program_name()}: {text}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def _status_visible(config: LaunchConfig, env: Mapping[str, str],
                    host_list: list[tuple[str, int | None]] | None) -> bool:
    """Whether the last rank 0's note that training finished reaches this machine's
    status folder: when every worker runs here (a remote rank 0 writes to its own
    host's folder, where the launcher cannot look)."""
    hosts = host_list if host_list is not None else given_hosts(config, env)[0]
    return all(is_local_host(h) for h, _ in hosts)


def _finished(status_path: str) -> bool:
    try:
        with open(status_path) as f:
            return f.read().strip() == "finished"
    except OSError:
        return False


def _copy_output(proc: subprocess.Popen, out: TextIO, err: TextIO) -> Callable[[float], None]:
    """Copy mpirun's own (not live) output to the given streams, line by line."""
    def pump(pipe, stream: TextIO) -> None:
        with pipe:
            for line in iter(pipe.readline, b""):
                try:
                    stream.write(line.decode("utf-8", "replace"))
                    stream.flush()
                except (OSError, ValueError):
                    pass

    threads = [threading.Thread(target=pump, args=(p, s), daemon=True)
               for p, s in ((proc.stdout, out), (proc.stderr, err))]
    for t in threads:
        t.start()
    return lambda timeout: [t.join(timeout) for t in threads] and None


def _run_mpirun(argv: list[str], env: dict[str, str], live: bool = False,
                finished: Callable[[], bool] | None = None, requests: Requests | None = None,
                stop: threading.Event | None = None,
                streams: tuple[TextIO, TextIO] | None = None) -> int:
    """Run mpirun, stopping the job on SIGINT, SIGTERM or SIGHUP; returns its exit status
    (128 + N for signal N, and 128 + N when this process was asked to stop by signal N).

    The first such signal prints one line and is passed on to mpirun, which stops the
    ranks; a second SIGINT (Ctrl-C again) kills mpirun and every process below it at
    once, as does a job that has not stopped within :data:`STOP_GRACE_SECONDS` of the
    first. Processes of the job still there once mpirun has gone after a signal are
    killed too.

    ``live``: mpirun was asked for tagged raw output (``--output tag:raw``), which is
    read from pipes and written to this process's stdout and stderr by
    :func:`hvdlite.runner.output.forward`; rank 0's requests there go to ``requests``
    (:mod:`hvdlite.runner.evict`).

    ``finished``: says whether an elastic job's training finished; mpirun still running
    :data:`FINISH_GRACE_SECONDS` after it does is ended, and the job counts as a success
    (exit status 0).

    ``stop`` and ``streams``: as :func:`launch`'s."""
    finish = None
    out_stream, err_stream = streams or (sys.stdout, sys.stderr)
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
        finish = output.forward(out_r, err_r, out_stream, err_stream,
                                requests=(LAUNCHER_REQUEST.encode(), requests.handle) if requests else None,
                                runtime=requests.runtime_line if requests else None)
    elif streams is not None:
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        finish = _copy_output(proc, out_stream, err_stream)
    else:
        proc = subprocess.Popen(argv, env=env)
    received: list[int] = []
    asked_at: list[float] = []  # when the first signal came (time.monotonic())
    job: dict[int, int] = {}  # the job's processes when it was asked to stop: pid -> start time
    finished_at: list[float] = []  # when training was seen finished (time.monotonic())

    def kill_job() -> None:
        kill_processes(job)
        try:
            proc.kill()  # where /proc could not list the job's processes
        except OSError:
            pass

    def on_signal(signum: int, _frame: object) -> None:
        received.append(signum)
        job.update(process_tree(proc.pid))
        if len(received) == 1:
            asked_at.append(time.monotonic())
            if signum == signal.SIGINT:
                _say("interrupted, stopping the job (Ctrl-C again to kill it at once)")
            else:
                _say(f"got {signal.Signals(signum).name}, stopping the job")
        elif signum == signal.SIGINT:
            _say("killing the job")
            kill_job()
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
        killed = False
        while True:
            # Polled, not one blocking wait: a signal's handler runs meanwhile, and the
            # grace period after it is counted here.
            try:
                returncode = proc.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                pass
            if stop is not None and stop.is_set() and not received:
                on_signal(signal.SIGTERM, None)
            if asked_at and not killed and time.monotonic() - asked_at[0] > STOP_GRACE_SECONDS:
                _say(f"the job did not stop within {STOP_GRACE_SECONDS:g} s; killing it")
                job.update(process_tree(proc.pid))
                kill_job()
                killed = True
            if finished is not None and not received and not asked_at:
                if not finished_at and finished():
                    finished_at.append(time.monotonic())
                if finished_at and time.monotonic() - finished_at[0] > FINISH_GRACE_SECONDS:
                    # A worker the others left behind (stopped, or on a host cut off)
                    # keeps mpirun waiting: stop the job as on SIGTERM, which ends it on
                    # every host mpirun reaches, and kill what is left here after that.
                    _say(f"training finished, but mpirun has not ended {FINISH_GRACE_SECONDS:g} s later "
                        "(it waits for workers the job went on without); stopping it")
                    asked_at.append(time.monotonic())
                    job.update(process_tree(proc.pid))
                    try:
                        proc.send_signal(signal.SIGTERM)
                    except ProcessLookupError:
                        pass
        if asked_at:
            kill_processes(job)  # whatever outlived mpirun (a rank's own children)
        if finish is not None:
            # The pipes end when the last process holding them (mpirun, its daemons)
            # has gone; a stray child of a rank may keep them open longer.
            finish(5.0)
    finally:
        if requests is not None:
            requests.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if received:
        if requests is not None:
            requests.stopped = True
        return 128 + received[0]
    if finished_at and asked_at:
        return 0  # stopped after training finished
    if returncode < 0:
        return 128 - returncode
    return returncode

