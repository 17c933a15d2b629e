"""A model that does not fit: under a per-rank memory cap that replicated Adam exceeds,
ZeRO stage 3 on 4 ranks trains it, to the loss of an uncapped reference.

    python benchmarks/bench_zero_capped.py [--ranks 4] [--steps 20] [--quick] [--cap-mib M]
                                           [--json-out F.json] [--results PATH]

Run it with plain ``python``, as root, where a memory cgroup controller is (cgroup v1's
``/sys/fs/cgroup/memory``, or v2's root offering ``memory``). It launches four jobs of
``--ranks`` ranks with ``hvdlite-run``, one after the other. Each rank runs in a memory
cgroup of its own, which this script makes before the job and removes after it; the
rank joins it first thing, before it imports torch, so that everything it allocates is
charged there, and the cgroup's high-water mark is the rank's peak:

1. ``reference``: ``hvdlite.torch.DistributedOptimizer(Adam)`` (parameters, gradients
   and both Adam moments whole on every rank, 16 bytes per parameter), no limit. Its
   loss is the one to reach; it also measures the baseline and replicated Adam's peak.
2. ``stage3_uncapped``: ``hvdlite.torch.ZeroRedundancyOptimizer(Adam, stage=3,
   model=model)``, no limit: stage 3's peak. Each rank keeps a quarter of the
   parameters, gradients and Adam state between uses and gathers each layer's
   parameters just before it runs.
3. ``replicated_capped``: job 1 with each rank's cgroup limited to the cap
   (``memory.limit_in_bytes``, and ``memory.memsw.limit_in_bytes`` alike where it exists,
   on v1; ``memory.max`` and ``memory.swap.max`` = 0 on v2). The kernel's OOM killer must
   end it: its kills are read from the cgroups (``oom_kill`` in ``memory.oom_control``
   or ``memory.events``), and the launcher's report of the rank that died is kept.
4. ``stage3_capped``: job 2 under the same cap. It must train every step, and its final
   loss must equal the reference's within 1e-5 relative.

The cap, unless ``--cap-mib`` gives it: halfway (``--cap-fraction``) between stage 3's
peak and replicated Adam's, the largest rank's of each, rounded up to a page; so both
sides have the same margin. The baseline, printed beside them: what a rank's cgroup holds
once the rank has imported torch and hvdlite and called ``hvd.init()``, and once it has
built a first optimizer too (torch.optim loads its compiler support with the first one,
about 70 MiB), before the model exists.

Allocator: every job runs with ``MALLOC_MMAP_THRESHOLD_`` = ``--mmap-threshold-kib``
(default 1024 KiB), so that glibc maps each tensor of 1 MiB or more on its own and
returns it to the kernel when it is freed. Without it (``--mmap-threshold-kib 0``: the
allocator as hvdlite's engine tunes it, 32 MiB mmap threshold and 64 MiB top pad, for
speed) the layers stage 3 gathers and frees, 16 MiB each here, stay in malloc's heaps,
and stage 3's peak grows past replicated Adam's (``--quick --mmap-threshold-kib 0`` shows
it). The same setting for every job, replicated ones included.

The model: ``--layers`` Linear layers of ``--width`` x ``--width``, float32, as residual
blocks ``h + tanh(Linear(h))`` and a Linear head (by default 12 layers of 2048, 50 M
parameters, 192 MiB), trained with Adam (lr ``--lr``) for ``--steps`` steps (default 20)
on a mean-squared error against a linear teacher (the target is half the input). Each
rank's batch of ``--batch`` random rows at each step comes from a generator seeded by the
rank and the step, so all jobs see the same batches, and every rank builds the same model
from seed 0. The loss of a step is the mean over the ranks of their losses;
the final loss is the last step's. ``--quick``: 16 layers of 1024 (17 M parameters) and
4 steps.

Each rank uses one torch thread. The results file (``benchmarks/_common.py``) goes to
``benchmarks/results/bench_zero_capped.json`` by default (a ``--quick`` run writes none
unless ``--results`` is given); ``--json-out F.json`` also writes the figures, the summary
and the rows to ``F.json``. The exit status is 0 when the checks hold: the cap lies
between the two peaks, the OOM killer ended the replicated job under it, and the capped
stage 3 job finished with the reference's loss.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, ResultsRun, add_results_options, launcher, results_path  # noqa: E402

# job: (optimizer, capped)
JOBS = {"reference": ("replicated", False), "stage3_uncapped": ("stage3", False),
        "replicated_capped": ("replicated", True), "stage3_capped": ("stage3", True)}
OPTIMIZERS = {"replicated": "DistributedOptimizer(Adam)", "stage3": "ZeroRedundancyOptimizer(Adam, stage=3)"}
LOSS_RTOL = 1e-5
MiB = 1 << 20
TAG = "ZERO_CAPPED"


# ---------------------------------------------------------------- cgroups
def _harness() -> Any:
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from tests.faults import harness
    return harness


def cgroup_root() -> Path:
    """Where memory cgroups are made here (cgroup v1's memory hierarchy, or the v2 root
    offering the memory controller); OSError if nowhere."""
    return _harness().memory_cgroup_root()


def cgroup_oom_kills(group: Path) -> int:
    """How many processes the kernel's OOM killer ended in ``group``."""
    return _harness().oom_kills(group)


