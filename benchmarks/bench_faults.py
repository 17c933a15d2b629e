"""A soak of elastic training under the faults clusters have: many runs, each with one
fault, chosen at random, at a random step, on emulated hosts.

Each run is one ``hvdlite-run -np H --min-np 2 --max-np H`` job on H emulated hosts
(one worker each; the discovery script lists every host, but in ``host leaves``) of the elastic
tests' PyTorch script (``ElasticSampler``, ``TorchState`` committed every 2 steps).
Between steps 10 and 40 one fault is injected:

* ``kill worker`` / ``kill rank 0``: SIGKILL to that worker's process;
* ``freeze worker``: SIGSTOP to a worker's process;
* ``cut host``: a worker's host taken off the network (its process lives on);
* ``resume worker``: SIGSTOP to a worker's process, and SIGCONT once the others went on
  without it (it must end itself, and the others carry on);
* ``host leaves``: a worker's host dropped from the discovery script's output (its
  worker is stopped at the next commit);
* ``hang worker``: a worker's training script deadlocks (a lock taken twice) while
  hvdlite's thread goes on; that run sets the stall shutdown time to 5 s, past which
  rank 0 has the launcher end it;
* ``host joins``: the job starts on every host but the last, which then appears in the
  discovery script's output (the job starts again on every host from its last commit);
* ``host dies``: every process on a worker's host is killed, Open MPI's daemon included
  (mpirun ends the job, and ``hvdlite-run`` starts it again on the other hosts from the
  commit they kept).

A run passes when the job ends by itself with status 0 (a hang is a run still going
``--run-timeout`` s after the fault), the survivors hold the same parameters, every
sample of every epoch was trained exactly once in the committed steps, and no process
of the job is left on any host 60 s after the launcher exits. Per fault it prints the
runs, hangs, failed checks, processes left behind, the detection time (from the fault
to the new rank 0's line saying it goes on) and the longest gap between two completed
steps on a survivor.

    python benchmarks/bench_faults.py [--runs 100] [--hosts 3] [--seed S] [--failure-timeout 10]

Needs root (network namespaces). The results file (``benchmarks/_common.py``) goes to
``benchmarks/results/bench_faults.json`` by default.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ResultsRun, add_results_options, results_path  # noqa: E402  (sibling module)

FAULTS = ("kill worker", "kill rank 0", "freeze worker", "cut host", "resume worker", "host leaves", "hang worker",
          "host joins", "host dies")
STALL_SHUTDOWN_S = 5
SAMPLES = 480


def one_run(hosts, fault: str, step: int, failure_timeout: float, run_timeout: float) -> dict:
    from tests.elastic.test_elastic import TRAIN, _check_each_sample_trained_once
    from tests.faults.test_elastic_faults import _longest_gap
    from tests.faults.harness import FaultJob

    n = len(hosts.hosts)
    victim_host = hosts.hosts[0] if fault == "kill rank 0" else hosts.hosts[-1]
    with tempfile.TemporaryDirectory(prefix="hvdlite_soak_") as tmp:
        out = Path(tmp) / "out"
        out.mkdir()
        listed = Path(tmp) / "hosts.txt"
        started = hosts.hosts[:-1] if fault == "host joins" else hosts.hosts
        listed.write_text("".join(f"{h}:1\n" for h in started))
        script = Path(tmp) / "discover.sh"
        script.write_text(f"#!/bin/sh\ncat {listed}\n")
        script.chmod(0o755)
        launcher_args = ["--min-np", "2", "--max-np", str(n), "--host-discovery-script", str(script),
                         "--failure-timeout", f"{failure_timeout:g}"]
        env = {"HVDLITE_TEST_PRINT_STEPS": "1"}
        if fault == "hang worker":  # the victim (on the last host: rank n-1) deadlocks after that step
            launcher_args += ["--stall-check-warning-time-seconds", "1",
                              "--stall-check-shutdown-time-seconds", str(STALL_SHUTDOWN_S)]
            env.update(HVDLITE_TEST_KILL=f"{n - 1}:{step}", HVDLITE_TEST_KILL_BY="hang")
        job = FaultJob(hosts, len(started), TRAIN, args=["--out", str(out), "--epochs", "8", "--step-sleep", "0.05"],
                       launcher_args=launcher_args, env=env)
        row = {"fault": fault, "step": step, "host": victim_host}
        job.start()
        try:
            if not job.wait_for_step(step, timeout=180):
                row.update(outcome="did not reach the step", output=job.output(40))
                return row
            t_fault = time.time()
            if fault.startswith("kill"):
                for pid in job.rank_pids(victim_host):
                    os.kill(pid, signal.SIGKILL)
            elif fault in ("freeze worker", "resume worker"):
                job.freeze(victim_host)
                if fault == "resume worker":
                    job.wait_for(lambda j: any("; continuing with" in line for t, line in j.lines if t >= t_fault),
                                 failure_timeout + 30)
                    job.thaw(victim_host)
            elif fault == "host leaves":
                listed.write_text("".join(f"{h}:1\n" for h in hosts.hosts if h != victim_host))
            elif fault == "host joins":
                listed.write_text("".join(f"{h}:1\n" for h in hosts.hosts))
            elif fault == "cut host":
                job.cut(victim_host)
            elif fault == "host dies":
                job.kill_host(victim_host)
            # "hang worker": the victim deadlocks by itself, once this step is done
            rc = job.wait(timeout=run_timeout)
            going_on = [t for t, line in job.lines if "; continuing with" in line and t >= t_fault]
            row["detection_s"] = round(going_on[0] - t_fault, 3) if going_on else None
            if rc is None:
                row.update(outcome="hang", output=job.output(40) + "\n" + _stacks(job, hosts.hosts))
                return row
            row["rc"] = rc
            results = [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]
            problems = []
            if rc != 0:
                problems.append(f"exit status {rc}")
            expected = n if fault == "host joins" else n - 1
            if len(results) != expected:
                problems.append(f"{len(results)} workers finished, not {expected}")
            if len({r["params_sha"] for r in results}) > 1:
                problems.append("parameters differ")
            if results:
                try:
                    _check_each_sample_trained_once(results[0], SAMPLES)
                except AssertionError as exc:
                    problems.append(f"samples: {exc}")
                if fault in ("host joins", "host dies"):  # new processes: the first host's steps, from the output
                    gap = _longest_gap(sorted(st.t for st in job.steps if st.host == hosts.hosts[0]))
                else:
                    gap = max(_longest_gap(r["completed"]) for r in results)
                row["longest_gap_s"] = round(gap, 3)
            left = job.wait_for_no_leftovers(60)
            row["left_behind"] = sum(len(v) for v in left.values())
            if left:
                problems.append(f"left behind: {left}")
            row["problems"] = problems
            row["outcome"] = "ok" if not problems else "failed checks"
            if problems:
                row["output"] = job.output(40)
            return row
        finally:
            if fault == "cut host":
                job.mend(victim_host)
            job.stop()


def _stacks(job, host_names: list[str]) -> str:
    """Where each worker of a job that hangs is: its Python stacks with ``py-spy`` (on
    PATH, or in $PY_SPY), else every thread's native stack (gdb)."""
    import shutil
    import subprocess
    from tests.launch import stacks_of
    pids = [pid for host in host_names for pid in job.rank_pids(host)]
    spy = os.environ.get("PY_SPY") or shutil.which("py-spy")
    if spy is None:
        return stacks_of(pids, frames=12)
    parts = []
    for pid in pids:
        try:
            parts.append(subprocess.run([spy, "dump", "--locals", "--pid", str(pid)], capture_output=True,
                                        text=True, timeout=60).stdout)
        except (OSError, subprocess.TimeoutExpired) as exc:
            parts.append(f"--- pid {pid}: py-spy failed: {exc}")
    return "\n".join(parts)


