"""The hosts of a Slurm allocation, for ``hvdlite-run`` without ``-H``/``--hostfile``.

Inside an allocation (``sbatch``, ``salloc``) Slurm names the nodes in
``SLURM_JOB_NODELIST`` (older releases: ``SLURM_NODELIST``) in its compressed host-list
form, e.g. ``node[01-04,07],gpu3``, and the tasks it granted on each in
``SLURM_TASKS_PER_NODE``, e.g. ``2(x4),1``. Open MPI's ``mpirun`` takes its slots from
the same variable, so a launch through ``hvdlite-run`` places ranks as ``mpirun`` alone
would; where it is missing, ``SLURM_JOB_CPUS_PER_NODE`` (same form) gives the slots.
horovodrun itself reads no Slurm variables (it runs on ``localhost`` unless given
``-H``; only LSF allocations are detected), so this is hvdlite's addition.

Pure functions of the environment: nothing here runs ``scontrol`` or starts a process.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = ["allocation_hosts", "parse_nodelist", "parse_counts"]

_RANGE = re.compile(r"(\d+)(?:-(\d+))?")
_COUNT = re.compile(r"(\d+)(?:\(x(\d+)\))?")


def _split_top(text: str) -> list[str]:
    """Split at the commas that are outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            if depth:
                raise ValueError(f"nested '[' in {text!r}")
            depth = 1
        elif ch == "]":
            if not depth:
                raise ValueError(f"unmatched ']' in {text!r}")
            depth = 0
        elif ch == "," and not depth:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"unclosed '[' in {text!r}")
    parts.append(text[start:])
    return parts


def _expand_ranges(ranges: str, where: str) -> list[str]:
    """``01-03,7`` -> ``['01', '02', '03', '7']``: each number as wide as the range's
    first one (Slurm's zero padding)."""
    out: list[str] = []
    for item in ranges.split(","):
        m = _RANGE.fullmatch(item.strip())
        if not m:
            raise ValueError(f"bad range {item!r} in {where!r}")
        lo_text, hi_text = m.group(1), m.group(2)
        lo, hi = int(lo_text), int(hi_text if hi_text is not None else lo_text)
        if hi < lo:
            raise ValueError(f"range {item!r} in {where!r} runs backwards")
        if hi - lo >= 100_000:
            raise ValueError(f"range {item!r} in {where!r} is implausibly long")
        out += [str(v).zfill(len(lo_text)) for v in range(lo, hi + 1)]
    return out


def _expand_host(expr: str) -> list[str]:
    """One host expression, possibly with several bracket groups: ``r[1-2]n[01-02]`` ->
    r1n01, r1n02, r2n01, r2n02 (the leftmost group varies slowest)."""
    names = [""]
    rest = expr
    while rest:
        open_at = rest.find("[")
        if open_at < 0:
            names = [n + rest for n in names]
            break
        close_at = rest.index("]", open_at)
        prefix, ranges = rest[:open_at], rest[open_at + 1:close_at]
        if "]" in prefix:
            raise ValueError(f"unmatched ']' in {expr!r}")
        names = [n + prefix + v for n in names for v in _expand_ranges(ranges, expr)]
        rest = rest[close_at + 1:]
    return names


def parse_nodelist(text: str) -> list[str]:
    """Expand a Slurm host list (``h[1-2]``, ``node[01-04,07],gpu3``,
    ``rack[1-2]-n[1-3]``) into host names, in Slurm's order. Raises ``ValueError``
    naming the bad part."""
    hosts: list[str] = []
    for expr in _split_top(text.strip()):
        expr = expr.strip()
        if not expr:
            raise ValueError(f"empty host name in {text!r}")
        if expr.startswith("["):
            raise ValueError(f"host expression {expr!r} in {text!r} has no name before '['")
        hosts += _expand_host(expr)
    return hosts


def parse_counts(text: str) -> list[int]:
    """Expand Slurm's per-node counts: ``2(x3),1`` -> ``[2, 2, 2, 1]``."""
    out: list[int] = []
    for item in text.strip().split(","):
        m = _COUNT.fullmatch(item.strip())
        if not m:
            raise ValueError(f"bad count {item!r} in {text!r}; expected N or N(xREPEAT)")
        out += [int(m.group(1))] * int(m.group(2) or 1)
    return out


def allocation_hosts(environ: Mapping[str, str]) -> list[tuple[str, int]] | None:
    """``[(host, slots), ...]`` of the Slurm allocation this process runs in, or None
    outside one. Raises ``ValueError`` (naming the variable) when the variables are
    malformed or do not match."""
    nodes_var = next((v for v in ("SLURM_JOB_NODELIST", "SLURM_NODELIST") if environ.get(v)), None)
    if nodes_var is None:
        return None
    slots_var = next((v for v in ("SLURM_TASKS_PER_NODE", "SLURM_JOB_CPUS_PER_NODE") if environ.get(v)),
                     None)
    if slots_var is None:
        raise ValueError(f"{nodes_var} is set but neither SLURM_TASKS_PER_NODE nor "
                         "SLURM_JOB_CPUS_PER_NODE is: cannot tell how many ranks each node takes")
    try:
        hosts = parse_nodelist(environ[nodes_var])
    except ValueError as exc:
        raise ValueError(f"{nodes_var}={environ[nodes_var]!r}: {exc}") from None
    try:
        counts = parse_counts(environ[slots_var])
    except ValueError as exc:
        raise ValueError(f"{slots_var}={environ[slots_var]!r}: {exc}") from None
    # Slurm may give more counts than nodes (as Open MPI notes); fewer cannot be placed.
    if len(counts) < len(hosts):
        raise ValueError(f"{slots_var}={environ[slots_var]!r} gives {len(counts)} counts for the "
                         f"{len(hosts)} nodes of {nodes_var}={environ[nodes_var]!r}")
    return [(h, c) for h, c in zip(hosts, counts) if c > 0]