def _v2(group: Path) -> bool:
    return (group / "memory.max").exists() or not (group / "memory.limit_in_bytes").exists()


def make_cgroup(group: Path, cap: int | None) -> None:
    """``group`` with a memory limit of ``cap`` bytes (None: no limit) and no swap."""
    group.mkdir()
    if cap is None:
        return
    if _v2(group):
        (group / "memory.max").write_text(str(cap))
        if (group / "memory.swap.max").exists():
            (group / "memory.swap.max").write_text("0")
    else:
        (group / "memory.limit_in_bytes").write_text(str(cap))
        if (group / "memory.memsw.limit_in_bytes").exists():   # memory + swap: no swap either
            (group / "memory.memsw.limit_in_bytes").write_text(str(cap))


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def cgroup_usage(group: Path) -> int | None:
    return _read_int(group / "memory.current") if _v2(group) else _read_int(group / "memory.usage_in_bytes")


def cgroup_peak(group: Path) -> int | None:
    return _read_int(group / "memory.peak") if _v2(group) else _read_int(group / "memory.max_usage_in_bytes")


def remove_cgroup(group: Path, wait: float = 10.0) -> bool:
    """rmdir ``group`` once its processes are gone (they exit with the job); a rank of
    ours still in it after ``wait`` seconds is killed."""
    deadline = time.monotonic() + wait
    killed = False
    while True:
        try:
            group.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            if time.monotonic() > deadline:
                if killed:
                    print(f"# could not remove {group}", file=sys.stderr)
                    return False
                for pid in (group / "cgroup.procs").read_text().split():
                    with contextlib.suppress(OSError):
                        os.kill(int(pid), signal.SIGKILL)
                killed, deadline = True, time.monotonic() + wait
            time.sleep(0.2)


def join_own_cgroup(prefix: str) -> Path:
    """Inside a rank, before torch is imported: move this process into ``prefix-<rank>``,
    the rank read from the launcher's environment."""
    rank = next((os.environ[k] for k in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "HOROVOD_RANK")
                 if os.environ.get(k)), None)
    if rank is None:
        raise SystemExit("bench_zero_capped --worker: no rank in the environment; start it with hvdlite-run")
    group = Path(f"{prefix}-{int(rank)}")
    (group / "cgroup.procs").write_text(str(os.getpid()))
    return group


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