def summarize(rows: list[dict]) -> list[dict]:
    summary = []
    for fault in FAULTS:
        mine = [r for r in rows if r["fault"] == fault]
        if not mine:
            continue
        detections = [r["detection_s"] for r in mine if r.get("detection_s") is not None]
        gaps = [r["longest_gap_s"] for r in mine if r.get("longest_gap_s") is not None]
        summary.append({
            "fault": fault, "runs": len(mine),
            "hangs": sum(r["outcome"] == "hang" for r in mine),
            "failed checks": sum(r["outcome"] not in ("ok", "hang") for r in mine),
            "left behind": sum(r.get("left_behind", 0) for r in mine),
            "detection median s": round(statistics.median(detections), 2) if detections else None,
            "detection max s": round(max(detections), 2) if detections else None,
            "longest gap s": round(max(gaps), 2) if gaps else None,
        })
    return summary


def print_table(summary: list[dict]) -> None:
    cols = ["fault", "runs", "hangs", "failed checks", "left behind", "detection median s", "detection max s",
            "longest gap s"]
    print("| " + " | ".join(cols) + " |")
    print("| " + " | ".join("---" for _ in cols) + " |")
    for s in summary:
        print("| " + " | ".join("-" if s[c] is None else str(s[c]) for c in cols) + " |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=100)
    p.add_argument("--hosts", type=int, default=3)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--failure-timeout", type=float, default=10.0)
    p.add_argument("--run-timeout", type=float, default=180.0,
                   help="a job still running this long after its fault counts as a hang")
    p.add_argument("--faults", default=",".join(FAULTS), help="comma-separated, from: " + ", ".join(FAULTS))
    p.add_argument("--in-turn", action="store_true", help="the faults in turn rather than at random")
    add_results_options(p, "bench_faults")
    a = p.parse_args(argv)
    from tests.hosts.emulated import EmulatedHosts, unavailable
    reason = unavailable()
    if reason:
        print(f"bench_faults: {reason}", file=sys.stderr)
        return 2
    faults = [f.strip() for f in a.faults.split(",") if f.strip()]
    unknown = sorted(set(faults) - set(FAULTS))
    if unknown:
        p.error(f"unknown fault(s) {unknown}; choose from {', '.join(FAULTS)}")
    seed = a.seed if a.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    run_file = ResultsRun("bench_faults")
    rows = []
    with EmulatedHosts(a.hosts, rate="1gbit") as hosts:
        for i in range(a.runs):
            fault = faults[i % len(faults)] if a.in_turn else rng.choice(faults)
            step = rng.randint(10, 40)
            row = one_run(hosts, fault, step, a.failure_timeout, a.run_timeout)
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "output"}), flush=True)
            if row["outcome"] != "ok":
                print(row.get("output", ""), file=sys.stderr, flush=True)
    summary = summarize(rows)
    print(f"\n{a.runs} runs on {a.hosts} emulated hosts, --failure-timeout {a.failure_timeout:g}, seed {seed}\n")
    print_table(summary)
    run_file.write(results_path(a, "bench_faults"), rows, summary, {**vars(a), "seed": seed}, a.notes)
    return 0 if all(r["outcome"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