# ---------------------------------------------------------------- inside the job
def make_model(width: int, layers: int) -> Any:
    """``layers - 1`` residual blocks ``h + tanh(Linear(h))`` and a Linear head, all
    ``width`` x ``width``, float32, the same on every rank (seed 0)."""
    import torch

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(width, width)

        def forward(self, h: Any) -> Any:
            return h + torch.tanh(self.linear(h))

    torch.manual_seed(0)
    return torch.nn.Sequential(*[Block() for _ in range(layers - 1)], torch.nn.Linear(width, width))


def batch(width: int, rows: int, rank: int, step: int) -> tuple[Any, Any]:
    """Rank ``rank``'s batch at step ``step``: random inputs and their targets, half of
    them (a linear teacher the model can learn)."""
    import torch
    g = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.randn(rows, width, generator=g)
    return x, 0.5 * x


def worker(args: argparse.Namespace) -> None:
    group = join_own_cgroup(args.cgroup_prefix)   # before torch: the import is charged too

    import torch
    import torch.nn.functional as F

    import hvdlite.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    usage: dict[str, int | None] = {"init": cgroup_usage(group)}   # the cgroup's usage after each phase
    rss_init = _status_kib("VmRSS") * 1024
    torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))])        # torch.optim's lazy imports
    usage["first_optimizer"] = cgroup_usage(group)
    hvd.allgather_object(0)      # every rank measured before any builds the model

    model = make_model(args.width, args.layers)
    params = sum(p.numel() for p in model.parameters())
    usage["model"] = cgroup_usage(group)
    if args.optimizer == "stage3":
        opt = hvd.ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, stage=3,
                                          model=model, lr=args.lr)
    else:
        opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=args.lr),
                                       named_parameters=model.named_parameters())
    usage["optimizer"] = cgroup_usage(group)
    losses: list[float] = []
    t0 = time.perf_counter()
    for step in range(args.steps):
        x, y = batch(args.width, args.batch, hvd.rank(), step)
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if step == 0:
            usage["step1"] = cgroup_usage(group)
        if hvd.rank() == 0 and (step == 0 or step + 1 == args.steps):
            print(f"# {args.job}: step {step + 1}/{args.steps}, rank 0 loss {losses[-1]:.6f}, "
                  f"{time.perf_counter() - t0:.1f} s", flush=True)
    seconds = time.perf_counter() - t0
    usage["end"] = cgroup_usage(group)
    mine = {"usage": usage, "rss_init_bytes": rss_init, "rss_hwm_bytes": _status_kib("VmHWM") * 1024,
            "malloc_mmap_threshold": os.environ.get("MALLOC_MMAP_THRESHOLD_"), "losses": losses}
    everyone = hvd.allgather_object(mine)
    if hvd.rank() == 0:
        print(f"{TAG} " + json.dumps({"ranks": hvd.size(), "params": params, "train_seconds": seconds,
                                      "per_rank": everyone}), flush=True)


# ---------------------------------------------------------------- the jobs
def launcher_says(out: str) -> list[str]:
    """The launcher's lines on how the job ended: which rank died, and of what."""
    lines = [ln.strip() for ln in out.splitlines()]
    said = []
    for i, ln in enumerate(lines):
        if "exited on" in ln or "noticed that process" in ln:
            said.append(" ".join(x for x in lines[i:i + 2] if x and not x.startswith("---")))
        elif "returned a non-zero exit code" in ln or "Killed" in ln and not said:
            said.append(ln)
    return said[:3]


def run_job(args: argparse.Namespace, job: str, cap: int | None, root: Path) -> dict[str, Any]:
    """One job of ``args.ranks`` ranks, each in a cgroup of its own limited to ``cap``
    (None: no limit): what it reported, how it ended, and each rank's cgroup figures."""
    prefix = root / f"hvdlite-capped-{os.getpid()}-{job}"
    groups = [Path(f"{prefix}-{r}") for r in range(args.ranks)]
    try:
        for g in groups:
            make_cgroup(g, cap)
        cmd = launcher(args.ranks) + [
            sys.executable, str(Path(__file__).resolve()), "--worker", "--job", job,
            "--optimizer", JOBS[job][0], "--cgroup-prefix", str(prefix), "--width", str(args.width),
            "--layers", str(args.layers), "--batch", str(args.batch), "--steps", str(args.steps),
            "--lr", str(args.lr)]
        env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        if args.mmap_threshold_kib:
            env["MALLOC_MMAP_THRESHOLD_"] = str(args.mmap_threshold_kib * 1024)
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=args.job_timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            timed_out = True
        res: dict[str, Any] = {"job": job, "optimizer": JOBS[job][0], "cap_bytes": cap,
                               "returncode": proc.returncode, "timed_out": timed_out,
                               "seconds": round(time.perf_counter() - t0, 1), "result": None}
        for line in out.splitlines():
            if line.startswith(TAG + " "):
                res["result"] = json.loads(line.split(" ", 1)[1])
            elif line.startswith("# "):
                print(line, flush=True)
        res["finished"] = proc.returncode == 0 and res["result"] is not None
        res["ranks"] = [{"rank": r, "peak_bytes": cgroup_peak(g), "oom_kills": cgroup_oom_kills(g)}
                        for r, g in enumerate(groups)]
        res["launcher_says"] = [] if res["finished"] else launcher_says(out)
        res["output_tail"] = "" if res["finished"] else out[-3000:]
        return res
    finally:
        for g in groups:
            remove_cgroup(g)


def mean_losses(res: dict[str, Any]) -> list[float]:
    per_rank = [r["losses"] for r in res["result"]["per_rank"]]
    return [sum(v) / len(v) for v in zip(*per_rank)]


def largest_peak(res: dict[str, Any]) -> int | None:
    peaks = [r["peak_bytes"] for r in res["ranks"] if r["peak_bytes"] is not None]
    return max(peaks) if peaks else None


def fmt_mib(n: float | None) -> str:
    return "–" if n is None else f"{n / MiB:.0f} MiB"


def fmt_num(v: float | None, spec: str) -> str:
    return "–" if v is None else format(v, spec)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--width", type=int, default=None, help="units per layer (default 2048; --quick 1024)")
    p.add_argument("--layers", type=int, default=None, help="Linear layers (default 12; --quick 16)")
    p.add_argument("--batch", type=int, default=4, help="rows per rank per step")
    p.add_argument("--steps", type=int, default=None, help="training steps (default 20; --quick 4)")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--cap-mib", type=float, default=None,
                   help="the per-rank memory cap in MiB (default: measured, see --cap-fraction)")
    p.add_argument("--cap-fraction", type=float, default=0.5,
                   help="the cap: stage 3's peak plus this fraction of the way to replicated Adam's peak")
    p.add_argument("--mmap-threshold-kib", type=int, default=1024,
                   help="MALLOC_MMAP_THRESHOLD_ of every rank, in KiB; 0 leaves malloc as hvdlite tunes it")
    p.add_argument("--job-timeout", type=float, default=300.0, help="seconds before a job is killed")
    p.add_argument("--quick", action="store_true", help="a smaller model and fewer steps")
    p.add_argument("--json-out", default="", metavar="F.json",
                   help="also write the figures, the summary and the rows here (any run, --quick too)")
    add_results_options(p, "bench_zero_capped")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--job", choices=list(JOBS), help=argparse.SUPPRESS)
    p.add_argument("--optimizer", choices=list(OPTIMIZERS), help=argparse.SUPPRESS)
    p.add_argument("--cgroup-prefix", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.width is None:
        args.width = 1024 if args.quick else 2048
    if args.layers is None:
        args.layers = 16 if args.quick else 12
    if args.steps is None:
        args.steps = 4 if args.quick else 20
    if args.worker:
        worker(args)
        return 0

    try:
        root = cgroup_root()
    except OSError as e:
        print(f"bench_zero_capped: {e}; the per-rank cap needs a memory cgroup controller", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("bench_zero_capped: making memory cgroups needs root", file=sys.stderr)
        return 2
    run = ResultsRun("bench_zero_capped")
    params = args.layers * (args.width * args.width + args.width)
    cap_file = "memory.max (cgroup v2)" if _v2(root) else "memory.limit_in_bytes (cgroup v1)"
    print(f"# model: {args.layers} x Linear({args.width}, {args.width}) (residual), {params / 1e6:.1f} M parameters "
          f"({params * 4 / MiB:.0f} MiB); {args.ranks} ranks, batch {args.batch} per rank, {args.steps} steps; "
          f"a cgroup per rank under {root}", flush=True)

    jobs: dict[str, dict[str, Any]] = {}
    for job in ("reference", "stage3_uncapped"):
        jobs[job] = run_job(args, job, None, root)
        if not jobs[job]["finished"]:
            sys.stderr.write(jobs[job]["output_tail"])
            print(f"bench_zero_capped: the uncapped {job} job failed", file=sys.stderr)
            return 1
    ref = jobs["reference"]
    usage = [r["usage"] for r in ref["result"]["per_rank"]]
    baseline_init = max(u["init"] for u in usage)
    baseline = max(u["first_optimizer"] for u in usage)
    baseline_rss = max(r["rss_init_bytes"] for r in ref["result"]["per_rank"])
    peak_replicated = largest_peak(ref)
    peak_stage3 = largest_peak(jobs["stage3_uncapped"])
    assert peak_replicated is not None and peak_stage3 is not None
    if args.cap_mib is not None:
        cap = int(args.cap_mib * MiB)
        how = f"--cap-mib {args.cap_mib:g}"
    else:
        cap = int(peak_stage3 + args.cap_fraction * (peak_replicated - peak_stage3))
        how = f"stage 3's peak + {args.cap_fraction:g} x (replicated peak - stage 3's peak)"
    cap = -(-cap // 4096) * 4096
    print(f"# baseline per rank: {fmt_mib(baseline_init)} after hvd.init() (RSS {fmt_mib(baseline_rss)}), "
          f"{fmt_mib(baseline)} with a first optimizer; peaks uncapped: replicated Adam {fmt_mib(peak_replicated)} "
          f"({(peak_replicated - baseline) / params:.1f} B/parameter above the baseline), stage 3 "
          f"{fmt_mib(peak_stage3)} ({(peak_stage3 - baseline) / params:.1f} B/parameter)", flush=True)
    held = {job: max(r["usage"]["end"] for r in jobs[job]["result"]["per_rank"]) for job in jobs}
    print(f"# held after the last step (largest rank): replicated Adam {fmt_mib(held['reference'])}, stage 3 "
          f"{fmt_mib(held['stage3_uncapped'])}", flush=True)
    print(f"# cap: {fmt_mib(cap)} per rank ({how}), written to {cap_file}", flush=True)
    if not peak_stage3 < cap < peak_replicated:
        print("# warning: the cap is not between stage 3's peak and replicated Adam's", flush=True)
    for job in ("replicated_capped", "stage3_capped"):
        jobs[job] = run_job(args, job, cap, root)

    ref_losses = mean_losses(ref)
    rows: list[dict[str, Any]] = []
    summary: list[dict[str, Any]] = []
    for job, res in jobs.items():
        per_rank = res["result"]["per_rank"] if res["result"] else [{} for _ in res["ranks"]]
        for rk, mine in zip(res["ranks"], per_rank):
            rows.append({"job": job, "rank": rk["rank"], "cap_bytes": res["cap_bytes"], "peak_bytes": rk["peak_bytes"],
                         "oom_kills": rk["oom_kills"], "usage_bytes": mine.get("usage"),
                         "rss_init_bytes": mine.get("rss_init_bytes"), "rss_hwm_bytes": mine.get("rss_hwm_bytes"),
                         "losses": mine.get("losses")})
        losses = mean_losses(res) if res["result"] else None
        final = losses[-1] if losses else None
        peaks = [rk["peak_bytes"] for rk in res["ranks"] if rk["peak_bytes"] is not None]
        summary.append({
            "job": job, "optimizer": OPTIMIZERS[res["optimizer"]], "cap_bytes": res["cap_bytes"],
            "finished": res["finished"], "returncode": res["returncode"], "timed_out": res["timed_out"],
            "oom_kills": sum(rk["oom_kills"] for rk in res["ranks"]),
            "oom_killed_ranks": sum(1 for rk in res["ranks"] if rk["oom_kills"]),
            "largest_peak_bytes": max(peaks) if peaks else None, "smallest_peak_bytes": min(peaks) if peaks else None,
            "first_loss": losses[0] if losses else None, "final_loss": final,
            "loss_rel_diff": None if final is None else abs(final - ref_losses[-1]) / abs(ref_losses[-1]),
            "train_seconds": round(res["result"]["train_seconds"], 1) if res["result"] else None,
            "job_seconds": res["seconds"], "launcher_says": res["launcher_says"]})
    by = {s["job"]: s for s in summary}
    checks = {
        "cap_between_peaks": peak_stage3 < cap < peak_replicated,
        "replicated_oom_killed": not by["replicated_capped"]["finished"] and by["replicated_capped"]["oom_kills"] >= 1,
        "stage3_finished": by["stage3_capped"]["finished"],
        "stage3_loss_matches": (by["stage3_capped"]["loss_rel_diff"] is not None
                                and by["stage3_capped"]["loss_rel_diff"] <= LOSS_RTOL),
    }

    print(f"\n{params / 1e6:.1f} M parameters, {args.ranks} ranks, cap {fmt_mib(cap)} per rank "
          f"(baseline {fmt_mib(baseline)})\n")
    print("| job | optimizer | cap | outcome | OOM kills | peak, largest rank | final loss | rel. diff from reference |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for s in summary:
        outcome = ("finished" if s["finished"] else "timed out" if s["timed_out"]
                   else f"failed (status {s['returncode']})")
        print(f"| {s['job']} | {s['optimizer']} | {fmt_mib(s['cap_bytes']) if s['cap_bytes'] else 'none'} | "
              f"{outcome} | {s['oom_kills']} | {fmt_mib(s['largest_peak_bytes'])} | "
              f"{fmt_num(s['final_loss'], '.7f')} | {fmt_num(s['loss_rel_diff'], '.1e')} |")
    print()
    for s in summary:
        for line in s["launcher_says"]:
            print(f"# {s['job']}: {line}")
    for k, v in checks.items():
        print(f"# check {k}: {'ok' if v else 'FAILED'}")
    for job in ("replicated_capped", "stage3_capped"):
        if not checks["replicated_oom_killed" if job == "replicated_capped" else "stage3_finished"]:
            sys.stderr.write(jobs[job]["output_tail"])

    figures = {"params": params, "param_bytes": params * 4, "cap_bytes": cap, "cap_rule": how, "cap_file": cap_file,
               "cgroup_root": str(root), "cgroup_names": f"hvdlite-capped-{os.getpid()}-JOB-RANK", "baseline_init_bytes": baseline_init, "baseline_bytes": baseline,
               "baseline_rss_bytes": baseline_rss, "peak_replicated_uncapped_bytes": peak_replicated,
               "peak_stage3_uncapped_bytes": peak_stage3, "held_replicated_bytes": held["reference"],
               "held_stage3_bytes": held["stage3_uncapped"], "reference_losses": ref_losses,
               "loss_rtol": LOSS_RTOL, "checks": checks}
    print("FIGURES " + json.dumps(figures), flush=True)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"figures": figures, "summary": summary, "rows": rows}, indent=1))
    settings = {k: v for k, v in vars(args).items() if k not in ("worker", "job", "optimizer", "cgroup_prefix")}
    run.write(results_path(args, "bench_zero_capped", args.quick), rows, summary, settings, args.notes,
              extra={"figures": figures})
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
